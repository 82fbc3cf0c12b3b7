/**
 * One graph of an export (target or draft) in an onnxruntime session, fed by the contract of manifest.ts.
 * Position ids default to the cache length, so they always equal the number of committed tokens.
 */
import { EdgespecError } from "./errors.js";
import type { ExportFiles } from "./files.js";
import { KVCache } from "./kvcache.js";
import type { GraphSpec } from "./manifest.js";
import { firstLine, openSession, type OrtApi, type SessionLike } from "./ort.js";

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

export class OnnxLM {
  private readonly pastNames: string[];
  private readonly presentNames: string[];

  private constructor(readonly ort: OrtApi, readonly spec: GraphSpec, readonly session: SessionLike,
    readonly provider: string, readonly fallbackReason: string | null, readonly role: string) {
    this.pastNames = [];
    this.presentNames = [];
    for (let i = 0; i < spec.num_layers; i++)
      for (const kind of ["key", "value"]) {
        this.pastNames.push(`past_key_values.${i}.${kind}`);
        this.presentNames.push(`present.${i}.${kind}`);
      }
  }

  /**
   * Open `spec`'s graph from `files` on `provider` (CPU fallback). Throws EdgespecError: the graph file is
   * missing, onnxruntime cannot load it, or its inputs/outputs are not the manifest's.
   */
  static async load(ort: OrtApi, files: ExportFiles, spec: GraphSpec, role: string, provider = "cpu",
    threads?: number): Promise<OnnxLM> {
    if (!(await files.exists(spec.path)))
      throw new EdgespecError(`${files.dir}: ${role} graph ${spec.path} is missing (incomplete export)`);
    const { session, provider: used, fallbackReason } = await openSession(ort, files.graphPath(spec.path), provider, threads);
    const lacks = (have: readonly string[], want: readonly string[]) => want.filter((n) => !have.includes(n));
    const missingIn = lacks(session.inputNames, [...spec.input_names, ...(spec.graph_format >= 3 ? ["logits_keep"] : [])]);
    const missingOut = lacks(session.outputNames, ["logits", ...spec.output_names]);
    if (missingIn.length || missingOut.length)
      throw new EdgespecError(`${files.dir}/${spec.path}: the ${role} graph does not match the manifest ` +
        `(no ${[...missingIn, ...missingOut].slice(0, 3).join(", ")})`);
    const extra = lacks([...spec.input_names, "logits_keep"], session.inputNames);
    const unfed = spec.graph_format < 3 && session.inputNames.includes("logits_keep") ? ["logits_keep"] : [];
    if (extra.length || unfed.length)
      throw new EdgespecError(`${files.dir}/${spec.path}: the ${role} graph does not match the manifest ` +
        `(inputs it does not list for graph format ${spec.graph_format}: ${[...extra, ...unfed].slice(0, 3).join(", ")})`);
    return new OnnxLM(ort, spec, session, used, fallbackReason, role);
  }

  /** Graph format 3: past and present share one buffer that the graph updates in place. */
  get inPlace(): boolean {
    return this.spec.graph_format >= 3;
  }

  newCache(): KVCache {
    return new KVCache(this.spec.num_layers, this.spec.num_kv_heads, this.spec.head_dim, this.inPlace,
      this.spec.context_length);
  }

  /**
   * Run `ids` (T,) after the cached positions; appends T positions to `cache`. Returns logits float32
   * (T, V), or with `keep` = N > 0 those of the last N rows (min(N, T), V). Graph format 3 takes
   * `logits_keep` as an input and computes the head for those rows only; format 2's `logits_keep` is an
   * overridable initializer that onnxruntime's JavaScript API cannot feed, so there every row is computed
   * and the last N are a view.
   */
  async forward(ids: readonly number[], cache: KVCache, keep = 0): Promise<Logits> {
    const { Tensor } = this.ort;
    const p = cache.length, t = ids.length;
    if (t === 0) throw new EdgespecError("forward needs at least one token");
    const pos = new BigInt64Array(t);
    for (let i = 0; i < t; i++) pos[i] = BigInt(p + i);
    const feeds: Record<string, InstanceType<OrtApi["Tensor"]>> = {
      input_ids: new Tensor("int64", BigInt64Array.from(ids, (x) => BigInt(x)), [1, t]),
      position_ids: new Tensor("int64", pos, [1, t]),
      attention_mask: new Tensor("bool", causalMask(p, t), [1, 1, t, p + t]),
    };
    const fetches: Record<string, InstanceType<OrtApi["Tensor"]> | null> = { logits: null };
    if (this.inPlace) {
      cache.reserve(p + t);
      feeds.logits_keep = new Tensor("int64", BigInt64Array.of(BigInt(keep)), [1]);
    }
    const dims = cache.dims();
    this.pastNames.forEach((name, i) => {
      feeds[name] = new Tensor("float32", cache.tensors[i], dims);
      // format 3: the present is the same buffer (a pre-allocated output); runtimes that ignore it return a copy
      fetches[this.presentNames[i]] = this.inPlace ? feeds[name] : null;
    });
    let out: Record<string, { data: unknown; dims: readonly number[] }>;
    try {
      out = await this.session.run(feeds, fetches);
    } catch (e) {
      throw new EdgespecError(`the ${this.role} graph failed to run (${firstLine(e)})`);
    }
    if (this.inPlace) {
      this.presentNames.forEach((n, i) => { if (out[n].data !== cache.tensors[i]) cache.tensors[i] = out[n].data as Float32Array; });
      cache.length = p + t;
    } else cache.set(this.presentNames.map((n) => out[n].data as Float32Array), p + t);
    const logits = out.logits;
    const vocab = logits.dims[2];
    const data = logits.data as Float32Array;
    const rows = logits.dims[1];
    if (keep > 0 && keep < rows) return new Logits(data.subarray((rows - keep) * vocab), keep, vocab);
    return new Logits(data, rows, vocab);
  }
}
