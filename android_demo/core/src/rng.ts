/**
 * The seeded PRNG of the core: xoshiro128** (Blackman & Vigna 2018, "Scrambled linear pseudorandom number
 * generators"), state seeded from the integer seed with SplitMix32. `random()` returns a float64 in [0, 1)
 * with 53 random bits built from two 32-bit outputs (as Mersenne Twister's genrand_res53).
 *
 * Same seed → same stream on every JavaScript engine (only 32-bit integer arithmetic via Math.imul and >>>).
 * It is not numpy's PCG64, so a seeded sample here is not the Python runtime's seeded sample; the two
 * agree in distribution (tests compare histograms, not draws).
 */
export class Rng {
  private s = new Uint32Array(4);

  /** `seed`: any finite number (its integer part, modulo 2^32, is used); undefined seeds from Math.random. */
  constructor(seed?: number) {
    let x = (seed === undefined ? Math.floor(Math.random() * 2 ** 32) : Math.trunc(seed)) >>> 0;
    for (let i = 0; i < 4; i++) {
      // SplitMix32 (a 32-bit variant of Steele et al. 2014's SplitMix64)
      x = (x + 0x9e3779b9) >>> 0;
      let z = x;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
      this.s[i] = (z ^ (z >>> 16)) >>> 0;
    }
    if (this.s[0] === 0 && this.s[1] === 0 && this.s[2] === 0 && this.s[3] === 0) this.s[0] = 1;
  }

  /** One 32-bit output of xoshiro128**. */
  nextUint32(): number {
    const s = this.s;
    const result = Math.imul(rotl(Math.imul(s[1], 5) >>> 0, 7), 9) >>> 0;
    const t = (s[1] << 9) >>> 0;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 11);
    return result;
  }

  /** A float64 uniform in [0, 1) with 53 random bits. */
  random(): number {
    const a = this.nextUint32() >>> 5; // 27 bits
    const b = this.nextUint32() >>> 6; // 26 bits
    return (a * 67108864 + b) / 9007199254740992;
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}
