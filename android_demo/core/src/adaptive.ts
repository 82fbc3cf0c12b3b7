/**
 * Adaptive K: the Python runtime's measured cost model and acceptance tracking (edgespec/control/adaptive.py),
 * for draft chains. Documented subset: no prompt lookup, no trees, and a catch-up that does not fit the
 * latency budget waits (plain steps) instead of running in pieces.
 *
 * Expected tokens committed by a round of draft length K at per-token acceptance rate alpha (Leviathan et al.
 * 2023, eq. 1): E = (1 − alpha^(K+1)) / (1 − alpha). The round costs K·t_d + t_v(K+1) ms (draft step t_d,
 * target verify of N rows t_v(N)), times a learned overhead factor (EWMA of measured / modelled). The
 * controller picks the K ≤ kMax with the most tokens per ms, K = 0 (a plain step, measured EWMA) unless
 * speculation beats it by a hysteresis margin, and probes every `probeEvery` plain steps. A latency budget B
 * removes every K whose pessimistic round time (the model times the p90 of recent measured/modelled ratios)
 * exceeds B. The draft's one-time catch-up on unseen tokens (prompt, plain-step tokens) is spread over the
 * tokens the answer is still expected to run (mean excess of earlier longer answers, else its length so far), and
 * a draft round that first pays a catch-up longer than a plain step must beat plain decoding by that catch-up's
 * share of the remaining plain time (times `catchupWeight`), between the hysteresis and `catchupMargin`.
 * Before any draft round, alpha is the target's mean top-1 probability at plain steps (prior alpha0 as 4 steps).
 */
import { EdgespecError } from "./errors.js";
import type { KPolicy } from "./kpolicy.js";
import type { OnnxLM } from "./model.js";

/** Measured costs in ms: verifyMs[N−1] = target run of N rows; draftMs = one draft step; draftPrefillMs =
 * draft time per token of a many-token feed (its catch-up). JSON-serializable: cache it per device. */
export interface CostModel {
  verifyMs: number[];
  draftMs: number;
  draftPrefillMs: number;
}

/** Predicted target time for N rows (ms; linear extrapolation past the measured range). */
export function tVerify(c: CostModel, n: number): number {
  const v = c.verifyMs;
  if (n <= v.length) return v[n - 1];
  const slope = (v[v.length - 1] - v[0]) / Math.max(v.length - 1, 1);
  return v[v.length - 1] + slope * (n - v.length);
}

/** E[committed tokens] for draft length K at acceptance rate alpha (Leviathan et al. 2023, eq. 1). */
export function expectedTokens(k: number, alpha: number): number {
  return alpha >= 1 ? k + 1 : (1 - alpha ** (k + 1)) / (1 - alpha);
}

export interface AdaptiveOptions {
  kMax?: number;
  latencyBudgetMs?: number | null;
  alpha0?: number;
  decay?: number;
  hysteresis?: number;
  probeEvery?: number;
  probeK?: number;
  catchupMargin?: number;
  /** Weight of the catch-up's share of the remaining plain time in the margin of a draft start (≥ 0;
   * Infinity: always `catchupMargin`, the rule before 2026-12-02). Default 1. */
  catchupWeight?: number;
}

function p90(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const r = 0.9 * (s.length - 1), lo = Math.floor(r), hi = Math.ceil(r);
  return s[lo] + (s[hi] - s[lo]) * (r - lo);
}

export class AdaptiveK implements KPolicy {
  readonly kMax: number;
  readonly latencyBudgetMs: number | null;
  private readonly cost: CostModel;
  private readonly alpha0: number;
  private readonly decay: number;
  private readonly hysteresis: number;
  private readonly probeEvery: number;
  private readonly probeK: number;
  private readonly catchupMargin: number;
  private readonly catchupWeight: number;
  private counts: [number, number]; // pseudo-counts of accepted / rejected draft tokens
  private overhead = 1; // measured / modelled round time of draft rounds
  private plainMs: number;
  private catchupMs: number; // per unseen token
  private plainRun = 0;
  private draftRounds = 0;
  private confSum = 0;
  private confN = 0;
  private lengths: number[] = [];
  private generated = 0;
  private ratios: { draft: number[]; plain: number[] } = { draft: [], plain: [] };

  /** Throws EdgespecError on an empty cost model, kMax < 1, a latency budget ≤ 0 or a catchupWeight < 0. */
  constructor(cost: CostModel, o: AdaptiveOptions = {}) {
    if (!cost.verifyMs.length || !(cost.draftMs > 0)) throw new EdgespecError("the cost model needs verify and draft times");
    this.cost = { ...cost, verifyMs: [...cost.verifyMs] };
    this.kMax = o.kMax ?? 6;
    this.latencyBudgetMs = o.latencyBudgetMs ?? null;
    if (!(Number.isInteger(this.kMax) && this.kMax >= 1)) throw new EdgespecError(`kMax must be an integer ≥ 1, got ${this.kMax}`);
    if (this.latencyBudgetMs !== null && !(this.latencyBudgetMs > 0))
      throw new EdgespecError(`the latency budget must be > 0 ms, got ${this.latencyBudgetMs}`);
    this.alpha0 = o.alpha0 ?? 0.7;
    this.decay = o.decay ?? 0.8;
    this.hysteresis = o.hysteresis ?? 0.03;
    this.probeEvery = o.probeEvery ?? 8;
    this.probeK = o.probeK ?? 2;
    this.catchupMargin = o.catchupMargin ?? 0.1;
    this.catchupWeight = o.catchupWeight ?? 1;
    if (!(typeof this.catchupWeight === "number" && this.catchupWeight >= 0))
      throw new EdgespecError(`catchupWeight must be a number ≥ 0, got ${this.catchupWeight}`);
    this.counts = [this.alpha0 * 2, (1 - this.alpha0) * 2];
    this.plainMs = tVerify(cost, 1);
    this.catchupMs = cost.draftPrefillMs;
  }

  begin(): void {
    this.generated = this.plainRun = this.confSum = this.confN = 0;
  }

  end(newTokens: number): void {
    this.lengths = [...this.lengths, newTokens].slice(-32);
  }

  observeConfidence(top1: number): void {
    this.confSum += top1;
    this.confN += 1;
  }

  /** Current acceptance estimate in [0, 1]. */
  alpha(): number {
    if (!this.draftRounds) return (4 * this.alpha0 + this.confSum) / (4 + this.confN);
    return this.counts[0] / (this.counts[0] + this.counts[1]);
  }

  /** Expected new tokens still to come in this answer, in [1, horizon]. */
  expectedRemaining(horizon: number): number {
    const n = this.generated;
    const longer = this.lengths.filter((l) => l > n).map((l) => l - n);
    const r = longer.length ? longer.reduce((a, b) => a + b, 0) / longer.length : Math.max(n, 1);
    return Math.max(1, Math.min(r, horizon));
  }

  /** Predicted wall time of a round (ms); K = 0 is a plain step. */
  predictedMs(k: number): number {
    return k === 0 ? this.plainMs : this.modelMs(k) * this.overhead;
  }

  private modelMs(k: number): number {
    return k * this.cost.draftMs + tVerify(this.cost, k + 1);
  }

  private fits(k: number, extraMs = 0): boolean {
    if (this.latencyBudgetMs === null) return true;
    const r = k === 0 ? this.ratios.plain : this.ratios.draft;
    const hi = r.length ? Math.max(p90(r), k === 0 ? 1 : this.overhead) : 1.15;
    return (k === 0 ? this.plainMs : this.modelMs(k)) * hi + extraMs <= this.latencyBudgetMs;
  }

  private best(catchupMs: number, remaining: number, withCatchup: boolean): [number, number] {
    let best: [number, number] = [0, -1];
    for (let k = 1; k <= this.kMax; k++) {
      if (!this.fits(k, withCatchup ? catchupMs : 0)) continue;
      const tokens = expectedTokens(k, this.alpha());
      const rate = tokens / (this.predictedMs(k) + (catchupMs * tokens) / remaining);
      if (rate > best[1]) best = [k, rate];
    }
    return best;
  }

  /** The margin of a draft start behind a catch-up of `catchupMs`: its share of the plain time of the `remaining`
   * expected tokens, times catchupWeight, between the hysteresis and catchupMargin (Python: AdaptiveK._margin). */
  private catchupMarginFor(catchupMs: number, remaining: number): number {
    const share = catchupMs / (Math.max(remaining, 1) * this.plainMs);
    const weighted = this.catchupWeight === Infinity ? Infinity : this.catchupWeight * share;
    return Math.max(this.hysteresis, Math.min(this.catchupMargin, weighted));
  }

  choose(lag: number, horizon: number): number {
    const remaining = this.expectedRemaining(horizon);
    const catchup = Math.max(lag - 1, 0) * this.catchupMs;
    const [k, rate] = this.best(catchup, remaining, false);
    const margin = catchup > this.plainMs ? this.catchupMarginFor(catchup, remaining) : this.hysteresis;
    if (k > 0 && rate >= (1 + margin) / this.plainMs) {
      this.plainRun = 0;
      if (catchup > 0 && !this.fits(k, catchup)) {
        const [k2, rate2] = this.best(catchup, remaining, true);
        return k2 > 0 && rate2 >= (1 + margin) / this.plainMs ? k2 : 0; // a smaller K leaves room for the catch-up
      }
      return k;
    }
    this.plainRun += 1;
    if (this.plainRun >= this.probeEvery && catchup <= 0.05 * this.plainMs * remaining) {
      this.plainRun = 0; // re-probe, so that the acceptance estimate can recover
      const kp = Math.min(this.probeK, this.kMax);
      if (this.fits(kp, catchup)) return kp;
    }
    return 0;
  }

  observe(k: number, accepted: number, draftStepMs: number | null, roundMs: number, catchupMs: number,
    catchupTokens: number): void {
    this.generated += accepted + 1;
    if (catchupTokens > 0) catchupMs = Math.max(catchupMs - (draftStepMs ?? this.cost.draftMs), 0);
    if (catchupTokens >= 8) this.catchupMs = 0.7 * this.catchupMs + 0.3 * (catchupMs / catchupTokens);
    if (k === 0) {
      this.pushRatio("plain", roundMs / this.plainMs);
      this.plainMs = 0.8 * this.plainMs + 0.2 * roundMs;
      return;
    }
    const ratio = (roundMs - catchupMs) / this.modelMs(k);
    this.pushRatio("draft", ratio);
    this.overhead = 0.7 * this.overhead + 0.3 * ratio;
    if (draftStepMs !== null) this.cost.draftMs = 0.8 * this.cost.draftMs + 0.2 * draftStepMs;
    this.draftRounds += 1;
    this.counts = [this.decay * this.counts[0] + accepted, this.decay * this.counts[1] + (accepted < k ? 1 : 0)];
  }

  private pushRatio(key: "draft" | "plain", r: number): void {
    this.ratios[key] = [...this.ratios[key], r].slice(-16);
  }
}

const now = (): number => globalThis.performance?.now() ?? Date.now();

/**
 * Measure the cost model on this device: t_v(N) for N = 1..kMax+1 and one draft step after a `context`-token
 * past (median of `reps`, ms), and the draft's per-token prefill time. Each timed run is rolled back with
 * crop. Takes a few seconds on a phone; cache the result (it is plain JSON) per device, export and provider.
 */
export async function calibrate(target: OnnxLM, draft: OnnxLM, kMax = 6, context = 128, reps = 5): Promise<CostModel> {
  const width = Math.min(target.spec.vocab_size, 1000);
  const ids = Array.from({ length: context + kMax + 1 }, (_, i) => (i * 7919 + 13) % width);
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const timed = async (m: OnnxLM, ns: number[]): Promise<{ perToken: number; ms: Map<number, number> }> => {
    await m.forward(ids.slice(0, 8), m.newCache()); // warm-up: a session's first run is slower
    const cache = m.newCache();
    let t0 = now();
    await m.forward(ids.slice(0, context), cache, 1);
    const perToken = (now() - t0) / context;
    await m.forward(ids.slice(context, context + 1), cache);
    const ms = new Map<number, number>();
    for (const n of ns) {
      const ts: number[] = [];
      for (let r = 0; r < reps; r++) {
        cache.crop(context);
        t0 = now();
        await m.forward(ids.slice(context, context + n), cache);
        ts.push(now() - t0);
      }
      ms.set(n, median(ts));
    }
    return { perToken, ms };
  };
  const ns = Array.from({ length: kMax + 1 }, (_, i) => i + 1);
  const tv = await timed(target, ns);
  const td = await timed(draft, [1]);
  return { verifyMs: ns.map((n) => tv.ms.get(n)!), draftMs: td.ms.get(1)!, draftPrefillMs: td.perToken };
}
