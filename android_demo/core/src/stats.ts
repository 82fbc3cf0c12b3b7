/** Per-generation statistics: returned, never printed (the TypeScript twin of edgespec/core/stats.py, chain only). */

/**
 * Counters of one generation. Invariants: accepted ≤ evaluated ≤ proposed; rounds = kPerRound.length;
 * every speculative round ends with one correction or one bonus token and every plain step with one target
 * token, so newTokens ≤ 1 + accepted + corrections + bonus + plainSteps.
 */
export class GenerationStats {
  mode: "spec" | "plain" = "spec";
  /** The sampling rule: "greedy", "standard" (accept/reject with the Rng) or "gumbel" (the seeded coupling). */
  coupling: "greedy" | "standard" | "gumbel" = "greedy";
  promptTokens = 0;
  /** Prompt tokens whose KV entries were reused from the previous call (multi-turn KV reuse). */
  reusedTokens = 0;
  newTokens = 0;
  rounds = 0;
  proposed = 0;
  accepted = 0;
  corrections = 0;
  bonus = 0;
  plainSteps = 0;
  kPerRound: number[] = [];
  roundMs: number[] = [];
  prefillMs = 0;
  draftMs = 0;
  verifyMs = 0;
  wallMs = 0;
  stopReason: "" | "stop_token" | "max_new_tokens" | "context" | "aborted" = "";
  latencyBudgetMs: number | null = null;

  /** Draft tokens the accept/reject rule looked at: the accepted ones plus one per rejection. */
  get evaluated(): number {
    return this.accepted + this.corrections;
  }

  /** Acceptance rate alpha in [0, 1]: accepted / evaluated draft tokens (0 when nothing was evaluated). */
  get alpha(): number {
    return this.evaluated ? this.accepted / this.evaluated : 0;
  }

  /** Mean draft length K over the rounds (plain steps count as K = 0). */
  get meanK(): number {
    return this.kPerRound.length ? this.kPerRound.reduce((a, b) => a + b, 0) / this.kPerRound.length : 0;
  }

  /** New tokens per second of wall time, prefill included (tok/s). */
  get tokensPerS(): number {
    return this.wallMs > 0 ? this.newTokens / (this.wallMs / 1e3) : 0;
  }

  /** Tokens after the first per second after prefill (tok/s). */
  get decodeTokensPerS(): number {
    const t = (this.wallMs - this.prefillMs) / 1e3;
    return t > 0 && this.newTokens > 1 ? (this.newTokens - 1) / t : 0;
  }

  /** Tokens committed per target run after prefill. */
  get meanAcceptedLength(): number {
    return this.rounds ? (this.newTokens - 1) / this.rounds : 0;
  }

  /** A one-line summary for a UI: "42 tok · 11.8 tok/s · alpha 0.81 · K 3.2". */
  summary(): string {
    const parts = [`${this.newTokens} tok`, `${this.tokensPerS.toFixed(1)} tok/s`];
    if (this.mode === "spec") parts.push(`alpha ${this.evaluated ? this.alpha.toFixed(2) : "–"}`, `K ${this.meanK.toFixed(1)}`);
    return parts.join(" · ");
  }
}
