/**
 * The export contract: `edgespec.json` read into typed, frozen data (the TypeScript twin of
 * edgespec/io/manifest.py). The core reads manifest format 1 with graph formats 1–4 (a graph's `graph_format`,
 * absent = 2): 2 adds an optional `logits_keep` input that onnxruntime's JavaScript API cannot feed (the core
 * slices logits afterwards, as the Python runtime does for format 1); 3 has an in-place KV buffer and fused
 * attention; 4 keeps format 3's in-place cache with per-KV-head past inputs and grouped attention in plain ops
 * (export/grouped_graph.py; see kvcache.ts). Anything else is refused with one clear error. A graph's optional
 * `prefill_path` (`edgespec export --prefill-int8`: the same graph with int8 layer matmuls, for prompt chunks) is
 * not loaded: the core prefills on `path`, which gives the same cache contract, and transfers skip it. A graph's
 * `kv_cache` (`edgespec export --kv-int8`, graph format 3 only) is the KV buffers' element type, float32 or int8.
 */
import { EdgespecError } from "./errors.js";
import { pastNames } from "./kvcache.js";

export const MANIFEST_NAME = "edgespec.json";
/** Manifest `format` values this core reads. */
export const SUPPORTED_FORMATS: readonly number[] = [1];
/** The newest graph format (GraphSpec.graph_format) this core reads. */
export const GRAPH_FORMAT = 4;
/** GraphSpec.kv_cache values: the element type of the KV buffers. */
export const KV_CACHE_TYPES = ["float32", "int8"] as const;
export type KvCacheType = (typeof KV_CACHE_TYPES)[number];

/** How a graph's weights were quantized (int4 MatMulNBits, int8 dynamic, or fp32). */
export interface Quantization {
  readonly precision: string;
  readonly block_size: number | null;
  readonly accuracy_level: number | null;
  readonly lm_head_bits: number;
}

/**
 * One ONNX causal LM graph with KV-cache inputs and outputs. Inputs: `input_ids` int64 (1, T),
 * `position_ids` int64 (1, T), `attention_mask` bool (1, 1, T, P+T), `past_key_values.{i}.key|value`
 * float32 (1, kv_heads, P, head_dim). Outputs: `logits` float32 (1, T, vocab_size),
 * `present.{i}.key|value` float32 (1, kv_heads, P+T, head_dim). Graph formats 3 and 4 change the KV inputs
 * and outputs (`graph_format`).
 */
export interface GraphSpec {
  readonly path: string;
  readonly architecture: string;
  readonly num_layers: number;
  readonly num_kv_heads: number;
  readonly head_dim: number;
  readonly vocab_size: number;
  readonly context_length: number;
  readonly quantization: Quantization;
  readonly input_names: readonly string[];
  readonly output_names: readonly string[];
  /** .npy of int64 target ids, one per output of a pruned draft head (draft only), or null. */
  readonly kept_token_ids: string | null;
  /** An int8 prefill graph beside `path` (`edgespec export --prefill-int8`), or null: the core never loads it,
   * and a transfer to the device leaves it and its data file behind (transfer.ts). */
  readonly prefill_path: string | null;
  /** 1–2: traced graph, KV concatenated per run; 3: past and present are one buffer of capacity C ≥ P+T
   * (past in its first P rows, P = mask width − T), updated in place; `logits_keep` int64 (1,) is an input.
   * 4 (batch 1): the past is `past_key_values.{i}.key|value.{h}` float32 (W, head_dim) per layer i and KV head
   * h, the first W ≥ P rows of that head's buffer; `attention_mask` is bool (1, 1, T, W+T) with the columns
   * P..W-1 false; the one KV output `present` float32 (2 · layers, kv_heads, T, head_dim) holds the T new rows
   * (layer i's key at 2i, value at 2i+1), which the runtime stores at rows P..P+T-1; `logits_keep` as in 3. */
  readonly graph_format: number;
  /** The KV buffers' element type (absent: float32). "int8" (graph format 3 only, `edgespec export --kv-int8`):
   * `past_key_values.{i}.*` and `present.{i}.*` are int8 of the same shapes, which GroupQueryAttention quantizes
   * (static per-channel scales inside the graph) and reads; the core only allocates and moves int8 rows. */
  readonly kv_cache: KvCacheType;
  /** The int8 cache's per-channel scales (.npz) beside `path`, or null: written with a float32 prefill graph
   * (`prefill_kv_cache` "float32", `edgespec export --kv-int8 --prefill-int8`), which only the Python runtime
   * loads; like the prefill graph, a transfer leaves it behind. */
  readonly kv_scales: string | null;
}

/** Token ids; `stop` ends generation. */
export interface SpecialTokens {
  readonly bos: number | null;
  readonly eos: number;
  readonly pad: number | null;
  readonly stop: readonly number[];
}

/** One file of the export as recorded at export time: `size` in bytes, hex `sha256`. */
export interface FileEntry {
  readonly size: number;
  readonly sha256: string;
}

export interface Manifest {
  readonly name: string;
  readonly format: number;
  readonly target: GraphSpec;
  readonly draft: GraphSpec;
  readonly tokenizer: string;
  readonly chat_template: string | null;
  readonly special_tokens: SpecialTokens;
  readonly edgespec_version: string;
  /** Every file of the export (paths inside it) with its size and sha256; empty in manifests older than
   * edgespec 0.1's integrity checks. */
  readonly files: Readonly<Record<string, FileEntry>>;
}

type Kind = "str" | "str?" | "pos" | "nonneg?" | "pos?" | "token" | "token?" | "tokens" | "names" | "object";
const isInt = (v: unknown): v is number => typeof v === "number" && Number.isInteger(v);
const KINDS: Record<Kind, [(v: unknown) => boolean, string]> = {
  "str": [(v) => typeof v === "string", "a string"],
  "str?": [(v) => v === null || typeof v === "string", "a string or null"],
  "pos": [(v) => isInt(v) && v > 0, "a positive integer"],
  "pos?": [(v) => v === null || (isInt(v) && v > 0), "a positive integer or null"],
  "nonneg?": [(v) => v === null || (isInt(v) && v >= 0), "an integer ≥ 0 or null"],
  "token": [(v) => isInt(v) && v >= 0, "a token id (an integer ≥ 0)"],
  "token?": [(v) => v === null || (isInt(v) && v >= 0), "a token id (an integer ≥ 0) or null"],
  "tokens": [(v) => Array.isArray(v) && v.every((t) => isInt(t) && t >= 0), "a list of token ids"],
  "names": [(v) => Array.isArray(v) && v.every((t) => typeof t === "string"), "a list of strings"],
  "object": [(v) => typeof v === "object" && v !== null && !Array.isArray(v), "an object"],
};

function show(v: unknown): string {
  const t = JSON.stringify(v) ?? String(v);
  return t.length <= 40 ? t : t.slice(0, 37) + "...";
}

/** Check `d` against `{key: [kind, required]}`; returns a copy with the known keys (missing optional: null). */
function fields(d: unknown, where: string, spec: Record<string, [Kind, boolean]>): Record<string, any> {
  if (!KINDS.object[0](d)) throw new EdgespecError(`${where || "the manifest"} must be an object, got ${show(d)}`);
  const src = d as Record<string, unknown>;
  const out: Record<string, any> = {};
  for (const [key, [kind, required]] of Object.entries(spec)) {
    if (!(key in src)) {
      if (required) throw new EdgespecError(`the "${key}" field is missing${where ? " in " + where : ""}`);
      out[key] = null;
      continue;
    }
    const [test, what] = KINDS[kind];
    if (!test(src[key])) throw new EdgespecError(`${where ? where + "." : ""}${key} must be ${what}, got ${show(src[key])}`);
    out[key] = src[key];
  }
  return out;
}

const GRAPH: Record<string, [Kind, boolean]> = {
  path: ["str", true], architecture: ["str", true], num_layers: ["pos", true], num_kv_heads: ["pos", true],
  head_dim: ["pos", true], vocab_size: ["pos", true], context_length: ["pos", true], quantization: ["object", true],
  input_names: ["names", true], output_names: ["names", true], kept_token_ids: ["str?", false],
  graph_format: ["pos", false], prefill_path: ["str?", false], kv_cache: ["str", false], kv_scales: ["str?", false],
};
const QUANT: Record<string, [Kind, boolean]> = {
  precision: ["str", true], block_size: ["pos?", false], accuracy_level: ["nonneg?", false], lm_head_bits: ["pos?", false],
};
const SPECIAL: Record<string, [Kind, boolean]> = {
  bos: ["token?", true], eos: ["token", true], pad: ["token?", true], stop: ["tokens", true],
};
const TOP: Record<string, [Kind, boolean]> = {
  name: ["str", true], target: ["object", true], draft: ["object", true], tokenizer: ["str", true],
  chat_template: ["str?", true], special_tokens: ["object", true], edgespec_version: ["str", true], format: ["pos", true],
};

function insideExport(p: string, where: string): string {
  const parts = p.split(/[\\/]/);
  if (!p || p.startsWith("/") || /^[A-Za-z]:/.test(p) || parts.includes(".."))
    throw new EdgespecError(`${where} must be a path inside the export directory, got ${show(p)}`);
  return p;
}

function graph(d: unknown, role: string): GraphSpec {
  const g = fields(d, role, GRAPH);
  g.graph_format = g.graph_format ?? 2;
  if (g.graph_format > GRAPH_FORMAT)
    throw new EdgespecError(`${role}.graph_format is ${g.graph_format}; this edgespec core reads graph formats up to ` +
      `${GRAPH_FORMAT} (update the app or export again)`);
  g.kv_cache = g.kv_cache ?? "float32";
  if (!(KV_CACHE_TYPES as readonly string[]).includes(g.kv_cache))
    throw new EdgespecError(`${role}.kv_cache must be one of ${KV_CACHE_TYPES.join(", ")}, got ${show(g.kv_cache)}`);
  if (g.kv_cache === "int8" && g.graph_format !== 3)
    throw new EdgespecError(`${role}.kv_cache int8 needs graph format 3, not ${g.graph_format}`);
  insideExport(g.path, `${role}.path`);
  if (g.kept_token_ids !== null) insideExport(g.kept_token_ids, `${role}.kept_token_ids`);
  if (g.prefill_path !== null) insideExport(g.prefill_path, `${role}.prefill_path`);
  if (g.kv_scales !== null) insideExport(g.kv_scales, `${role}.kv_scales`);
  const q = fields(g.quantization, `${role}.quantization`, QUANT);
  q.lm_head_bits = q.lm_head_bits ?? 32;
  const past = pastNames(g.num_layers, g.num_kv_heads, g.graph_format);
  const want = ["input_ids", "position_ids", "attention_mask", ...past];
  const missing = want.filter((n) => !g.input_names.includes(n));
  if (missing.length) throw new EdgespecError(`${role}.input_names lacks ${missing.slice(0, 3).join(", ")} ` +
    `(not an edgespec graph${g.graph_format === 4 ? " of graph format 4" : ""})`);
  const odd = g.input_names.filter((n: string) => n.startsWith("past_key_values.") && !past.includes(n));
  if (odd.length) throw new EdgespecError(`${role}.input_names has ${odd.slice(0, 3).join(", ")}, which ` +
    `${role}.num_layers ${g.num_layers} and num_kv_heads ${g.num_kv_heads} in graph format ${g.graph_format} do not give`);
  if (g.graph_format === 4 && !g.output_names.includes("present"))
    throw new EdgespecError(`${role}.output_names lacks present (graph format 4 returns the new KV rows in it)`);
  return Object.freeze({ ...g, quantization: Object.freeze(q), input_names: Object.freeze([...g.input_names]),
    output_names: Object.freeze([...g.output_names]) }) as GraphSpec;
}

/**
 * Parse and type-check the text of `edgespec.json` (`where` names it in errors).
 * Throws EdgespecError: not JSON, not an object, no or an unsupported `format`, a missing or wrongly typed field.
 */
export function parseManifest(text: string, where: string = MANIFEST_NAME): Manifest {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw new EdgespecError(`${where}: unreadable manifest (not valid JSON: ${(e as Error).message})`);
  }
  if (!KINDS.object[0](raw)) throw new EdgespecError(`${where}: not an edgespec manifest (expected a JSON object)`);
  const r = raw as Record<string, unknown>;
  if (!("format" in r)) throw new EdgespecError(`${where}: not an edgespec manifest (it has no "format" field)`);
  if (!isInt(r.format) || !SUPPORTED_FORMATS.includes(r.format))
    throw new EdgespecError(`${where}: manifest format ${show(r.format)}, this edgespec core reads format ` +
      `${SUPPORTED_FORMATS.join(", ")} (graph formats 1–${GRAPH_FORMAT}); re-export with a matching edgespec or update the app`);
  try {
    const m = fields(r, "", TOP);
    const st = fields(m.special_tokens, "special_tokens", SPECIAL);
    if (m.chat_template !== null) insideExport(m.chat_template, "chat_template");
    insideExport(m.tokenizer, "tokenizer");
    const files: Record<string, FileEntry> = {};
    const listed = r.files ?? {};
    if (!KINDS.object[0](listed)) throw new EdgespecError(`files must be an object, got ${show(listed)}`);
    for (const [rel, entry] of Object.entries(listed as Record<string, unknown>)) {
      insideExport(rel, "a key of files");
      const e = entry as Record<string, unknown>;
      if (!(KINDS.object[0](e) && isInt(e.size) && e.size >= 0 && typeof e.sha256 === "string" && /^[0-9a-f]{64}$/.test(e.sha256)))
        throw new EdgespecError(`files[${show(rel)}] must be {"size": bytes, "sha256": 64 hex digits}, got ${show(e)}`);
      files[rel] = Object.freeze({ size: e.size, sha256: e.sha256 });
    }
    return Object.freeze({ ...m, files: Object.freeze(files), target: graph(m.target, "target"), draft: graph(m.draft, "draft"),
      special_tokens: Object.freeze({ ...st, stop: Object.freeze([...st.stop]) }) }) as Manifest;
  } catch (e) {
    if (e instanceof EdgespecError) throw new EdgespecError(`${where}: invalid manifest: ${e.message}`);
    throw e;
  }
}
