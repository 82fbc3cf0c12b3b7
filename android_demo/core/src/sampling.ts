/**
 * Logits processing and the speculative accept/reject rule (the TypeScript twin of edgespec/core/sampling.py).
 *
 * Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding", Algorithm 1) and Chen et
 * al. 2023 (Algorithm 2): `p` is the target's distribution, `q` the draft's. Draft token x at position i is
 * accepted with probability min(1, p_i(x) / q_i(x)); at the first rejection the replacement is drawn from
 * norm(max(0, p_i − q_i)); if all K are accepted a bonus token is drawn from p_{K+1}. The emitted tokens are
 * then distributed exactly as sampling from p alone. Greedy (temperature 0) is the same rule on one-hot p, q.
 */
import { EdgespecError } from "./errors.js";
import type { Rng } from "./rng.js";

/** Candidate pools for top-k/top-p: ids whose scaled logit is within this many nats of the maximum, widened
 * until the pool provably holds the answer (every id outside it has a smaller logit), then all ids. */
const POOL_NATS = [8, 16, 32];

export interface SamplingParams {
  temperature: number;
  topK: number;
  topP: number;
}

/** Checked sampling parameters with defaults (greedy). Throws EdgespecError on temperature < 0, topK < 0 or
 * not an integer, topP outside (0, 1]. */
export function samplingParams(p: Partial<SamplingParams> = {}): SamplingParams {
  const sp = { temperature: p.temperature ?? 0, topK: p.topK ?? 0, topP: p.topP ?? 1 };
  if (!(Number.isFinite(sp.temperature) && sp.temperature >= 0))
    throw new EdgespecError(`temperature must be a finite number ≥ 0, got ${sp.temperature}`);
  if (!(Number.isInteger(sp.topK) && sp.topK >= 0)) throw new EdgespecError(`topK must be an integer ≥ 0, got ${sp.topK}`);
  if (!(sp.topP > 0 && sp.topP <= 1)) throw new EdgespecError(`topP must be in (0, 1], got ${sp.topP}`);
  return sp;
}

export const isGreedy = (sp: SamplingParams): boolean => sp.temperature === 0;

/** Index of the largest value (first index on ties, as numpy.argmax). */
export function argmax(row: ArrayLike<number>): number {
  let best = 0;
  let v = row[0];
  for (let i = 1; i < row.length; i++) if (row[i] > v) { v = row[i]; best = i; }
  return best;
}

/** Top-1 minus top-2 value of a logits row (the near-tie measure of edgespec/bench/evaluate.py). */
export function topGap(row: ArrayLike<number>): number {
  let a = -Infinity, b = -Infinity;
  for (let i = 0; i < row.length; i++) {
    const x = row[i];
    if (x > a) { b = a; a = x; } else if (x > b) b = x;
  }
  return a - b;
}

/**
 * The processed distribution of one logits row: float64 (W,) from logits float32 (V,).
 *
 * Temperature, then top-k, then top-p (nucleus: the smallest set of most likely tokens whose mass reaches
 * topP), then renormalization. Greedy gives a one-hot at the argmax. `width` pads with zeros (ids the model
 * cannot produce) or truncates to a common vocabulary width.
 */
export function probs(row: Float32Array, sp: SamplingParams, width: number = row.length): Float64Array {
  const v = Math.min(width, row.length);
  const out = new Float64Array(width);
  const logits = row.length === v ? row : row.subarray(0, v);
  if (isGreedy(sp)) {
    out[argmax(logits)] = 1;
    return out;
  }
  const z = new Float64Array(v);
  let max = -Infinity;
  for (let i = 0; i < v; i++) { z[i] = logits[i] / sp.temperature; if (z[i] > max) max = z[i]; }
  let cand: number[] | null = null;
  if (sp.topK > 0 && sp.topK < v) cand = topK(z, sp.topK, max);
  if (sp.topP < 1) cand = nucleus(z, cand, sp.topP, max);
  if (cand === null) {
    let sum = 0;
    for (let i = 0; i < v; i++) { out[i] = Math.exp(z[i] - max); sum += out[i]; }
    for (let i = 0; i < v; i++) out[i] /= sum;
    return out;
  }
  let sum = 0;
  for (const i of cand) { out[i] = Math.exp(z[i] - max); sum += out[i]; }
  for (const i of cand) out[i] /= sum;
  return out;
}

/** Ids with z > max − nats (all ids for nats = ∞), largest first (ties: lower id first). */
function pool(z: Float64Array, max: number, nats: number): number[] {
  const ids: number[] = [];
  const floor = max - nats;
  for (let i = 0; i < z.length; i++) if (z[i] > floor) ids.push(i);
  return ids.sort((a, b) => z[b] - z[a] || a - b);
}

/** The k ids of largest z, largest first (ties: lower id first). */
function topK(z: Float64Array, k: number, max: number): number[] {
  for (const nats of [...POOL_NATS, Infinity]) {
    const ids = pool(z, max, nats);
    if (ids.length >= k) return ids.slice(0, k); // every id outside the pool is smaller than the pool's k-th
  }
  return pool(z, max, Infinity).slice(0, k);
}

/** The nucleus: the smallest prefix of the ids by decreasing z (within `cand` if given) whose mass reaches
 * topP of the total (of all ids, or of `cand`). */
function nucleus(z: Float64Array, cand: number[] | null, topP: number, max: number): number[] {
  let total = 0;
  if (cand) for (const i of cand) total += Math.exp(z[i] - max);
  else for (let i = 0; i < z.length; i++) total += Math.exp(z[i] - max);
  const prefix = (order: number[]): number[] | null => {
    let cum = 0;
    for (let n = 0; n < order.length; n++) {
      cum += Math.exp(z[order[n]] - max);
      if (cum >= topP * total) return order.slice(0, n + 1);
    }
    return null;
  };
  if (cand) return prefix(cand) ?? cand;
  for (const nats of POOL_NATS) {
    const found = prefix(pool(z, max, nats)); // a prefix reached inside the pool is the nucleus of all ids
    if (found) return found;
  }
  return prefix(pool(z, max, Infinity)) ?? pool(z, max, Infinity);
}

/** One id drawn from `dist` float (V,), non-negative, not necessarily normalized (inverse CDF). */
export function sample(dist: ArrayLike<number>, rng: Rng): number {
  let total = 0;
  let last = -1;
  for (let i = 0; i < dist.length; i++) if (dist[i] > 0) { total += dist[i]; last = i; }
  if (last < 0) throw new EdgespecError("cannot sample from a distribution with no mass");
  const u = rng.random() * total;
  let c = 0;
  for (let i = 0; i <= last; i++) {
    c += dist[i];
    if (u < c) return i;
  }
  return last; // rounding at the top end never lands on a zero-mass id
}

/**
 * Leviathan et al. 2023, Algorithm 1, after the draft and the parallel target run.
 *
 * `drafted` ids (K,) with drafted[i] ~ q[i]; `q` K rows float64 (V,); `p` K+1 rows float64 (V,), or a
 * function giving row i (only the rows up to the first rejection are computed).
 * Returns [n, token]: the first n draft tokens are accepted; `token` is the correction drawn from
 * norm(max(0, p_n − q_n)) when n < K, or the bonus token drawn from p_K when n = K.
 */
export function acceptReject(drafted: number[], q: Float64Array[], p: Float64Array[] | ((i: number) => Float64Array),
  rng: Rng): [number, number] {
  const k = drafted.length;
  const pRow = typeof p === "function" ? p : (i: number) => p[i];
  for (let i = 0; i < k; i++) {
    const x = drafted[i];
    const pi = pRow(i);
    const px = pi[x], qx = q[i][x];
    if (qx > 0 && rng.random() * qx < px) continue; // u < p/q without dividing
    const residual = new Float64Array(pi.length);
    let mass = 0;
    for (let j = 0; j < residual.length; j++) {
      const r = pi[j] - q[i][j];
      if (r > 0) { residual[j] = r; mass += r; }
    }
    return [i, sample(mass > 0 ? residual : pi, rng)]; // p ≤ q everywhere means p = q: guard rounding
  }
  return [k, sample(pRow(k), rng)];
}

/**
 * acceptReject at temperature 0 without one-hot distributions: draft token i is accepted iff it is the
 * target's argmax at i; the correction (or bonus) is the target's argmax at the first mismatch (or after
 * the last draft token). `targetRows`: K+1 logits rows float32 (V,). Returns [n, token].
 */
export function greedyAccept(drafted: number[], targetRows: Float32Array[]): [number, number] {
  let n = 0;
  while (n < drafted.length && argmax(targetRows[n]) === drafted[n]) n++;
  return [n, argmax(targetRows[n])];
}
