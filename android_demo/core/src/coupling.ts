/**
 * Drafter-invariant seeded sampling: the exponential race (Gumbel-max) coupling of the target and the draft
 * (the TypeScript twin of edgespec/core/coupling.py; same generator, same numbers).
 *
 * Daliri, Musco and Suresh 2024, "Coupling without Communication and Drafter-Invariant Speculative Decoding"
 * (arXiv 2408.07978), Gumbel sampling: the randomness of output position n is noise over the vocabulary drawn
 * from (seed, n) alone. The target's token at n is x_n = argmin_v E_n(v) / p_n(v) with E_n(v) = −ln U_n(v) ~
 * Exp(1) (= argmax_v log p_n(v) + G_n(v), G Gumbel), an exact sample from p_n. The draft proposes
 * argmin_v E_n(v) / q_n(v) with the same noise, and a proposal is accepted exactly when it equals the target's
 * choice, so the output is the same for plain decoding, any K and any cache state.
 *
 * The noise is a counter-based hash; with uint32 arithmetic (Math.imul, >>> 0):
 *   H(x)  = lowbias32: x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16
 *   b     = H(H(H(seed_lo ^ 0x243f6a88) ^ seed_hi) ^ n), b2 = H(b ^ 0x13198a2e)   (seed mod 2^64)
 *   h(v)  = H(v ^ 0x85a308d3);  w1, w2 = H(b ^ h(v)), H(b2 ^ h(v))
 *   U_n(v) = ((w1 >> 5) · 2^26 + (w2 >> 6) + 0.5) / 2^53;  E_n(v) = −ln U_n(v)
 * Ties in the race go to the lowest id. The 53-bit numerator of U is bit-exact across implementations; −ln is
 * the platform's (V8's Math.log vs numpy's log can differ in the last bit: the test vectors check U exactly
 * and E to one ulp, see android_demo/README.md).
 */
import { EdgespecError } from "./errors.js";
import { probs, type SamplingParams } from "./sampling.js";

const TWO26 = 67108864;
const INV_TWO53 = 1 / 9007199254740992;

/** lowbias32 (C. Wellons' hash prospector): a bijective hash of a uint32, returned as a uint32. */
export function hash32(x: number): number {
  x >>>= 0;
  x ^= x >>> 16;
  x = Math.imul(x, 0x7feb352d);
  x ^= x >>> 15;
  x = Math.imul(x, 0x846ca68b);
  x ^= x >>> 16;
  return x >>> 0;
}

/** A seed as [low, high] uint32 words of its value mod 2^64. Throws EdgespecError: not an integer ≥ 0
 * (a number must be a safe integer; a bigint may be any size). */
export function seedWords(seed: number | bigint): [number, number] {
  if (typeof seed === "bigint") {
    if (seed < 0n) throw new EdgespecError(`seed must be an integer ≥ 0, got ${seed}`);
    const s = seed & 0xffffffffffffffffn;
    return [Number(s & 0xffffffffn), Number(s >> 32n)];
  }
  if (!(Number.isSafeInteger(seed) && seed >= 0)) throw new EdgespecError(`seed must be an integer in [0, 2^53), got ${seed}`);
  return [seed % 4294967296, Math.floor(seed / 4294967296)];
}

/** The two uint32 words (b, b2) that key the noise of absolute position n (0 ≤ n < 2^32) for `seed`. */
export function positionKey(seed: number | bigint, n: number): [number, number] {
  const [lo, hi] = seedWords(seed);
  let b = hash32(lo ^ 0x243f6a88);
  b = hash32(b ^ hi);
  b = hash32(b ^ (n >>> 0));
  return [b, hash32(b ^ 0x13198a2e)];
}

/** The 53-bit integer numerator m of U_n(v) = (m + 0.5) / 2^53 from the position key and h(v) (exact). */
function numerator(b: number, b2: number, h: number): number {
  return (hash32(b ^ h) >>> 5) * TWO26 + (hash32(b2 ^ h) >>> 6);
}

/** The integer numerator m of U_n(v) = (m + 0.5) / 2^53, in [0, 2^53) (bit-exact; for the test vectors). */
export function uniformNumerator(seed: number | bigint, n: number, v: number): number {
  const [b, b2] = positionKey(seed, n);
  return numerator(b, b2, hash32(v ^ 0x85a308d3));
}

/** E_n(v) float64 = −ln U_n(v) for token id v at absolute position n. */
export function exponential(seed: number | bigint, n: number, v: number): number {
  const [b, b2] = positionKey(seed, n);
  return -Math.log((numerator(b, b2, hash32(v ^ 0x85a308d3)) + 0.5) * INV_TWO53);
}

/**
 * The noise of one seeded generation over a vocabulary of `width` ids, and the coupled choices.
 *
 * `choose(dist, n)` is the token at absolute position n for a distribution `dist` float64 (W,) (the target's p
 * or the draft's q, after temperature/top-k/top-p; need not be normalized). Noise vectors of the last `keep`
 * positions are kept, so the draft's proposal and the target's verify at one position compute it once.
 */
export class GumbelCoupling {
  readonly seed: number | bigint;
  private readonly h: Uint32Array;
  private readonly full = new Map<number, Float64Array>();

  constructor(seed: number | bigint, readonly width: number, private readonly keep = 32) {
    seedWords(seed); // validates
    this.seed = seed;
    this.h = new Uint32Array(width);
    for (let v = 0; v < width; v++) this.h[v] = hash32(v ^ 0x85a308d3);
  }

  /** E_n float64 (W,) over every id (cached for the last `keep` positions). */
  noise(n: number): Float64Array {
    let e = this.full.get(n);
    if (e) {
      this.full.delete(n); // most recently used last
      this.full.set(n, e);
      return e;
    }
    const [b, b2] = positionKey(this.seed, n);
    e = new Float64Array(this.width);
    for (let v = 0; v < this.width; v++) e[v] = -Math.log((numerator(b, b2, this.h[v]) + 0.5) * INV_TWO53);
    this.full.set(n, e);
    if (this.full.size > this.keep) this.full.delete(this.full.keys().next().value!);
    return e;
  }

  /** argmin_v E_n(v) / dist(v) over dist > 0 (lowest id on ties): an exact sample from norm(dist), keyed by
   * (seed, n). Throws EdgespecError when dist has no positive mass. */
  choose(dist: ArrayLike<number>, n: number): number {
    const w = Math.min(dist.length, this.width);
    let support = 0;
    for (let v = 0; v < w; v++) if (dist[v] > 0) support++;
    if (!support) throw new EdgespecError("cannot sample: the distribution has no positive mass");
    let best = -1, key = Infinity;
    if (support * 4 > this.width || this.full.has(n)) {
      const e = this.noise(n);
      for (let v = 0; v < w; v++) {
        if (!(dist[v] > 0)) continue;
        const k = e[v] / dist[v];
        if (k < key || best < 0) { key = k; best = v; }
      }
      return best;
    }
    const [b, b2] = positionKey(this.seed, n); // a small support (top-k/top-p): only its entries
    for (let v = 0; v < w; v++) {
      if (!(dist[v] > 0)) continue;
      const k = -Math.log((numerator(b, b2, this.h[v]) + 0.5) * INV_TWO53) / dist[v];
      if (k < key || best < 0) { key = k; best = v; }
    }
    return best;
  }
}

/**
 * The coupled accept rule of a chain (Daliri et al. 2024): proposal token i is kept iff it is the target's
 * choice at its row; `choose(i)` gives the target's token from verify row i (row 0 scores `last`), called only
 * for rows the walk reaches. Returns [n, token]: the first n proposal tokens are accepted, `token` is the
 * choice at row n (the correction, or the bonus after a full acceptance).
 */
export function followChoices(drafted: readonly number[], choose: (i: number) => number): [number, number] {
  for (let i = 0; i < drafted.length; i++) {
    const x = choose(i);
    if (x !== drafted[i]) return [i, x];
  }
  return [drafted.length, choose(drafted.length)];
}

/**
 * The coupled choice as an argmax, for divergence checks: score(row, n) = log p_n(v) − log E_n(v) float64 (W,)
 * (−∞ where p is 0) from a logits row float32 (≥ W,) at absolute position n; its argmax is
 * GumbelCoupling.choose(p, n) (up to rounding), and a gap between two tokens is in nats of the race
 * (edgespec.bench.evaluate.race_scores).
 */
export function raceScores(seed: number | bigint, width: number, sp: SamplingParams): (row: Float32Array, n: number) => Float64Array {
  const c = new GumbelCoupling(seed, width, 4);
  return (row, n) => {
    const p = probs(row, sp, width), e = c.noise(n), out = new Float64Array(width);
    for (let v = 0; v < width; v++) out[v] = p[v] > 0 ? Math.log(p[v]) - Math.log(e[v]) : -Infinity;
    return out;
  };
}
