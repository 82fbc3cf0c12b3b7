/**
 * A KV cache that knows its length; rollback is `crop(n)`, called at one site in the decoder.
 *
 * Per layer and kind (key, value) a float32 (1, kv_heads, capacity, head_dim) array, row-major, in `tensors`
 * [key0, value0, key1, value1, ...]. By graph format (the TypeScript twin of edgespec/io/onnx_model.py's
 * KVCache and SharedKVCache and of edgespec/io/grouped_kv.py's GroupedKVCache):
 * - 1–2: each run returns a new present of exactly the cached length (capacity = length), so a crop copies
 *   each head's first n positions (a strided slice: heads are the outer axis).
 * - 3 (`inPlace`): the graph reads the past from the first `length` rows of a buffer of `capacity` rows and
 *   writes the new rows in place.
 * - 4 (`grouped`): all layers in one preallocated `block` float32 (2 · layers, kv_heads, capacity, head_dim)
 *   (`tensors` are its per-layer-and-kind views), so a KV head's first W rows are one contiguous (W, head_dim)
 *   array: the graph's past input `past_key_values.{i}.key|value.{h}`, fed as a view (`pastViews`), never
 *   copied. The graph returns only the T new rows (`present` float32 (2 · layers, kv_heads, T, head_dim)),
 *   which `store` copies to rows P..P+T-1. The fed window W ≥ P is the past rounded up to WINDOW rows and kept
 *   while it covers the past (`window`), as the Python runtime binds it; its rows past P are masked off.
 * In formats 3 and 4 a crop is a length change (a tree's scattered path moves only its rows), and the buffer
 * grows by doubling (one copy) up to the context length.
 * An export whose `kv_cache` is int8 (format 3 only) keeps `Int8Array` buffers of the same shapes (`dtype`): the
 * graph quantizes the rows it writes, and crops, row moves and growth copy its bytes as they are.
 */
import { EdgespecError } from "./errors.js";
import type { KvCacheType } from "./manifest.js";

/** One KV buffer: float32, or int8 for an int8 cache (GraphSpec.kv_cache). */
export type KVArray = Float32Array | Int8Array;

/** Initial positions of a format-3/4 cache buffer (doubles on demand up to the context). */
export const INITIAL_CAPACITY = 512;
/** Rows: a format-4 graph's fed past is the past length rounded up to this (edgespec/io/grouped_kv.py WINDOW). */
export const WINDOW = 64;

/** The KV input names of a graph, in cache order: per layer key then value; in graph format 4 each of them per
 * KV head (`past_key_values.{i}.key.{h}`, the block's order: layer, kind, head). */
export function pastNames(numLayers: number, numKvHeads: number, graphFormat: number): string[] {
  const out: string[] = [];
  for (let i = 0; i < numLayers; i++)
    for (const kind of ["key", "value"]) {
      if (graphFormat === 4) for (let h = 0; h < numKvHeads; h++) out.push(`past_key_values.${i}.${kind}.${h}`);
      else out.push(`past_key_values.${i}.${kind}`);
    }
  return out;
}

/** bool (1, 1, T, P+T) `mask` as bool (1, 1, T, W+T) for a fed window of W ≥ P past rows: columns P..W-1 (rows
 * of the window that are not part of the past) false (edgespec/io/grouped_kv.py widen_mask). */
export function widenMask(mask: Uint8Array, past: number, t: number, window: number): Uint8Array {
  if (window === past) return mask;
  const out = new Uint8Array(t * (window + t));
  for (let i = 0; i < t; i++) {
    const src = i * (past + t), dst = i * (window + t);
    out.set(mask.subarray(src, src + past), dst);
    out.set(mask.subarray(src + past, src + past + t), dst + window);
  }
  return out;
}

export class KVCache {
  /** 2·num_layers arrays, [key0, value0, key1, value1, ...], each (1, kv_heads, capacity, head_dim); in
   * format 4 views of `block`. */
  tensors: KVArray[];
  /** Format 4: every layer's buffer, float32 (2 · layers, kv_heads, capacity, head_dim). */
  block: Float32Array = new Float32Array(0);
  length = 0;
  capacity = 0;
  /** Format 4: the past rows W fed on the last run (kept while it covers the past), null before the first
   * run and after growth. */
  window: number | null = null;

  /** `graphFormat` (1–4) picks the layout (the module docstring); `maxLength` is the model's context; `dtype`
   * the buffers' element type (int8: graph format 3 only). Throws EdgespecError: int8 in another format. */
  constructor(readonly numLayers: number, readonly numKvHeads: number, readonly headDim: number,
    readonly graphFormat = 2, readonly maxLength = Infinity, readonly dtype: KvCacheType = "float32") {
    if (dtype === "int8" && graphFormat !== 3)
      throw new EdgespecError(`an int8 KV cache needs graph format 3, not ${graphFormat}`);
    this.tensors = Array.from({ length: 2 * numLayers }, () => this.alloc(0));
  }

  /** A zeroed buffer of `n` elements of `dtype`. */
  private alloc(n: number): KVArray {
    return this.dtype === "int8" ? new Int8Array(n) : new Float32Array(n);
  }

  /** Formats 3–4: past and new rows live in preallocated buffers; a crop is a length change. */
  get inPlace(): boolean {
    return this.graphFormat >= 3;
  }

  /** Format 4: per-KV-head past inputs and one `present` output of the new rows. */
  get grouped(): boolean {
    return this.graphFormat === 4;
  }

  /** Dims of every cache tensor as fed to a format 1–3 graph. */
  dims(): number[] {
    return [1, this.numKvHeads, this.inPlace ? this.capacity : this.length, this.headDim];
  }

  /** Formats 1–2: replace the contents with a graph's present outputs of `length` positions. */
  set(tensors: KVArray[], length: number): void {
    this.tensors = tensors;
    this.length = this.capacity = length;
  }

  /** Formats 3–4: make room for `total` positions (grow by doubling, one copy). Throws EdgespecError past the
   * model's context. */
  reserve(total: number): void {
    if (total > this.maxLength) throw new EdgespecError(`context of ${total} tokens is longer than the model's ${this.maxLength}`);
    if (total <= this.capacity) return;
    let cap = Math.max(this.capacity, Math.min(INITIAL_CAPACITY, this.maxLength));
    while (cap < total) cap = Math.min(cap * 2, this.maxLength);
    if (this.grouped) {
      this.block = this.copyRows(this.block, 2 * this.numLayers * this.numKvHeads, this.capacity, cap, this.length);
      const layer = this.numKvHeads * cap * this.headDim;
      this.tensors = this.tensors.map((_, j) => this.block.subarray(j * layer, (j + 1) * layer));
      this.window = null;
    } else this.tensors = this.tensors.map((t) => this.copyRows(t, this.numKvHeads, this.capacity, cap, this.length));
    this.capacity = cap;
  }

  /**
   * Keep positions 0..n-1, then the positions in `keep` (each ≥ n, in that order; a tree's accepted path).
   * A contiguous `keep` (a chain's accepted prefix) is a length change in formats 3–4; a scattered one moves
   * just those rows down to n.. (formats 1–2: gathers them into new arrays).
   */
  crop(n: number, keep: readonly number[] = []): void {
    const contiguous = keep.every((p, i) => p === n + i);
    if (contiguous) {
      const m = n + keep.length;
      if (m >= this.length) return;
      if (!this.inPlace) {
        this.tensors = this.tensors.map((t) => this.copyRows(t, this.numKvHeads, this.length, m, m));
        this.capacity = m;
      }
      this.length = m;
      return;
    }
    if (keep.some((p) => p < n || p >= this.length))
      throw new EdgespecError(`crop(${n}, keep): positions must lie in ${n}..${this.length - 1}, got ${keep.join(", ")}`);
    const { numKvHeads: h, headDim: d } = this, cap = this.capacity, m = n + keep.length;
    this.tensors = this.tensors.map((t) => {
      const out = this.inPlace ? t : this.copyRows(t, h, cap, m, n);
      const outCap = this.inPlace ? cap : m;
      for (let i = 0; i < h; i++) {
        const rows = keep.map((p) => t.slice((i * cap + p) * d, (i * cap + p + 1) * d)); // copies first: overlap is safe
        rows.forEach((r, k) => out.set(r, (i * outCap + n + k) * d));
      }
      return out;
    });
    if (!this.inPlace) this.capacity = m;
    this.length = m;
  }

  /**
   * Format 4: the fed window W for a run after `past` rows (edgespec/io/grouped_kv.py `_window`): kept while it
   * still covers them (and is not more than two windows longer), else `past` rounded up to WINDOW rows (at most
   * the capacity). Call after `reserve`.
   */
  feedWindow(past: number): number {
    const w = this.window;
    if (w !== null && past <= w && w < past + 2 * WINDOW) return w;
    this.window = Math.min(this.capacity, Math.ceil(past / WINDOW) * WINDOW);
    return this.window;
  }

  /** Format 4: the first `w` rows of each KV head's buffer as views (W, head_dim), in `pastNames` order. */
  pastViews(w: number): Float32Array[] {
    const { capacity: cap, headDim: d } = this, n = 2 * this.numLayers * this.numKvHeads;
    return Array.from({ length: n }, (_, j) => this.block.subarray(j * cap * d, (j * cap + w) * d));
  }

  /** Format 4: copy `present` float32 (2 · layers, kv_heads, T, head_dim), the new rows of a run after the
   * cached positions, to rows length..length+T-1; the length grows by T. */
  store(present: Float32Array, t: number): void {
    const { capacity: cap, headDim: d, length: p } = this, n = 2 * this.numLayers * this.numKvHeads;
    if (present.length !== n * t * d)
      throw new EdgespecError(`present has ${present.length} values, not (${2 * this.numLayers}, ${this.numKvHeads}, ${t}, ${d})`);
    for (let j = 0; j < n; j++) this.block.set(present.subarray(j * t * d, (j + 1) * t * d), (j * cap + p) * d);
    this.length = p + t;
  }

  /** Rows 0..rows-1 of each of the `heads` heads of `t` (capacity `from`) into a new buffer of capacity `to`,
   * of `t`'s element type. */
  private copyRows<T extends KVArray>(t: T, heads: number, from: number, to: number, rows: number): T {
    const d = this.headDim;
    const out = (t instanceof Int8Array ? new Int8Array(heads * to * d) : new Float32Array(heads * to * d)) as T;
    for (let i = 0; i < heads; i++) out.set(t.subarray(i * from * d, i * from * d + rows * d), i * to * d);
    return out;
  }
}
