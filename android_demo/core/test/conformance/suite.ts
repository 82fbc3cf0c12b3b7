/**
 * The conformance suite: the core's tokenizer, chat template, streaming detokenizer, sampler, accept/reject,
 * KV cache, BigInt64Array, TextDecoder (a polyfill on Hermes) and the speculative loop itself (`generate` over the replayed graphs of
 * replay.ts, with rollback and async iteration), run on one engine into a plain JSON result.
 *
 * Engine-neutral (no Node.js modules): `conformance.test.ts` runs it on Node and checks the result against
 * the Python runtime's vectors; `app/hermes/conformance.js` runs the same code on Hermes (bundled by Metro,
 * compiled by React Native's hermesc), and tests/test_android_core.py compares the two results.
 */
import { AdaptiveK, type CostModel } from "../../src/adaptive.js";
import { SpecDecoder } from "../../src/decoder.js";
import { generate } from "../../src/generation.js";
import type { KPolicy } from "../../src/kpolicy.js";
import { KVCache } from "../../src/kvcache.js";
import { MANIFEST_NAME } from "../../src/manifest.js";
import { Rng } from "../../src/rng.js";
import { acceptReject, probs, sample, samplingParams } from "../../src/sampling.js";
import type { GenerationStats } from "../../src/stats.js";
import { IncrementalDetokenizer, type ChatMessage } from "../../src/text.js";
import { memoryExportFiles, ReplayOrt, type ReplayCounts, type ReplayRecord } from "./replay.js";

/** What a run needs: the export's text files by path, and the Python runtime's vectors for it. */
export interface ConformanceInput {
  name: string;
  texts: Record<string, string>;
  corpus: { text: string }[];
  control_tokens: Record<string, number>;
  chats: { messages: ChatMessage[]; prompt: string | null; ids: number[]; greedy: number[]; replay?: ReplayRecord }[];
}

/** A run's stats; with adaptive K, whose choices follow measured times, what depends on them is null (it
 * differs between engines and runs; the output ids, text and invariants may not). */
export interface RunStats {
  newTokens: number; rounds: number | null; proposed: number | null; accepted: number | null;
  corrections: number | null; bonus: number | null; plainSteps: number | null; kPerRound: number[] | null;
  stopReason: string; alpha: number | null; invariants: boolean;
}

export interface ReplayRun {
  chat: number;
  /** Fixed K, "mixed" (MIXED_K) or "auto" (AdaptiveK). */
  k: number | "mixed" | "auto";
  ids: number[];
  text: string;
  /** [text, fromDraft] per streamed piece (fromDraft null with adaptive K). */
  chunks: [string, boolean | null][];
  stats: RunStats;
  /** Replayed runs per graph (null with adaptive K). */
  counts: Record<string, ReplayCounts> | null;
  /** Draft runs whose last row (always used) had no recorded row: 0 for a correct loop, whatever K. */
  draftMisses: number;
}

export interface ConformanceResult {
  name: string;
  engine: string;
  tokenizer: { ids: number[]; decoded: string; decodedSkip: string; pieces: string[] }[];
  control: Record<string, number[]>;
  template: { prompt: string | null; ids: number[] }[];
  replay: ReplayRun[];
  /** null when the input has no replay record. */
  stop: { stopReason: string; busy: boolean; chunks: number } | null;
  sampler: { uint32: number[]; random: number[]; probs: number[][]; draws: number[]; accept: [number, number][] };
  kv: number[][];
  bigint: string[];
  /** TextDecoder on every split of multi-byte UTF-8 (what the byte-level detokenizer feeds it). */
  textDecoder: string[][];
}

/** A fixed cost model for adaptive K on replayed graphs (ms): its K choices vary with measured times, its
 * output must not. */
const REPLAY_COST: CostModel = { verifyMs: [20, 21, 22, 23, 24], draftMs: 4, draftPrefillMs: 0.5 };

/** A scripted K per round (cycling): plain steps that leave the draft behind, catch-ups, K from 1 to 4. */
class ScriptedK implements KPolicy {
  private i = 0;
  constructor(private readonly ks: readonly number[]) {}
  choose(): number {
    return this.ks[this.i++ % this.ks.length];
  }
  observe(): void {}
}
const MIXED_K = [0, 0, 3, 1, 0, 4, 2];

/** "node 20.x" or "hermes 0.12.0", and whether TextDecoder is the engine's own or the app's polyfill. */
export function engineName(): string {
  const h = (globalThis as { HermesInternal?: { getRuntimeProperties?: () => Record<string, unknown> } }).HermesInternal;
  const p = (globalThis as { process?: { versions?: { node?: string } } }).process;
  const name = h ? `hermes ${h.getRuntimeProperties?.()["OSS Release Version"] ?? "?"}` : p?.versions?.node ? `node ${p.versions.node}` : "unknown";
  // @bacons/text-decoder marks what it installs with Symbol.for("expo.builtin")
  const decoder = typeof TextDecoder === "undefined" ? "none"
    : (TextDecoder as unknown as Record<symbol, unknown>)[Symbol.for("expo.builtin")] === true ? "polyfill" : "engine";
  return `${name} (TextDecoder: ${decoder})`;
}

function runStats(s: GenerationStats, deterministicK: boolean): RunStats {
  const invariants = s.accepted <= s.evaluated && s.evaluated <= s.proposed && s.rounds === s.kPerRound.length
    && s.newTokens <= 1 + s.accepted + s.corrections + s.bonus + s.plainSteps;
  const k = <T>(x: T): T | null => (deterministicK ? x : null);
  return { newTokens: s.newTokens, rounds: k(s.rounds), proposed: k(s.proposed), accepted: k(s.accepted),
    corrections: k(s.corrections), bonus: k(s.bonus), plainSteps: k(s.plainSteps), kPerRound: k([...s.kPerRound]),
    stopReason: s.stopReason, alpha: k(s.alpha), invariants };
}

/** A logits row float32 (n,) from a fixed formula (no randomness: the same on every engine). */
function fixedRow(n: number, scale: number): Float32Array {
  return Float32Array.from({ length: n }, (_, i) => scale * Math.sin(1.7 * i + 0.3) + 0.05 * (i % 7));
}

function samplerChecks(): ConformanceResult["sampler"] {
  const r = new Rng(42);
  const uint32 = Array.from({ length: 8 }, () => r.nextUint32());
  const random = Array.from({ length: 4 }, () => r.random());
  const row = fixedRow(50, 3);
  const sps = [samplingParams(), samplingParams({ temperature: 0.7 }), samplingParams({ temperature: 1, topK: 5 }),
    samplingParams({ temperature: 0.9, topP: 0.8 })];
  const dists = sps.map((sp) => probs(row, sp));
  const rng = new Rng(7);
  const draws = Array.from({ length: 200 }, () => sample(dists[1], rng));
  // accept/reject on two draft positions: q from one row, p from another, K = 2
  const sp = samplingParams({ temperature: 1 });
  const q = [probs(fixedRow(12, 1.5), sp), probs(fixedRow(12, -1.1), sp)];
  const p = [probs(fixedRow(12, 2.0), sp), probs(fixedRow(12, 0.7), sp), probs(fixedRow(12, 1.3), sp)];
  const accept: [number, number][] = [];
  for (let seed = 0; seed < 200; seed++) {
    const g = new Rng(seed);
    const drafted = q.map((qi) => sample(qi, g));
    accept.push(acceptReject(drafted, q, p, g));
  }
  return { uint32, random, probs: dists.map((d) => Array.from(d)), draws, accept };
}

/** KV cache rollback in every layout (graph formats 2, 3, 4): values left after grow, crop, a scattered crop
 * (a tree's path) and regrow (2 layers, 2 heads, dim 3); format 4 also stores a `present` and feeds a window. */
function kvChecks(): number[][] {
  const out: number[][] = [];
  for (const fmt of [2, 3, 4]) {
    const c = new KVCache(2, 2, 3, fmt, 2048);
    const fill = (len: number) => Float32Array.from({ length: 2 * len * 3 }, (_, i) => i + 1);
    if (fmt === 4) {
      c.reserve(5);
      c.store(Float32Array.from({ length: 4 * 2 * 5 * 3 }, (_, i) => i + 1), 5); // (2 · layers, kv, T = 5, D)
    } else if (fmt === 3) {
      c.reserve(5);
      c.tensors = c.tensors.map((t) => t.map((_, i) => i + 1));
      c.length = 5;
    } else c.set(Array.from({ length: 4 }, () => fill(5)), 5);
    c.crop(3);
    out.push([c.length, c.capacity, ...Array.from(c.tensors[3].subarray(0, 2 * c.capacity * 3))]);
    c.length = fmt >= 3 ? 5 : c.length; // in place the rows past the length are still there
    if (fmt < 3) c.set(Array.from({ length: 4 }, () => fill(5)), 5);
    c.crop(1, [2, 4]);
    out.push([c.length, ...Array.from(c.tensors[1].subarray(0, 9)), ...Array.from(c.tensors[1].subarray(c.capacity * 3, c.capacity * 3 + 9))]);
    if (fmt >= 3) {
      c.reserve(600); // past the initial capacity: one copy that keeps the 3 valid rows of each head
      out.push([c.length, c.capacity, ...Array.from(c.tensors[0].subarray(0, 9)), ...Array.from(c.tensors[0].subarray(600 * 3, 600 * 3 + 9))]);
    }
    if (fmt === 4) out.push([c.feedWindow(3), c.feedWindow(64), c.feedWindow(65), c.feedWindow(3), c.pastViews(2)[7].length]);
  }
  return out;
}

const UTF8_TEXTS = ["é", "中文", "🙂👍🏽", "👨‍👩‍👧", "a→b ✓"];
const BAD_BYTES = [[0x80], [0xc0, 0xaf], [0xe4, 0xb8], [0xf0, 0x9f, 0x99], [0xed, 0xa0, 0x80], [0x61, 0xff, 0x62]];

/** For each text: the decode of every byte prefix (a truncated character is U+FFFD), then every split decoded
 * in two streaming calls; then malformed byte sequences. The reference is the WHATWG decoder (Node's). */
function textDecoderChecks(): string[][] {
  const enc = new TextEncoder();
  const out = UTF8_TEXTS.map((t) => {
    const b = enc.encode(t), r: string[] = [];
    for (let i = 0; i <= b.length; i++) r.push(new TextDecoder().decode(b.subarray(0, i)));
    for (let i = 0; i <= b.length; i++) {
      const d = new TextDecoder();
      r.push(d.decode(b.subarray(0, i), { stream: true }) + d.decode(b.subarray(i)));
    }
    return r;
  });
  out.push(BAD_BYTES.map((b) => new TextDecoder().decode(Uint8Array.from(b))));
  return out;
}

async function replayRuns(input: ConformanceInput): Promise<[ReplayRun[], ConformanceResult["stop"]]> {
  const records = input.chats.flatMap((c) => (c.replay ? [c.replay] : []));
  const ort = new ReplayOrt(input.texts[MANIFEST_NAME], records);
  const dec = await SpecDecoder.load(ort, memoryExportFiles(input.name, input.texts));
  const runs: ReplayRun[] = [];
  for (const [i, c] of input.chats.entries()) {
    if (!c.replay) continue;
    const kMax = c.replay.k_max;
    for (const k of [1, 3, "mixed", "auto"] as const) {
      dec.reset();
      const before = ort.counts();
      const policy = k === "auto" ? new AdaptiveK(REPLAY_COST, { kMax }) : k === "mixed" ? new ScriptedK(MIXED_K) : k;
      const g = generate(dec, { inputIds: c.ids, maxNewTokens: c.greedy.length, k: policy });
      const fixed = k !== "auto";
      const chunks: [string, boolean | null][] = [];
      for await (const ch of g.chunks()) chunks.push([ch.text, fixed ? ch.fromDraft : null]);
      const counts = Object.fromEntries(Object.entries(ort.counts()).map(([key, n]) => {
        const b = before[key] ?? { runs: 0, rows: 0, misses: 0, lastMisses: 0 };
        return [key, { runs: n.runs - b.runs, rows: n.rows - b.rows, misses: n.misses - b.misses, lastMisses: n.lastMisses - b.lastMisses }];
      }));
      runs.push({ chat: i, k, ids: [...g.tokenIds], text: g.text, chunks, stats: runStats(g.stats, fixed), counts: fixed ? counts : null,
        draftMisses: counts.draft?.lastMisses ?? 0 });
    }
  }
  // the Stop button: break out of the text iterator after the first piece
  const c = input.chats.find((x) => x.replay);
  if (!c) return [runs, null];
  dec.reset();
  const g = generate(dec, { inputIds: c.ids, maxNewTokens: c.greedy.length, k: 2 });
  let n = 0;
  for await (const _ of g) { n++; break; }
  return [runs, { stopReason: g.stats.stopReason, busy: dec.busy, chunks: n }];
}

/** Run every check of the suite on this engine. */
export async function runConformance(input: ConformanceInput): Promise<ConformanceResult> {
  const ort = new ReplayOrt(input.texts[MANIFEST_NAME], []);
  const dec = await SpecDecoder.load(ort, memoryExportFiles(input.name, input.texts), { loadDraft: false });
  const tok = dec.tokenizer;
  const tokenizer = input.corpus.map(({ text }) => {
    const ids = tok.encode(text);
    const d = new IncrementalDetokenizer(tok);
    return { ids, decoded: tok.decode(ids, false), decodedSkip: tok.decode(ids, true), pieces: [...ids.map((x) => d.push([x])), d.flush()] };
  });
  const control = Object.fromEntries(Object.keys(input.control_tokens).map((t) => [t, tok.encode(t)]));
  const template = input.chats.map((c) => c.prompt !== null
    ? { prompt: dec.template!.render(c.messages), ids: dec.encode({ messages: c.messages }) }
    : { prompt: null, ids: dec.encode({ prompt: c.messages[c.messages.length - 1].content }) });
  const [replay, stop] = await replayRuns(input);
  const big = BigInt64Array.from([0, 1, 151935, 2 ** 40, -3].map((x) => BigInt(x)));
  return { name: input.name, engine: engineName(), tokenizer, control, template, replay, stop, sampler: samplerChecks(),
    kv: kvChecks(), bigint: Array.from(big, (x) => `${x}:${Number(x)}`), textDecoder: textDecoderChecks() };
}
