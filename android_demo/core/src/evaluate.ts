/**
 * Losslessness checks shared by the tests and an app's self-test (the TypeScript twin of edgespec/evaluate.py).
 *
 * Greedy identity: speculative greedy must equal plain greedy; verifying K+1 rows uses other kernels than a
 * one-row step, so a near-tie in the target's logits may flip: at the first divergence the plain run's
 * top-1/top-2 logit gap must be below NEAR_TIE_LOGIT_GAP. Sampling: the first token a speculative round
 * emits, over many seeds, against the target's processed distribution p at that position.
 */
import type { SpecDecoder } from "./decoder.js";
import { generate } from "./generation.js";
import { Rng } from "./rng.js";
import { probs, topGap, type SamplingParams } from "./sampling.js";
import { GenerationStats } from "./stats.js";

/** Logits; int4 MatMulNBits N=1 vs N>1 paths differ by ~1e-2 on the real pair (as edgespec/evaluate.py). */
export const NEAR_TIE_LOGIT_GAP = 0.1;

/** Plain greedy ids (stop token included, up to n) and the top-1 minus top-2 logit at each step. */
export async function plainGreedyWithGaps(dec: SpecDecoder, ids: number[], n: number): Promise<{ ids: number[]; gaps: number[] }> {
  const cache = dec.target.newCache();
  let row = (await dec.target.forward(ids, cache, 1)).last();
  const out: number[] = [], gaps: number[] = [];
  for (let i = 0; i < n; i++) {
    const r = row.subarray(0, dec.width);
    gaps.push(topGap(r));
    let best = 0;
    for (let j = 1; j < r.length; j++) if (r[j] > r[best]) best = j;
    out.push(best);
    if (dec.stopIds.has(best) || cache.length + 1 >= dec.contextLength) break;
    row = (await dec.target.forward([best], cache)).last();
  }
  return { ids: out, gaps };
}

/** Speculative greedy (fixed K) against plain greedy on one prompt, fresh caches each. */
export async function greedyCheck(dec: SpecDecoder, inputIds: number[], maxNewTokens: number, k = 4) {
  dec.reset();
  const plain = await plainGreedyWithGaps(dec, inputIds, maxNewTokens);
  dec.reset();
  const spec = await generate(dec, { inputIds, maxNewTokens, k }).run();
  dec.reset();
  const a = plain.ids.filter((t, i) => !(dec.stopIds.has(t) && i === plain.ids.length - 1)), b = spec.tokenIds;
  let div: number | null = null;
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) { div = i; break; }
  if (div === null && a.length !== b.length) div = Math.min(a.length, b.length);
  const gap = div !== null && div < plain.gaps.length ? plain.gaps[div] : null;
  return { identical: div === null, firstDivergence: div, plainGap: gap, nearTie: gap !== null && gap < NEAR_TIE_LOGIT_GAP,
    plainTokens: a, specTokens: b, stats: spec.stats };
}

/**
 * The distribution of the first token a speculative round (a chain of K) emits after `inputIds`, over
 * `draws` seeds, against the target's processed p there. Returns tv and tvNoise (the mean TV of `draws`
 * direct samples from p, 20 repeats) and the proposal counts (to check full acceptance when draft = target).
 */
export async function firstTokenCheck(dec: SpecDecoder, inputIds: number[], sp: SamplingParams, draws: number, k = 4, seed = 0) {
  dec.reset();
  const p = probs((await dec.target.forward(inputIds, dec.target.newCache(), 1)).last(), sp, dec.width);
  const counts = new Float64Array(p.length);
  await dec.prefillState(inputIds);
  const base = dec.tcache.length;
  const stats = new GenerationStats();
  for (let s = 0; s < draws; s++) {
    dec.tokens = [...inputIds]; // back to the state after the prompt (the caches are cropped below)
    const rng = new Rng(seed + s);
    const [drafted, q] = await dec.proposeDraft(k, sp, rng);
    const [out] = await dec.specRound(drafted, q, sp, rng, stats);
    counts[out[0]] += 1;
    dec.tcache.crop(base);
    dec.dcache!.crop(base);
  }
  dec.reset();
  const rng = new Rng(seed + 1_000_003);
  let noise = 0;
  for (let r = 0; r < 20; r++) {
    const c = new Float64Array(p.length);
    for (let i = 0; i < draws; i++) {
      const u = rng.random();
      let acc = 0, j = 0;
      for (; j < p.length - 1; j++) { acc += p[j]; if (u < acc) break; }
      c[j] += 1;
    }
    noise += tv(c, p, draws) / 20;
  }
  return { draws, tv: tv(counts, p, draws), tvNoise: noise, proposed: stats.proposed, accepted: stats.accepted };
}

function tv(counts: Float64Array, p: Float64Array, n: number): number {
  let s = 0;
  for (let i = 0; i < p.length; i++) s += Math.abs(counts[i] / n - p[i]);
  return s / 2;
}
