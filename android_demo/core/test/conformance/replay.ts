/**
 * An `OrtApi` stand-in that replays logits the Python runtime recorded (scripts/make_vectors.py's replay
 * record), so the core's speculative loop runs on any JavaScript engine (Hermes included) without a native
 * onnxruntime. Engine-neutral: no Node.js modules.
 *
 * The stand-in is a checking model, not a mock of outputs: it keeps the token id of every cached position in
 * the KV tensors the core hands it (element [0, 0, pos, 0] of every past/present tensor; graph format 4:
 * element [pos, 0] of every per-KV-head past and [j, h, k, 0] of `present`; an int8 cache: the id's three bytes
 * in elements [0, 0, pos, 0..2]), reads the prefix
 * back on each run, and looks up the row recorded for that prefix. So a wrong rollback (a crop of the wrong
 * length, or of only some tensors), a wrong position id or a wrong causal mask shows up as an error or as a
 * prefix that was never recorded, not as a silently plausible token. Rows for unrecorded prefixes are NaN
 * (a correct greedy loop never uses one: verify rows after a rejected draft token); the target's and the
 * draft's misses are counted.
 */
import type { ExportFiles } from "../../src/files.js";
import { MANIFEST_NAME, parseManifest, type GraphSpec } from "../../src/manifest.js";
import { widenMask } from "../../src/kvcache.js";
import { causalMask } from "../../src/model.js";
import type { OrtApi, SessionLike, SessionOptionsLike, TensorData, TensorLike, TensorType } from "../../src/ort.js";

/** Write token `id` at element `at` of a KV buffer (an int8 one: its three low bytes at at..at+2). */
function putId(buf: Float32Array | Int8Array, at: number, id: number): void {
  if (buf instanceof Int8Array) for (let b = 0; b < 3; b++) buf[at + b] = ((id >> (8 * b)) & 0xff) - 128;
  else buf[at] = id;
}

/** The token id `putId` wrote at element `at`. */
function getId(buf: Float32Array | Int8Array, at: number): number {
  if (!(buf instanceof Int8Array)) return buf[at];
  return (buf[at] + 128) | ((buf[at + 1] + 128) << 8) | ((buf[at + 2] + 128) << 16);
}

/** Prefix (token ids joined by ",") → [ids, values]: the top entries of the logits row that follows it. */
export type RowTable = Record<string, [number[], number[]]>;

export interface ReplayRecord {
  k_max: number;
  top: number;
  target: RowTable;
  draft: RowTable;
}

/** Runs, rows and unrecorded rows of one replayed graph; `lastMisses`: runs whose last row was unrecorded
 * (a draft step always uses its last row; a verify run's last row is unused after a rejection). */
export interface ReplayCounts {
  runs: number;
  rows: number;
  misses: number;
  lastMisses: number;
}

class ReplayTensor implements TensorLike {
  constructor(readonly type: TensorType, readonly data: TensorData, readonly dims: readonly number[]) {}
}

class ReplaySession implements SessionLike {
  readonly inputNames: string[];
  readonly outputNames: string[];
  readonly counts: ReplayCounts = { runs: 0, rows: 0, misses: 0, lastMisses: 0 };

  constructor(readonly spec: GraphSpec, readonly table: RowTable) {
    this.inputNames = [...spec.input_names, ...(spec.graph_format >= 3 ? ["logits_keep"] : [])];
    this.outputNames = ["logits", ...spec.output_names];
  }

  async run(feeds: Record<string, TensorLike>, fetches?: Record<string, TensorLike | null>): Promise<Record<string, TensorLike>> {
    const spec = this.spec, inPlace = spec.graph_format >= 3, grouped = spec.graph_format === 4;
    const ids = Array.from(feeds.input_ids.data as BigInt64Array, Number);
    const t = ids.length;
    const mask = feeds.attention_mask;
    const pastNames = spec.input_names.filter((n) => n.startsWith("past_key_values."));
    const past = pastNames.map((n) => feeds[n]);
    // format 4: past (W, head_dim) per KV head, W ≥ P; the mask's columns P..W-1 are false (P = the first
    // query's position, checked against the mask below)
    const w = grouped ? past[0].dims[0] : mask.dims[3] - t;
    const p = grouped ? Number((feeds.position_ids.data as BigInt64Array)[0]) : w;
    const pos = Array.from(feeds.position_ids.data as BigInt64Array, Number);
    if (pos.some((x, i) => x !== p + i)) throw new Error(`position ids ${pos} after ${p} cached positions`);
    const causal = causalMask(p, t), got = mask.data as Uint8Array;
    const want = grouped ? widenMask(causal, p, t, w) : causal;
    if (mask.dims[3] !== w + t || got.length !== want.length || want.some((x, i) => x !== got[i]))
      throw new Error(`not the causal mask for ${p}+${t}${grouped ? ` in a window of ${w}` : ""}`);
    if (grouped) {
      if (past.length !== 2 * spec.num_layers * spec.num_kv_heads || past.some((q) => q.dims.length !== 2
        || q.dims[0] !== w || q.dims[1] !== spec.head_dim || (q.data as Float32Array).length !== w * spec.head_dim) || w < p)
        throw new Error(`format 4: past dims ${past[0].dims} (${past.length} inputs) for ${p} cached positions`);
      if (!fetches || fetches.present !== null || Object.keys(fetches).some((n) => n.startsWith("present.")))
        throw new Error("format 4: present is one output the graph allocates");
    }
    const [heads, cap, dim] = grouped ? [spec.num_kv_heads, w, spec.head_dim] : past[0].dims.slice(1);
    if (heads !== spec.num_kv_heads || dim !== spec.head_dim || cap < p || (!inPlace && cap !== p))
      throw new Error(`past dims ${past[0].dims} for ${p} cached positions`);
    // the prefix the core's caches hold, read back from every tensor (they must agree)
    const prefix: number[] = [];
    const kv = (q: TensorLike) => q.data as Float32Array | Int8Array;
    if (past.some((q) => q.type !== spec.kv_cache || !(kv(q) instanceof (spec.kv_cache === "int8" ? Int8Array : Float32Array))))
      throw new Error(`past tensors are not ${spec.kv_cache}`);
    for (let j = 0; j < p; j++) {
      const x = getId(kv(past[0]), j * dim);
      for (const q of past) if (getId(kv(q), j * dim) !== x) throw new Error(`KV tensors disagree at position ${j}`);
      prefix.push(x);
    }
    const out: Record<string, TensorLike> = {};
    if (grouped) { // the new rows only: (2 · layers, kv_heads, T, head_dim), each row's first element its token id
      const present = new Float32Array(past.length * t * dim);
      for (let j = 0; j < past.length; j++) ids.forEach((id, k) => { present[(j * t + k) * dim] = id; });
      out.present = new ReplayTensor("float32", present, [2 * spec.num_layers, heads, t, dim]);
    } else past.forEach((q, i) => {
      const name = pastNames[i].replace("past_key_values.", "present.");
      let buf: Float32Array | Int8Array;
      if (inPlace) {
        const given = fetches?.[name];
        if (!given || given.data !== q.data) throw new Error(`format 3: ${name} is not the past buffer`);
        if (cap < p + t) throw new Error(`format 3: buffer of ${cap} rows for ${p + t} positions`);
        buf = kv(q);
      } else {
        buf = new Float32Array(heads * (p + t) * dim);
        for (let h = 0; h < heads; h++) buf.set((q.data as Float32Array).subarray(h * p * dim, (h + 1) * p * dim), h * (p + t) * dim);
      }
      ids.forEach((id, k) => putId(buf, (p + k) * dim, id));
      out[name] = inPlace ? q : new ReplayTensor("float32", buf, [1, heads, p + t, dim]);
    });
    const keep = inPlace ? Number((feeds.logits_keep.data as BigInt64Array)[0]) : 0;
    const rows = keep > 0 ? Math.min(keep, t) : t;
    const vocab = spec.vocab_size;
    const logits = new Float32Array(rows * vocab).fill(-Infinity);
    this.counts.runs += 1;
    for (let r = 0; r < rows; r++) {
      const upTo = t - rows + r; // this row follows prefix + ids[0..upTo]
      const rec = this.table[[...prefix, ...ids.slice(0, upTo + 1)].join(",")];
      const row = logits.subarray(r * vocab, (r + 1) * vocab);
      this.counts.rows += 1;
      if (!rec) {
        row.fill(NaN);
        this.counts.misses += 1;
        if (r === rows - 1) this.counts.lastMisses += 1;
        continue;
      }
      rec[0].forEach((id, k) => { row[id] = rec[1][k]; });
    }
    out.logits = new ReplayTensor("float32", logits, [1, rows, vocab]);
    return out;
  }
}

/** The stand-in onnxruntime module: `InferenceSession.create("replay:<graph path>")` opens the target's or
 * the draft's recorded rows (SpecDecoder.load opens the target first; a self-pair, whose draft is the target's
 * graph, replays the union of both tables in each). */
export class ReplayOrt implements OrtApi {
  readonly sessions: Record<"target" | "draft", ReplaySession | undefined> = { target: undefined, draft: undefined };
  readonly Tensor = ReplayTensor;
  readonly InferenceSession: OrtApi["InferenceSession"];

  constructor(manifestText: string, records: ReplayRecord[]) {
    const m = parseManifest(manifestText);
    const merge = (role: "target" | "draft") => Object.assign({}, ...records.map((r) => r[role])) as RowTable;
    const same = m.target.path === m.draft.path;
    const tables = { target: same ? { ...merge("draft"), ...merge("target") } : merge("target"), draft: same ? { ...merge("target"), ...merge("draft") } : merge("draft") };
    this.InferenceSession = {
      create: async (path: string, _o?: SessionOptionsLike): Promise<SessionLike> => {
        const rel = path.replace(/^replay:/, "");
        const role = same ? (this.sessions.target ? "draft" : "target") : rel === m.target.path ? "target" : rel === m.draft.path ? "draft" : null;
        if (!role) throw new Error(`no replay record for ${path}`);
        return (this.sessions[role] = new ReplaySession(role === "target" ? m.target : m.draft, tables[role]));
      },
    };
  }

  /** Counts per role ("target", "draft") since construction. */
  counts(): Record<string, ReplayCounts> {
    const out: Record<string, ReplayCounts> = {};
    for (const role of ["target", "draft"] as const) if (this.sessions[role]) out[role] = { ...this.sessions[role]!.counts };
    return out;
  }
}

/** ExportFiles over texts in memory: the manifest, tokenizer and chat template by their paths; the graph
 * paths exist and open as `replay:<path>`. */
export function memoryExportFiles(name: string, texts: Record<string, string>): ExportFiles {
  const m = parseManifest(texts[MANIFEST_NAME]);
  const graphs = new Set([m.target.path, m.draft.path]);
  return {
    dir: name,
    exists: async (rel) => rel in texts || graphs.has(rel),
    async readText(rel) {
      if (!(rel in texts)) throw new Error(`${name}: no ${rel} in memory`);
      return texts[rel];
    },
    async readBytes(rel) {
      throw new Error(`${name}: ${rel}: binary files are not replayed`);
    },
    graphPath: (rel) => `replay:${rel}`,
  };
}
