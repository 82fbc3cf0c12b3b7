/**
 * The speculative decoder: prefill, the speculative round, generation (the TypeScript twin of
 * edgespec/engine/decoder.py, chain speculation only).
 *
 * State between calls is the committed token list and the two KV caches, so a follow-up prompt that extends
 * the previous conversation reuses every cached position of their common prefix (multi-turn KV reuse).
 */
import { followChoices, type GumbelCoupling } from "./coupling.js";
import { FixedK, type KPolicy } from "./kpolicy.js";
import { EdgespecError } from "./errors.js";
import type { ExportFiles } from "./files.js";
import type { KVCache } from "./kvcache.js";
import { MANIFEST_NAME, parseManifest, type Manifest } from "./manifest.js";
import { OnnxLM, type Logits } from "./model.js";
import { readNpyInt64 } from "./npy.js";
import type { OrtApi } from "./ort.js";
import type { Rng } from "./rng.js";
import { acceptReject, argmax, greedyAccept, isGreedy, probs, sample, type SamplingParams } from "./sampling.js";
import type { GenerationStats } from "./stats.js";
import { ChatTemplate, TextTokenizer, type ChatMessage } from "./text.js";

/** Prompt tokens per target run during prefill. */
export const PREFILL_CHUNK = 256;

export interface LoadOptions {
  /** Execution provider (see ort.ts PROVIDERS); falls back to CPU when unavailable. Default "cpu". */
  provider?: string;
  /** Intra-op threads per session (default: onnxruntime's choice). */
  threads?: number;
  /** Cap the context below the graphs' (tokens). */
  contextLength?: number;
  /** false: target only (plain decoding). Default true. */
  loadDraft?: boolean;
}

/**
 * One target run as the decoder committed it (what a replay of its verify calls needs, evaluate.ts): the run
 * started from L = `start` (tokens[L] = `last`, not cached; −1 for the prefill), fed [last, ...proposal]
 * (an empty proposal: a plain step) and committed `tokens` (all of them, before a stop token or maxNewTokens
 * cut what is emitted).
 */
export interface RoundRecord {
  start: number;
  proposal: number[];
  tokens: number[];
}

/** One target run's outcome: new token ids, how many of the first are accepted draft tokens, its record. */
export interface Step {
  ids: number[];
  fromDraft: number;
  round: RoundRecord;
}

const now = (): number => globalThis.performance?.now() ?? Date.now();

function commonPrefix(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/** Target + draft graphs of one export, with their caches and the committed tokens. One generation at a time. */
export class SpecDecoder {
  tokens: number[] = [];
  tcache!: KVCache;
  dcache: KVCache | null = null;
  /** The target's logits at the last plain step, float32 (V,). */
  plainRow: Float32Array | null = null;
  /** Times of the last proposal's one-token draft steps (ms), and its catch-up feed [ms, tokens]. */
  draftStepMs: number[] = [];
  catchup: [number, number] = [0, 0];
  readonly stopIds: ReadonlySet<number>;
  /** Width of p and q: the target's vocabulary, cut to the ids the tokenizer has. */
  readonly width: number;
  busy = false;

  constructor(readonly manifest: Manifest, readonly target: OnnxLM, readonly draft: OnnxLM | null,
    readonly tokenizer: TextTokenizer, readonly template: ChatTemplate | null, readonly contextLength: number,
    readonly keptIds: Int32Array | null = null) {
    this.stopIds = new Set(manifest.special_tokens.stop);
    // q and p are defined over the ids the tokenizer has: logits past them (a padded head) are cut off
    this.width = Math.min(target.spec.vocab_size, tokenizer.width());
    this.reset();
  }

  /**
   * Open an export written by `edgespec export`: edgespec.json, tokenizer.json, the chat template and both
   * graphs. Throws EdgespecError: no or an unreadable/unsupported manifest, a missing or corrupt graph or
   * tokenizer, a graph that does not match the manifest.
   */
  static async load(ort: OrtApi, files: ExportFiles, o: LoadOptions = {}): Promise<SpecDecoder> {
    if (!(await files.exists(MANIFEST_NAME)))
      throw new EdgespecError(`${files.dir}: not a complete edgespec export (no ${MANIFEST_NAME})`);
    const m = parseManifest(await files.readText(MANIFEST_NAME), `${files.dir}/${MANIFEST_NAME}`);
    for (const rel of [m.tokenizer, m.chat_template, m.target.path, m.draft.path])
      if (rel !== null && !(await files.exists(rel)))
        throw new EdgespecError(`${files.dir}: ${rel} is missing (incomplete export)`);
    const tok = new TextTokenizer(await files.readText(m.tokenizer), `${files.dir}/${m.tokenizer}`);
    let template: ChatTemplate | null = null;
    if (m.chat_template !== null) {
      const bos = m.special_tokens.bos !== null ? tok.idToToken(m.special_tokens.bos) ?? "" : "";
      template = new ChatTemplate(await files.readText(m.chat_template), bos, tok.idToToken(m.special_tokens.eos) ?? "");
    }
    const target = await OnnxLM.load(ort, files, m.target, "target", o.provider, o.threads);
    const draft = o.loadDraft === false ? null : await OnnxLM.load(ort, files, m.draft, "draft", o.provider, o.threads);
    let kept: Int32Array | null = null;
    if (draft && m.draft.kept_token_ids) {
      kept = readNpyInt64(await files.readBytes(m.draft.kept_token_ids), `${files.dir}/${m.draft.kept_token_ids}`);
      if (kept.length !== m.draft.vocab_size || kept.some((t) => t < 0 || t >= m.target.vocab_size))
        throw new EdgespecError(`${files.dir}/${m.draft.kept_token_ids}: not ${m.draft.vocab_size} target token ids`);
    }
    let ctx = Math.min(m.target.context_length, m.draft.context_length);
    if (o.contextLength !== undefined) ctx = Math.min(ctx, o.contextLength);
    return new SpecDecoder(m, target, draft, tok, template, ctx, kept);
  }

  /** Forget the conversation: empty both caches. */
  reset(): void {
    this.tokens = [];
    this.plainRow = null;
    this.tcache = this.target.newCache();
    this.dcache = this.draft ? this.draft.newCache() : null;
  }

  /** Token ids of a raw prompt, or of chat `messages` rendered with the chat template. Throws EdgespecError:
   * neither or both given, no messages, no template, or an empty prompt. */
  encode(input: { prompt?: string; messages?: readonly ChatMessage[] }): number[] {
    const { prompt, messages } = input;
    if ((prompt === undefined) === (messages === undefined)) throw new EdgespecError("give exactly one of prompt or messages");
    let text = prompt ?? "";
    if (messages !== undefined) {
      if (!messages.length) throw new EdgespecError("messages is empty");
      if (!this.template) throw new EdgespecError("this export has no chat template; pass a raw prompt");
      // only the template's markup may make control tokens; the Python runtime encodes such text as plain
      // text, the core refuses it (tokenizers.js cannot encode added-token text as ordinary text)
      messages.forEach((m, i) => {
        const t = this.tokenizer.controlTokenIn(m.content);
        if (t) throw new EdgespecError(`messages[${i}] contains the control token ${t} as text, which the core does not accept`);
      });
      text = this.template.render(messages);
    }
    // a raw prompt gets the tokenizer's <bos> (as the Python runtime, llama.cpp and Hugging Face); rendered
    // messages have it from the template
    const ids = this.tokenizer.encode(text, messages === undefined);
    if (!ids.length) throw new EdgespecError("the prompt is empty");
    return ids;
  }

  // -- the steps ----------------------------------------------------------------------------------------

  /** Run the prompt through the target, reusing the cached common prefix with the previous call, and sample
   * the first new token from the last position's p: drawn with `rng`, or the race choice of `coupling` at
   * position ids.length. Returns [token, reused prompt tokens]. */
  async prefill(ids: number[], sp: SamplingParams, rng: Rng, coupling: GumbelCoupling | null = null): Promise<[number, number]> {
    const keep = Math.min(commonPrefix(this.tokens, ids), ids.length - 1);
    this.tcache.crop(keep); // rollback site for a new prompt: drop what the new prompt does not share
    this.dcache?.crop(keep);
    const reused = this.tcache.length;
    this.tokens = [...ids];
    const pending = ids.slice(this.tcache.length);
    let logits: Logits | null = null;
    for (let i = 0; i < pending.length; i += PREFILL_CHUNK)
      logits = await this.target.forward(pending.slice(i, i + PREFILL_CHUNK), this.tcache, 1);
    const p = probs(logits!.last(), sp, this.width);
    const x = coupling && !isGreedy(sp) ? coupling.choose(p, ids.length) : sample(p, rng);
    this.tokens.push(x);
    return [x, reused];
  }

  /** Commit `ids` with the last one as `last` (not cached): the state a round starts from (tests). */
  async prefillState(ids: number[]): Promise<void> {
    this.reset();
    if (ids.length > 1) await this.target.forward(ids.slice(0, -1), this.tcache, 1);
    this.tokens = [...ids];
  }

  /** One target step on `last`: the token at position tokens.length (greedy argmax, the race choice of
   * `coupling`, or drawn with `rng`); not committed here. */
  async plainStep(sp: SamplingParams, rng: Rng, coupling: GumbelCoupling | null = null): Promise<number> {
    this.plainRow = (await this.target.forward(this.tokens.slice(-1), this.tcache)).last();
    if (isGreedy(sp)) return argmax(this.plainRow.subarray(0, this.width));
    const p = probs(this.plainRow, sp, this.width);
    return coupling ? coupling.choose(p, this.tokens.length) : sample(p, rng);
  }

  /** q over the target's vocabulary from draft logits (a pruned head maps back; q = 0 outside). */
  private draftProbs(row: Float32Array, sp: SamplingParams): Float64Array {
    if (!this.keptIds) return probs(row, sp, this.width);
    const q = new Float64Array(this.width);
    const small = probs(row, sp);
    this.keptIds.forEach((t, i) => { q[t] = small[i]; });
    return q;
  }

  /** 1. Draft: up to K tokens sampled autoregressively from the draft's q; first feeds what the draft has
   * not seen. Greedy proposals are the draft's argmax and q is null; under a `coupling` token i is the race
   * choice of q at position tokens.length + i (the target's noise there) and q is null too (the coupled rule
   * does not read it). */
  async proposeDraft(k: number, sp: SamplingParams, rng: Rng, coupling: GumbelCoupling | null = null): Promise<[number[], Float64Array[] | null]> {
    const draft = this.draft!, dcache = this.dcache!;
    let feed = this.tokens.slice(dcache.length);
    const drafted: number[] = [], q: Float64Array[] = [];
    this.draftStepMs = [];
    this.catchup = [0, 0];
    for (let i = 0; i < k; i++) {
      const t0 = now();
      const row = (await draft.forward(feed, dcache, 1)).last();
      const ms = now() - t0;
      if (feed.length === 1) this.draftStepMs.push(ms);
      else this.catchup = [ms, feed.length - 1]; // the feed's time includes drafting the first token
      if (isGreedy(sp)) {
        const best = argmax(this.keptIds ? row : row.subarray(0, this.width));
        drafted.push(this.keptIds ? this.keptIds[best] : best);
      } else if (coupling) {
        drafted.push(coupling.choose(this.draftProbs(row, sp), this.tokens.length + i));
      } else {
        q.push(this.draftProbs(row, sp));
        drafted.push(sample(q[q.length - 1], rng));
      }
      feed = drafted.slice(-1);
    }
    return [drafted, isGreedy(sp) || coupling ? null : q];
  }

  /**
   * Verify, accept and roll back one proposal (Leviathan et al. 2023, Algorithm 1).
   *
   * Invariant on entry: the target cache holds positions 0..L−1 of `tokens`; tokens[L] (`last`) is committed
   * but not cached; the draft cache holds 0..Ld−1 with Ld ≤ L + K (it lags after plain steps and full
   * acceptance, and catches up in the next proposal). `drafted` (K,) was sampled from `q` (K rows of V;
   * greedy or coupled: null). Under a `coupling` (seeded sampling, coupling.ts) row i's token is the race
   * choice of p at position L + 1 + i and a drafted token is accepted iff it is that choice. Returns [new
   * tokens, accepted count].
   */
  async specRound(drafted: number[], q: Float64Array[] | null, sp: SamplingParams, rng: Rng,
    stats: GenerationStats, coupling: GumbelCoupling | null = null): Promise<[number[], number]> {
    const L = this.tokens.length - 1, k = drafted.length;
    // 2. verify: the target scores `last` and all K drafted tokens in one run → p (K+1, V)
    const logits = await this.target.forward([this.tokens[L], ...drafted], this.tcache);
    const rows = Array.from({ length: k + 1 }, (_, i) => logits.row(i).subarray(0, this.width));
    // 3. accept: min(1, p/q) per token; correction from norm(max(0, p − q)) or a bonus token from p_{K+1}
    //    (coupled: keep a drafted token iff it is the target's race choice at its position)
    const [n, x] = isGreedy(sp) ? greedyAccept(drafted, rows)
      : coupling ? followChoices(drafted, (i) => coupling.choose(probs(rows[i], sp), L + 1 + i))
        : acceptReject(drafted, q!, (i) => probs(rows[i], sp), rng);
    // 4. roll back; 5. the draft catches up in its next proposal
    this.rollBack(L, n);
    stats.proposed += k;
    stats.accepted += n;
    stats.corrections += n < k ? 1 : 0;
    stats.bonus += n === k ? 1 : 0;
    return [[...drafted.slice(0, n), x], n];
  }

  /** 4. Roll back: the one place a round shortens the caches. The target keeps 0..L (`last` at L) and the
   * rows of the n accepted drafted tokens; the draft at most as much. */
  rollBack(L: number, n: number): void {
    this.tcache.crop(L + 1 + n);
    this.dcache!.crop(Math.min(this.dcache!.length, L + 1 + n));
  }

  // -- generation ---------------------------------------------------------------------------------------

  /**
   * Yield one Step per target run. `mode` "spec" (draft chain) or "plain" (target only). An integer `k` is a
   * fixed draft length; a KPolicy (AdaptiveK) chooses per round. Stop tokens end generation and are not
   * yielded; maxNewTokens is never exceeded; K is clamped so every verified position stays in the context.
   * `coupling` (sampling only): every token is the race choice of its position (drafter-invariant seeded
   * sampling, coupling.ts); else `rng` drives the accept/reject rule.
   * Throws EdgespecError (before any work): empty prompt, prompt not shorter than the context, bad options,
   * or another generation still running.
   */
  generateIds(inputIds: number[], o: { maxNewTokens: number; sampling: SamplingParams; rng: Rng; k: number | KPolicy;
    mode: "spec" | "plain"; stats: GenerationStats; coupling?: GumbelCoupling | null }): AsyncGenerator<Step> {
    if (o.mode !== "spec" && o.mode !== "plain") throw new EdgespecError(`mode must be "spec" or "plain", got ${o.mode}`);
    if (o.mode === "spec" && !this.draft) throw new EdgespecError("this decoder was loaded without its draft; use mode \"plain\"");
    if (!(Number.isInteger(o.maxNewTokens) && o.maxNewTokens >= 1))
      throw new EdgespecError(`maxNewTokens must be an integer ≥ 1, got ${o.maxNewTokens}`);
    if (!inputIds.length) throw new EdgespecError("the prompt is empty");
    if (inputIds.length >= this.contextLength)
      throw new EdgespecError(`the prompt is ${inputIds.length} tokens; the context holds ${this.contextLength}`);
    if (inputIds.some((t) => !(Number.isInteger(t) && t >= 0 && t < this.width)))
      throw new EdgespecError(`prompt token ids must be integers in [0, ${this.width})`);
    const policy = typeof o.k === "number" ? new FixedK(o.k) : o.k;
    if (this.busy) throw new EdgespecError("a generation is already running on this decoder; finish or stop it first");
    const coupling = isGreedy(o.sampling) ? null : o.coupling ?? null;
    return this.run([...inputIds], o.maxNewTokens, o.sampling, o.rng, policy, o.mode, o.stats, coupling);
  }

  private async *run(inputIds: number[], maxNew: number, sp: SamplingParams, rng: Rng, policy: KPolicy,
    mode: "spec" | "plain", stats: GenerationStats, coupling: GumbelCoupling | null): AsyncGenerator<Step> {
    this.busy = true;
    stats.mode = mode;
    stats.coupling = isGreedy(sp) ? "greedy" : coupling ? "gumbel" : "standard";
    stats.promptTokens = inputIds.length;
    stats.latencyBudgetMs = policy.latencyBudgetMs ?? null;
    const tStart = now();
    let finished = false;
    try {
      const [first, reused] = await this.prefill(inputIds, sp, rng, coupling);
      stats.reusedTokens = reused;
      stats.prefillMs = now() - tStart;
      policy.begin?.();
      let step: Step = { ids: [first], fromDraft: 0, round: { start: -1, proposal: [], tokens: [first] } };
      for (;;) {
        const room = maxNew - stats.newTokens;
        const stop = step.ids.findIndex((t) => this.stopIds.has(t));
        let ids = step.ids;
        if (stop >= 0 && stop < room) {
          ids = ids.slice(0, stop);
          stats.stopReason = "stop_token";
          stats.newTokens += 1; // the stop token was generated, not emitted
        } else ids = ids.slice(0, room);
        stats.newTokens += ids.length;
        stats.wallMs = now() - tStart;
        yield { ids, fromDraft: Math.min(step.fromDraft, ids.length), round: step.round };
        if (stats.stopReason === "stop_token") break;
        const remaining = maxNew - stats.newTokens;
        const L = this.tokens.length - 1;
        if (remaining <= 0) { stats.stopReason = "max_new_tokens"; break; }
        if (L >= this.contextLength) { stats.stopReason = "context"; break; }
        const kCap = Math.min(remaining - 1, this.contextLength - 1 - L);
        const lag = this.dcache ? L + 1 - this.dcache.length : 0;
        const k = mode === "plain" ? 0 : Math.max(0, Math.min(policy.choose(lag, remaining), kCap));
        const t0 = now();
        let fromDraft = 0, draftMs = 0, newIds: number[], proposal: number[] = [];
        if (k === 0) {
          stats.plainSteps += 1;
          newIds = [await this.plainStep(sp, rng, coupling)];
        } else {
          const [drafted, q] = await this.proposeDraft(k, sp, rng, coupling);
          draftMs = now() - t0;
          proposal = drafted;
          [newIds, fromDraft] = await this.specRound(drafted, q, sp, rng, stats, coupling);
        }
        const dt = now() - t0;
        stats.draftMs += draftMs;
        stats.verifyMs += dt - draftMs;
        stats.rounds += 1;
        stats.kPerRound.push(k);
        stats.roundMs.push(dt);
        const stepMs = k > 0 && this.draftStepMs.length ? median(this.draftStepMs) : null;
        const [cMs, cTokens] = k > 0 ? this.catchup : [0, 0];
        policy.observe(k, fromDraft, stepMs, dt, cMs, cTokens);
        if (k === 0 && mode !== "plain" && policy.observeConfidence) policy.observeConfidence(top1(this.plainRow!.subarray(0, this.width)));
        this.tokens.push(...newIds);
        step = { ids: newIds, fromDraft, round: { start: L, proposal, tokens: newIds } };
      }
      finished = true;
    } finally {
      if (!finished && !stats.stopReason) stats.stopReason = "aborted";
      stats.wallMs = now() - tStart;
      policy.end?.(stats.newTokens);
      this.busy = false;
    }
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b), m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/** The top-1 probability of a logits row at temperature 1. */
function top1(row: Float32Array): number {
  let max = -Infinity;
  for (let i = 0; i < row.length; i++) if (row[i] > max) max = row[i];
  let sum = 0;
  for (let i = 0; i < row.length; i++) sum += Math.exp(row[i] - max);
  return 1 / sum;
}
