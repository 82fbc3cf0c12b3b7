/**
 * Losslessness checks shared by the tests and an app's self-test (the TypeScript twin of edgespec/bench/evaluate.py).
 *
 * Greedy identity, judged by the verify path's own numbers: speculative greedy must equal plain greedy; where
 * they differ, the speculative run's verify calls are replayed on a clean target cache from the committed
 * tokens alone, every committed token must be the argmax of its replayed row, and at the first divergence the
 * two paths' rows must only swap their top two tokens (kernel noise of K+1-row vs one-row kernels). The same
 * rule checks seeded sampling (the Gumbel coupling) on the race scores. Across implementations (this core vs
 * the Python runtime) `compareRows` applies the rule to each side's plain row. NEAR_TIE_LOGIT_GAP is only a
 * reported figure. Sampling: the first token a speculative round emits, over many seeds, against the
 * target's processed distribution p at that position.
 */
import { GumbelCoupling, raceScores } from "./coupling.js";
import { PREFILL_CHUNK, type RoundRecord, type SpecDecoder } from "./decoder.js";
import { generate } from "./generation.js";
import type { KPolicy } from "./kpolicy.js";
import type { KVCache } from "./kvcache.js";
import type { Logits } from "./model.js";
import { Rng } from "./rng.js";
import { argmax, probs, samplingParams, topGap, type SamplingParams } from "./sampling.js";
import { GenerationStats } from "./stats.js";

/** Logits: a divergence whose plain gap is below this is flagged `nearTie` (a figure, not the verdict). */
export const NEAR_TIE_LOGIT_GAP = 0.1;

/** What a token is the argmax of at absolute position n: the logits row itself (greedy) or race scores. */
export type Score = (row: Float32Array, n: number) => ArrayLike<number>;
/** [[top-1 id, value], [top-2 id, value]] of a row (ties: the lower id first, as argmax). */
export type Top2 = [[number, number], [number, number]];

export function top2(row: ArrayLike<number>): Top2 {
  let a = -1, b = -1;
  for (let i = 0; i < row.length; i++) {
    if (a < 0 || row[i] > row[a]) { b = a; a = i; } else if (b < 0 || row[i] > row[b]) b = i;
  }
  return [[a, row[a]], [b, row[b]]];
}

/** Feed the prompt as SpecDecoder.prefill does (chunks of PREFILL_CHUNK, the head on the last row). */
async function feedPrompt(dec: SpecDecoder, ids: readonly number[], cache: KVCache): Promise<Float32Array> {
  let logits: Logits | null = null;
  for (let i = 0; i < ids.length; i += PREFILL_CHUNK) logits = await dec.target.forward(ids.slice(i, i + PREFILL_CHUNK), cache, 1);
  return logits!.last().slice(0, dec.width);
}

/** Plain greedy ids (stop token included, up to n), the top-1 minus top-2 logit and the top two [id, logit] at each step. */
export async function plainGreedyWithGaps(dec: SpecDecoder, ids: number[], n: number): Promise<{ ids: number[]; gaps: number[];
  tops: Top2[] }> {
  const cache = dec.target.newCache();
  let row = await feedPrompt(dec, ids, cache);
  const out: number[] = [], gaps: number[] = [], tops: Top2[] = [];
  for (let i = 0; i < n; i++) {
    gaps.push(topGap(row));
    tops.push(top2(row));
    out.push(argmax(row));
    if (dec.stopIds.has(out[i]) || cache.length + 1 >= dec.contextLength) break;
    row = (await dec.target.forward([out[i]], cache)).last().subarray(0, dec.width);
  }
  return { ids: out, gaps, tops };
}

/** The target's logits float32 (W,) after inputIds + newIds, computed as plain decoding computes them (the
 * prompt in prefill chunks, then one-token steps), so a divergence is measured on the plain path's numbers. */
export async function plainRow(dec: SpecDecoder, inputIds: readonly number[], newIds: readonly number[]): Promise<Float32Array> {
  const cache = dec.target.newCache();
  let row = await feedPrompt(dec, inputIds, cache);
  for (const t of newIds) row = (await dec.target.forward([t], cache)).last().slice(0, dec.width);
  return row;
}

/**
 * Replay a generation's verify calls on a clean target cache and check its tokens against them.
 *
 * `rounds` are Generation.rounds (the prefill's record first): the prompt is fed as a fresh prefill feeds it,
 * whose argmax must be the first token; each round's verify call is rebuilt from the committed tokens alone
 * (ids [last, ...proposal] at L = the committed length − 1, which must be the round's `start`), every
 * committed token must be the argmax of its row's score, the walk follows the committed tokens through the
 * proposal, and the cache is cropped to the committed prefix. Token indices ≥ `upto` are not checked.
 * Returns `mismatch` (null, or [index, committed token, the replay's argmax]) and `row`: the score of the
 * replayed row that chose token `keepRow` (float (W,)), if asked.
 */
export async function replayVerify(dec: SpecDecoder, inputIds: readonly number[], rounds: readonly RoundRecord[],
  keepRow: number | null = null, upto: number = Infinity, score: Score = (r) => r) {
  const cache = dec.target.newCache(), P = inputIds.length;
  const out: { mismatch: [number, number, number] | null; row: Float64Array | null } = { mismatch: null, row: null };
  const check = (index: number, v: ArrayLike<number>, t: number) => {
    if (keepRow === index) out.row = Float64Array.from(v);
    const best = argmax(v);
    if (out.mismatch === null && index < upto && best !== t) out.mismatch = [index, t, best];
  };
  const first = rounds[0].tokens[0];
  check(0, score(await feedPrompt(dec, inputIds, cache), P), first);
  const tokens = [...inputIds, first];
  let index = 1;
  for (const r of rounds.slice(1)) {
    const L = tokens.length - 1;
    if (r.start !== L) { out.mismatch ??= [index, -1, -1]; break; }
    const logits = await dec.target.forward([tokens[L], ...r.proposal], cache);
    for (let j = 0; j < r.tokens.length; j++) {
      check(index, score(logits.row(j).subarray(0, dec.width), P + index), r.tokens[j]);
      index += 1;
      if (j < r.tokens.length - 1 && r.proposal[j] !== r.tokens[j]) { // a committed token off the proposal
        out.mismatch ??= [index - 1, r.tokens[j], -1];
        return out;
      }
    }
    cache.crop(L + r.tokens.length); // last, then the accepted proposal tokens
    tokens.push(...r.tokens);
  }
  return out;
}

export interface Seeded {
  temperature: number;
  topP?: number;
  topK?: number;
  seed: number;
}

/**
 * Plain vs speculative decoding on one prompt (greedy, or seeded sampling under the Gumbel coupling when
 * `seeded` is given: then every row is a row of race scores, raceScores), judged by the verify path's numbers
 * (edgespec.bench.evaluate.greedy_check). Fresh caches each; the speculative run's rounds are replayed
 * (replayVerify): `consistent` when every committed token is the argmax of its replayed verify row (a wrong
 * position, a stale cache row or a bad rollback breaks it). At the first divergence i the plain row and the
 * replayed verify row give the plain gap g = l_p(a) − l_p(b) (a plain's token, b the speculative one) and
 * δ = g − (l_v(a) − l_v(b)); the divergence is legitimate when consistent, argmax l_v = b, argmax l_p = a and
 * g ≤ δ. `ok` = identical or legitimate; `nearTie` (g < NEAR_TIE_LOGIT_GAP) is a figure; `problem` a one-line
 * reason when not ok. `k`: a fixed K or a KPolicy.
 */
export async function greedyCheck(dec: SpecDecoder, inputIds: number[], maxNewTokens: number, k: number | KPolicy = 4,
  seeded: Seeded | null = null) {
  const o = { inputIds, maxNewTokens, ...(seeded ?? {}) };
  const sp: SamplingParams | null = seeded && samplingParams(seeded);
  const score: Score = seeded ? raceScores(seeded.seed, dec.width, sp!) : (r) => r;
  dec.reset();
  const plain = await generate(dec, { ...o, mode: "plain" }).run();
  dec.reset();
  const spec = await generate(dec, { ...o, k }).run();
  dec.reset();
  const a = plain.tokenIds, b = spec.tokenIds;
  const out = { identical: sameIds(a, b), ok: true, consistent: true, firstDivergence: null as number | null,
    plainGap: null as number | null, delta: null as number | null, plainTop2: null as Top2 | null,
    verifyTop2: null as Top2 | null, nearTie: false, problem: null as string | null, plainTokens: a, specTokens: b,
    stats: spec.stats };
  const pFull = plain.rounds.flatMap((r) => r.tokens), sFull = spec.rounds.flatMap((r) => r.tokens);
  const n = Math.min(pFull.length, sFull.length);
  let div: number | null = null;
  if (!out.identical) { div = 0; while (div < n && pFull[div] === sFull[div]) div++; }
  const replay = await replayVerify(dec, inputIds, spec.rounds, div, div === null ? b.length : div + 1, score);
  if (replay.mismatch !== null) {
    const [i, got, want] = replay.mismatch;
    out.ok = out.consistent = false;
    out.problem = `token ${i}: the speculative run committed ${got}, but its own verify call replayed on a clean cache ` +
      `gives argmax ${want} (a decoder bug: position, cache row or rollback)`;
  }
  if (div === null) return out;
  out.firstDivergence = div;
  if (div >= pFull.length || div >= sFull.length) {
    out.ok = false;
    out.problem ??= `token ${div}: one run ended where the other went on`;
    return out;
  }
  const lp = score(await plainRow(dec, inputIds, pFull.slice(0, div)), inputIds.length + div), lv = replay.row!;
  const x = pFull[div], y = sFull[div];
  const g = lp[x] - lp[y];
  Object.assign(out, { plainGap: g, delta: g - (lv[x] - lv[y]), plainTop2: top2(lp), verifyTop2: top2(lv),
    nearTie: g < NEAR_TIE_LOGIT_GAP });
  if (out.consistent && !(argmax(lv) === y && argmax(lp) === x && g <= out.delta!)) {
    out.ok = false;
    out.problem = `token ${div}: plain ${x} (top-2 ${JSON.stringify(out.plainTop2)}) vs speculative ${y} ` +
      `(verify top-2 ${JSON.stringify(out.verifyTop2)}): not a flip of the two paths' argmax`;
  }
  return out;
}

/**
 * The divergence rule across implementations or machines (edgespec.bench.evaluate.compare_rows), where neither side
 * can recompute the other's kernels: the reference side's plain-path row at the first divergence, known by
 * its top two (refTop2, as make_vectors.py writes it), and this side's row there (float (W,)), both on the
 * common prefix. Legitimate when each row's argmax is its own side's token, both rank the same two tokens
 * first, and the reference gap g = l_ref(a) − l_ref(b) is within δ = g − (l_other(a) − l_other(b)).
 */
export function compareRows(refToken: number, refTop2: Top2, otherToken: number, otherRow: ArrayLike<number>) {
  const a = refToken, b = otherToken, ot = top2(otherRow);
  const same = new Set([refTop2[0][0], refTop2[1][0], ot[0][0], ot[1][0]]).size === 2;
  const refB = refTop2[1][0] === b ? refTop2[1][1] : NaN; // l_ref(b) is known when b is the reference's top-2
  const gap = refTop2[0][1] - refB, delta = gap - (otherRow[a] - otherRow[b]);
  let problem: string | null = null;
  const rows = `reference ${JSON.stringify(refTop2)}, other ${JSON.stringify(ot)}; tokens ${a}, ${b}`;
  if (refTop2[0][0] !== a || ot[0][0] !== b) problem = `a row's argmax is not its own side's token (${rows})`;
  else if (!same) problem = `the two rows rank other tokens on top (${rows})`;
  else if (!(gap <= delta)) problem = `the reference gap ${gap.toFixed(4)} is beyond the measured δ ${delta.toFixed(4)}`;
  return { ok: problem === null, gap, delta, refTop2, otherTop2: ot, problem };
}

/**
 * Token ids of one prompt from the reference (e.g. the Python runtime: `refIds` with the top two of its row at
 * every step, `refTop2`) and from this core (`ids`), under compareRows. At the first divergence this core's
 * plain row on the common prefix is computed (plainRow; `score` maps it, e.g. to race scores). A run that
 * stops early diverges where the shorter list ends (not ok).
 */
export async function compareWithReference(dec: SpecDecoder, inputIds: readonly number[], refIds: readonly number[],
  refTop2: readonly Top2[], ids: readonly number[], score: Score = (r) => r) {
  let div = 0;
  while (div < Math.min(refIds.length, ids.length) && refIds[div] === ids[div]) div++;
  if (div === refIds.length && div === ids.length) return { identical: true, firstDivergence: null, ok: true, problem: null };
  if (div >= refIds.length || div >= ids.length)
    return { identical: false, firstDivergence: div, ok: false, problem: "one run ended where the other went on" };
  const row = score(await plainRow(dec, inputIds, ids.slice(0, div)), inputIds.length + div);
  return { identical: false, firstDivergence: div, ...compareRows(refIds[div], refTop2[div], ids[div], row) };
}

function sameIds(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((t, i) => t === b[i]);
}

/**
 * The distribution of the first token a speculative round (a chain of K) emits after `inputIds`, over
 * `draws` seeds, against the target's processed p there: the standard rule (one Rng per seed) or, `coupled`,
 * the Gumbel coupling (one seed per draw). Returns tv and tvNoise (the mean TV of `draws` direct samples
 * from p, 20 repeats) and the proposal counts (to check full acceptance when draft = target).
 */
export async function firstTokenCheck(dec: SpecDecoder, inputIds: number[], sp: SamplingParams, draws: number, k = 4,
  seed = 0, coupled = false) {
  dec.reset();
  const p = probs((await dec.target.forward(inputIds, dec.target.newCache(), 1)).last(), sp, dec.width);
  const counts = new Float64Array(p.length);
  await dec.prefillState(inputIds);
  const base = dec.tcache.length;
  const stats = new GenerationStats();
  for (let s = 0; s < draws; s++) {
    dec.tokens = [...inputIds]; // back to the state after the prompt (the caches are cropped below)
    const rng = new Rng(seed + s);
    const coupling = coupled ? new GumbelCoupling(seed + s, dec.width, 2) : null;
    const [drafted, q] = await dec.proposeDraft(k, sp, rng, coupling);
    const [out] = await dec.specRound(drafted, q, sp, rng, stats, coupling);
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
