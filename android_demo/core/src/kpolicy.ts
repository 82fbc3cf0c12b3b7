/**
 * How long each round's draft is: K = 0 is a plain target step. FixedK always proposes K; AdaptiveK
 * (adaptive.ts) chooses per round from a measured cost model and the acceptance it observes.
 */
import { EdgespecError } from "./errors.js";

/** Chooses K before a round and learns from its outcome (the chain subset of edgespec/control/kpolicy.py). */
export interface KPolicy {
  /** The latency budget this policy keeps rounds under (ms), if any. */
  readonly latencyBudgetMs?: number | null;
  /** K for the next round. `lag`: tokens the draft must read before it can draft (its catch-up);
   * `horizon`: new tokens still allowed. */
  choose(lag: number, horizon: number): number;
  /** A round with draft length `k` accepted `accepted` tokens. Times in ms: the median one-token draft step
   * (null without one), the whole round, and the draft's catch-up feed of `catchupTokens` unseen tokens
   * (that feed also drafted the first token). */
  observe(k: number, accepted: number, draftStepMs: number | null, roundMs: number, catchupMs: number,
    catchupTokens: number): void;
  /** Optional: a new answer starts (after the prefill). */
  begin?(): void;
  /** Optional: the answer ended with `newTokens` tokens. */
  end?(newTokens: number): void;
  /** Optional: the target's top-1 probability (temperature 1) at a plain step. */
  observeConfidence?(top1: number): void;
}

/** Always K. */
export class FixedK implements KPolicy {
  constructor(readonly k: number) {
    if (!(Number.isInteger(k) && k >= 0)) throw new EdgespecError(`K must be an integer ≥ 0, got ${k}`);
  }

  choose(): number {
    return this.k;
  }

  observe(): void {}
}
