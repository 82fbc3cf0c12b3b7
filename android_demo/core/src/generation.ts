/**
 * The embeddable API: `generate(decoder, options)` returns a Generation, an async iterable of UTF-8-safe
 * text pieces (`for await (const piece of g)`); `g.chunks()` also says which text came from accepted draft
 * tokens; afterwards `g.stats`, `g.text` and `g.tokenIds` hold the outcome. Breaking out of the loop stops
 * the generation after the current target run (stats.stopReason "aborted").
 */
import { GumbelCoupling, seedWords } from "./coupling.js";
import type { RoundRecord, SpecDecoder, Step } from "./decoder.js";
import { EdgespecError } from "./errors.js";
import type { KPolicy } from "./kpolicy.js";
import { Rng } from "./rng.js";
import { samplingParams } from "./sampling.js";
import { GenerationStats } from "./stats.js";
import { IncrementalDetokenizer, type ChatMessage } from "./text.js";

export interface GenerateOptions {
  /** Exactly one of prompt (raw text), messages (rendered with the chat template) or inputIds. */
  prompt?: string;
  messages?: readonly ChatMessage[];
  inputIds?: readonly number[];
  /** Default 256. */
  maxNewTokens?: number;
  /** 0 (default) is greedy. */
  temperature?: number;
  topK?: number;
  topP?: number;
  /** An integer in [0, 2^53): the seed of the Gumbel coupling (coupling "auto" or "gumbel") or of the Rng
   * (xoshiro128**, coupling "standard"); default: random. */
  seed?: number;
  /** The sampling rule (greedy ignores it), as edgespec's GenerationOptions.coupling: "gumbel" is
   * drafter-invariant seeded sampling (coupling.ts: the tokens depend only on the seed and the target, never
   * on K or the cache), "standard" the accept/reject rule of Leviathan et al. 2023 driven by the Rng (the same
   * distribution, but the stream follows what speculation did); "auto" (default) is "gumbel" with a seed and
   * "standard" without one. "gumbel" without a seed draws one. */
  coupling?: "auto" | "gumbel" | "standard";
  /** Fixed draft length K (default 4) or a KPolicy such as AdaptiveK. */
  k?: number | KPolicy;
  /** "spec" (default) or "plain" (target only). */
  mode?: "spec" | "plain";
}

/** A piece of text and whether it came from accepted draft tokens. */
export interface Chunk {
  text: string;
  fromDraft: boolean;
}

export const COUPLINGS = ["auto", "gumbel", "standard"] as const;

export class Generation implements AsyncIterable<string> {
  readonly stats: GenerationStats;
  readonly tokenIds: number[] = [];
  /** Every target run as committed, the prefill first (start −1): what evaluate.ts replays. */
  readonly rounds: RoundRecord[] = [];
  text = "";
  private readonly detok: IncrementalDetokenizer;
  private started = false;

  constructor(private readonly steps: AsyncGenerator<Step>, decoder: SpecDecoder, stats: GenerationStats) {
    this.detok = new IncrementalDetokenizer(decoder.tokenizer);
    this.stats = stats;
  }

  /** Yield {text, fromDraft} pieces; a Generation can be consumed once. */
  async *chunks(): AsyncGenerator<Chunk> {
    if (this.started) throw new EdgespecError("this generation was already consumed");
    this.started = true;
    try {
      for await (const { ids, fromDraft, round } of this.steps) {
        this.rounds.push(round);
        for (let i = 0; i < ids.length; i++) {
          this.tokenIds.push(ids[i]);
          const piece = this.detok.push([ids[i]]);
          if (piece) {
            this.text += piece;
            yield { text: piece, fromDraft: i < fromDraft };
          }
        }
      }
      const tail = this.detok.flush();
      if (tail) {
        this.text += tail;
        yield { text: tail, fromDraft: false };
      }
    } finally {
      await this.steps.return(undefined); // stop the decoder when the caller breaks out
    }
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<string> {
    for await (const c of this.chunks()) yield c.text;
  }

  /** Consume the whole generation; returns this. */
  async run(): Promise<this> {
    for await (const _ of this.chunks());
    return this;
  }
}

/**
 * Start a generation on `decoder` (it runs as it is iterated). Throws EdgespecError before any work for bad
 * options, an empty prompt, a prompt not shorter than the context, or a generation already running.
 */
export function generate(decoder: SpecDecoder, o: GenerateOptions): Generation {
  const given = [o.prompt, o.messages, o.inputIds].filter((x) => x !== undefined).length;
  if (given !== 1) throw new EdgespecError("give exactly one of prompt, messages or inputIds");
  const sampling = samplingParams({ temperature: o.temperature, topK: o.topK, topP: o.topP });
  const rule = o.coupling ?? "auto";
  if (!COUPLINGS.includes(rule)) throw new EdgespecError(`coupling must be one of ${COUPLINGS.join(", ")}, got ${rule}`);
  if (o.seed !== undefined) seedWords(o.seed); // an integer in [0, 2^53), else EdgespecError
  const ids = o.inputIds !== undefined ? [...o.inputIds] : decoder.encode({ prompt: o.prompt, messages: o.messages });
  const coupled = sampling.temperature > 0 && (rule === "gumbel" || (rule === "auto" && o.seed !== undefined));
  const coupling = coupled ? new GumbelCoupling(o.seed ?? Math.floor(Math.random() * 2 ** 53), decoder.width) : null;
  const stats = new GenerationStats();
  const steps = decoder.generateIds(ids, { maxNewTokens: o.maxNewTokens ?? 256, sampling, rng: new Rng(o.seed),
    k: o.k ?? 4, mode: o.mode ?? "spec", stats, coupling });
  return new Generation(steps, decoder, stats);
}
