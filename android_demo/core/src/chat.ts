/**
 * A multi-turn chat on a decoder, with the settings an app exposes (the logic behind the demo app's one
 * screen, kept here so that it is tested). Each turn re-renders the whole conversation; the decoder reuses
 * the KV entries of the common prefix, so a turn costs only its new tokens.
 */
import { AdaptiveK, type CostModel } from "./adaptive.js";
import type { SpecDecoder } from "./decoder.js";
import { EdgespecError } from "./errors.js";
import { generate, type Generation } from "./generation.js";
import type { KPolicy } from "./kpolicy.js";
import type { ChatMessage } from "./text.js";

/** What the settings sheet edits. */
export interface ChatSettings {
  /** "auto": adaptive K (needs a cost model); a number: fixed K (0 = plain decoding with the target alone). */
  k: "auto" | number;
  /** Latency budget per round for adaptive K (ms), or null for none. */
  latencyBudgetMs: number | null;
  temperature: number;
  topP: number;
  maxNewTokens: number;
  seed?: number;
}

export const DEFAULT_SETTINGS: ChatSettings = { k: "auto", latencyBudgetMs: null, temperature: 0, topP: 1, maxNewTokens: 256 };

/** Checked settings (throws EdgespecError naming the bad field). */
export function checkSettings(s: ChatSettings): ChatSettings {
  if (s.k !== "auto" && !(Number.isInteger(s.k) && s.k >= 0 && s.k <= 16)) throw new EdgespecError(`K must be "auto" or an integer in 0..16, got ${s.k}`);
  if (s.latencyBudgetMs !== null && !(s.latencyBudgetMs > 0)) throw new EdgespecError(`the latency budget must be > 0 ms, got ${s.latencyBudgetMs}`);
  if (!(Number.isInteger(s.maxNewTokens) && s.maxNewTokens >= 1)) throw new EdgespecError(`max new tokens must be an integer ≥ 1, got ${s.maxNewTokens}`);
  return s;
}

/**
 * Parse a cached cost model (JSON text); null when it is missing, unreadable or not a cost model, so that the
 * caller measures it again (a bad cache entry is rebuilt, never fatal).
 */
export function parseCostModel(text: string | null): CostModel | null {
  if (!text) return null;
  try {
    const c = JSON.parse(text) as CostModel;
    const pos = (x: unknown) => typeof x === "number" && Number.isFinite(x) && x > 0;
    if (Array.isArray(c.verifyMs) && c.verifyMs.length >= 2 && c.verifyMs.every(pos) && pos(c.draftMs) && pos(c.draftPrefillMs))
      return { verifyMs: c.verifyMs, draftMs: c.draftMs, draftPrefillMs: c.draftPrefillMs };
  } catch {
    // fall through: measure again
  }
  return null;
}

export class ChatSession {
  messages: ChatMessage[] = [];
  private policy: AdaptiveK | null = null;
  private policyKey = "";

  constructor(readonly decoder: SpecDecoder, readonly system: string | null = null, private cost: CostModel | null = null) {
    this.reset();
  }

  /** New conversation: the system prompt only, both caches emptied. */
  reset(): void {
    this.messages = this.system ? [{ role: "system", content: this.system }] : [];
    this.decoder.reset();
  }

  /** The K policy for these settings: an AdaptiveK kept across turns (it learns answer lengths and
   * acceptance) while the budget stays the same; a fixed K otherwise. */
  policyFor(s: ChatSettings): number | KPolicy {
    if (!this.decoder.draft) return 0;
    if (s.k !== "auto") return s.k;
    if (!this.cost) throw new EdgespecError("adaptive K needs the device's cost model: calibrate first");
    const key = String(s.latencyBudgetMs);
    if (!this.policy || key !== this.policyKey) {
      this.policy = new AdaptiveK(this.cost, { latencyBudgetMs: s.latencyBudgetMs });
      this.policyKey = key;
    }
    return this.policy;
  }

  setCostModel(cost: CostModel): void {
    this.cost = cost;
    this.policy = null;
  }

  /**
   * Start the assistant's reply to `text`: iterate `chunks()` for streaming pieces. The user's message is in
   * `messages` at once; the reply is appended by `finish(g)` (call it after the loop, also after a stop).
   * Throws EdgespecError: an empty message, bad settings, or a prompt over the context.
   */
  send(text: string, settings: ChatSettings): Generation {
    if (!text.trim()) throw new EdgespecError("the message is empty");
    const s = checkSettings(settings);
    const messages = [...this.messages, { role: "user", content: text }];
    const k = this.policyFor(s);
    const g = generate(this.decoder, { messages, maxNewTokens: s.maxNewTokens, temperature: s.temperature, topP: s.topP,
      seed: s.seed, k, mode: k === 0 ? "plain" : "spec" });
    this.messages = messages;
    return g;
  }

  /** Append the finished (or stopped) reply to the conversation. */
  finish(g: Generation): void {
    this.messages = [...this.messages, { role: "assistant", content: g.text }];
  }
}
