/**
 * One graph of an export (target or draft) in an onnxruntime session, fed by the contract of manifest.ts
 * (the TypeScript twin of edgespec/io/onnx_model.py's OnnxLM). Position ids default to the cache length, so
 * they always equal the number of committed tokens; a tree verify passes its own position ids and mask.
 */
import { EdgespecError } from "./errors.js";
import type { ExportFiles } from "./files.js";
import { KVCache, pastNames, widenMask, type KVArray } from "./kvcache.js";
import type { GraphSpec } from "./manifest.js";
import { firstLine, openSession, type OrtApi, type SessionLike, type ValueMetadata } from "./ort.js";

/** Logits float32 (rows, vocab), row-major. */
export class Logits {
  constructor(readonly data: Float32Array, readonly rows: number, readonly vocab: number) {}

  /** Row i as a view, float32 (vocab,). */
  row(i: number): Float32Array {
    return this.data.subarray(i * this.vocab, (i + 1) * this.vocab);
  }

  /** The last row, float32 (vocab,). */
  last(): Float32Array {
    return this.row(this.rows - 1);
  }
}

/** bool (1, 1, T, P+T) as bytes: each new query sees all past keys and the new keys up to itself. */
export function causalMask(past: number, t: number): Uint8Array {
  const m = new Uint8Array(t * (past + t));
  for (let i = 0; i < t; i++) m.fill(1, i * (past + t), i * (past + t) + past + i + 1);
  return m;
}

/**
 * A tree verify's feeds as the Python decoder builds them (edgespec/engine/decoder.py `_verify`): the root (the
 * last committed token) then N nodes, `parents[i]` < i the parent of node i (-1: the root), after `past`
 * cached positions. Returns `positionIds` int (N+1,) = past + [0, depth of each node] and `mask` bool
 * (1, 1, N+1, past+N+1) as bytes: every past key, then the root, each row's ancestors and itself
 * (edgespec/core/token_tree.py `ancestors_mask`). Throws EdgespecError: a parent that is not an earlier node.
 */
export function treeFeeds(parents: readonly number[], past: number): { positionIds: number[]; mask: Uint8Array } {
  const n = parents.length, width = past + n + 1;
  const mask = new Uint8Array((n + 1) * width), depth = [0];
  mask.fill(1, 0, past + 1); // the root's row
  parents.forEach((par, i) => {
    if (!Number.isInteger(par) || par < -1 || par >= i) throw new EdgespecError(`tree node ${i} has parent ${par} (not an earlier node)`);
    const row = (i + 1) * width, from = (par + 1) * width;
    mask.set(mask.subarray(from, from + width), row); // the parent's row: the past, the root, its ancestors
    mask[row + past + i + 1] = 1;
    depth.push(depth[par + 1] + 1);
  });
  return { positionIds: depth.map((d) => past + d), mask };
}

/** A run's own position ids and mask (a tree verify); default: P.. and causal. */
export interface ForwardOptions {
  /** int (T,): each new row's position (a tree node's depth after the past). */
  positionIds?: readonly number[];
  /** bool (1, 1, T, P+T) as bytes, row-major: which past and new keys each new row sees. */
  mask?: Uint8Array;
}

export class OnnxLM {
  /** The KV input names in cache order (format 4: per KV head). */
  private readonly pastNames: string[];
  /** Formats 1–3: `present.{i}.key|value` in cache order; format 4: the one output `present`. */
  private readonly presentNames: string[];

  private constructor(readonly ort: OrtApi, readonly spec: GraphSpec, readonly session: SessionLike,
    readonly provider: string, readonly fallbackReason: string | null, readonly role: string) {
    this.pastNames = pastNames(spec.num_layers, spec.num_kv_heads, spec.graph_format);
    this.presentNames = spec.graph_format === 4 ? ["present"]
      : pastNames(spec.num_layers, spec.num_kv_heads, 2).map((n) => n.replace("past_key_values.", "present."));
  }

  /**
   * Open `spec`'s graph from `files` on `provider` (CPU fallback). Throws EdgespecError: the graph file is
   * missing, onnxruntime cannot load it, or its inputs/outputs are not the manifest's (names; and where the
   * runtime reports them, the past inputs' element type (`kv_cache`) and the KV heads, head size and vocabulary
   * of their shapes).
   */
  static async load(ort: OrtApi, files: ExportFiles, spec: GraphSpec, role: string, provider = "cpu",
    threads?: number): Promise<OnnxLM> {
    if (!(await files.exists(spec.path)))
      throw new EdgespecError(`${files.dir}: ${role} graph ${spec.path} is missing (incomplete export)`);
    const { session, provider: used, fallbackReason } = await openSession(ort, files.graphPath(spec.path), provider, threads);
    const where = `${files.dir}/${spec.path}: the ${role} graph does not match the manifest`;
    const lacks = (have: readonly string[], want: readonly string[]) => want.filter((n) => !have.includes(n));
    const present = spec.graph_format === 4 ? ["present"] : [];
    const missingIn = lacks(session.inputNames, [...spec.input_names, ...(spec.graph_format >= 3 ? ["logits_keep"] : [])]);
    const missingOut = lacks(session.outputNames, ["logits", ...present, ...spec.output_names]);
    if (missingIn.length || missingOut.length)
      throw new EdgespecError(`${where} (no ${[...missingIn, ...missingOut].slice(0, 3).join(", ")})`);
    const extra = lacks([...spec.input_names, "logits_keep"], session.inputNames);
    const unfed = spec.graph_format < 3 && session.inputNames.includes("logits_keep") ? ["logits_keep"] : [];
    if (extra.length || unfed.length)
      throw new EdgespecError(`${where} (inputs it does not list for graph format ${spec.graph_format}: ` +
        `${[...extra, ...unfed].slice(0, 3).join(", ")})`);
    checkShapes(session, spec, where);
    return new OnnxLM(ort, spec, session, used, fallbackReason, role);
  }

  /** Graph formats 3–4: past and present share preallocated buffers (format 4: the runtime stores the new rows). */
  get inPlace(): boolean {
    return this.spec.graph_format >= 3;
  }

  newCache(): KVCache {
    return new KVCache(this.spec.num_layers, this.spec.num_kv_heads, this.spec.head_dim, this.spec.graph_format,
      this.spec.context_length, this.spec.kv_cache);
  }

  /**
   * Run `ids` (T,) after the cached positions; appends T positions to `cache`. Returns logits float32
   * (T, V), or with `keep` = N > 0 those of the last N rows (min(N, T), V). Graph formats 3–4 take
   * `logits_keep` as an input and compute the head for those rows only; format 2's `logits_keep` is an
   * overridable initializer that onnxruntime's JavaScript API cannot feed, so there every row is computed
   * and the last N are a view. `o` gives a tree verify's position ids and mask (default: P.. and causal).
   * Throws EdgespecError: no ids, position ids or a mask of the wrong size, a context past the model's, or a
   * run onnxruntime refuses.
   */
  async forward(ids: readonly number[], cache: KVCache, keep = 0, o: ForwardOptions = {}): Promise<Logits> {
    const { Tensor } = this.ort;
    const p = cache.length, t = ids.length;
    if (t === 0) throw new EdgespecError("forward needs at least one token");
    if (o.positionIds && o.positionIds.length !== t)
      throw new EdgespecError(`${o.positionIds.length} position ids for ${t} tokens`);
    if (o.mask && o.mask.length !== t * (p + t))
      throw new EdgespecError(`a mask of ${o.mask.length} entries for ${t} tokens after ${p} (want ${t}·${p + t})`);
    const pos = new BigInt64Array(t);
    for (let i = 0; i < t; i++) pos[i] = BigInt(o.positionIds ? o.positionIds[i] : p + i);
    let mask = o.mask ?? causalMask(p, t), w = p;
    if (this.inPlace) cache.reserve(p + t);
    if (cache.grouped) {
      w = cache.feedWindow(p);
      mask = widenMask(mask, p, t, w);
    }
    const feeds: Record<string, InstanceType<OrtApi["Tensor"]>> = {
      input_ids: new Tensor("int64", BigInt64Array.from(ids, (x) => BigInt(x)), [1, t]),
      position_ids: new Tensor("int64", pos, [1, t]),
      attention_mask: new Tensor("bool", mask, [1, 1, t, w + t]),
    };
    const fetches: Record<string, InstanceType<OrtApi["Tensor"]> | null> = { logits: null };
    if (this.inPlace) feeds.logits_keep = new Tensor("int64", BigInt64Array.of(BigInt(keep)), [1]);
    if (cache.grouped) {
      const views = cache.pastViews(w); // the first W rows of each KV head's buffer, not copied
      this.pastNames.forEach((name, j) => { feeds[name] = new Tensor("float32", views[j], [w, this.spec.head_dim]); });
      fetches.present = null;
    } else {
      const dims = cache.dims();
      this.pastNames.forEach((name, i) => {
        feeds[name] = new Tensor(cache.dtype, cache.tensors[i], dims);
        // format 3: the present is the same buffer (a pre-allocated output); runtimes that ignore it return a copy
        fetches[this.presentNames[i]] = this.inPlace ? feeds[name] : null;
      });
    }
    let out: Record<string, { data: unknown; dims: readonly number[] }>;
    try {
      out = await this.session.run(feeds, fetches);
    } catch (e) {
      throw new EdgespecError(`the ${this.role} graph failed to run (${firstLine(e)})`);
    }
    if (cache.grouped) cache.store(out.present.data as Float32Array, t); // (2 · layers, kv, T, D): one copy
    else if (this.inPlace) {
      this.presentNames.forEach((n, i) => { if (out[n].data !== cache.tensors[i]) cache.tensors[i] = out[n].data as KVArray; });
      cache.length = p + t;
    } else cache.set(this.presentNames.map((n) => out[n].data as KVArray), p + t);
    const logits = out.logits;
    const vocab = logits.dims[2];
    const data = logits.data as Float32Array;
    const rows = logits.dims[1];
    if (keep > 0 && keep < rows) return new Logits(data.subarray((rows - keep) * vocab), keep, vocab);
    return new Logits(data, rows, vocab);
  }
}

/**
 * The KV and logits types and shapes the session reports (where its runtime reports them) against the manifest,
 * as edgespec/io/integrity.py's check_graph: past of the manifest's `kv_cache` type (float32 or int8)
 * (1, kv_heads, P, head_dim), or in format 4 float32 (W, head_dim) per KV head; format 4's `present`
 * (2 · layers, kv_heads, T, head_dim); logits (1, T, vocab_size). Symbolic dimensions are not compared.
 * Throws EdgespecError naming the first mismatch.
 */
function checkShapes(session: SessionLike, spec: GraphSpec, where: string): void {
  const meta = (list: readonly ValueMetadata[] | undefined) => new Map((list ?? []).map((m) => [m.name, m.shape ?? []]));
  const ins = meta(session.inputMetadata), outs = meta(session.outputMetadata);
  const fmt = spec.graph_format;
  for (const m of session.inputMetadata ?? [])
    if (m.name.startsWith("past_key_values.") && m.type !== undefined && m.type !== spec.kv_cache)
      throw new EdgespecError(`${where} (it takes ${m.name} as ${m.type}, the manifest's kv_cache is ${spec.kv_cache}; ` +
        "export again)");
  const axes: [string, ReadonlyArray<number | string> | undefined, [number, string, number][]][] = [];
  for (const name of pastNames(spec.num_layers, spec.num_kv_heads, fmt))
    axes.push([name, ins.get(name), fmt === 4 ? [[1, "head_dim", spec.head_dim]]
      : [[1, "num_kv_heads", spec.num_kv_heads], [3, "head_dim", spec.head_dim]]]);
  if (fmt === 4)
    axes.push(["present", outs.get("present"), [[0, "2 · num_layers", 2 * spec.num_layers],
      [1, "num_kv_heads", spec.num_kv_heads], [3, "head_dim", spec.head_dim]]]);
  axes.push(["logits", outs.get("logits"), [[2, "vocab_size", spec.vocab_size]]]);
  for (const [name, shape, checks] of axes) {
    if (!shape || !shape.length) continue;
    const want = name === "logits" ? 3 : fmt === 4 && name !== "present" ? 2 : 4;
    if (shape.length !== want)
      throw new EdgespecError(`${where} (${name} has ${shape.length} dimensions, graph format ${fmt} has ${want})`);
    for (const [axis, what, value] of checks)
      if (typeof shape[axis] === "number" && shape[axis] !== value)
        throw new EdgespecError(`${where} (${name} has ${shape[axis]} where the manifest's ${what} is ${value})`);
  }
}
