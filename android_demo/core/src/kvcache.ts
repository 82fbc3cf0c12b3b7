/**
 * A KV cache that knows its length; rollback is `crop(n)`, called at one site in the decoder.
 *
 * Per layer two float32 tensors (1, kv_heads, capacity, head_dim), row-major. Graph formats 1–2 return a
 * new present of exactly the cached length each run (capacity = length), so a crop copies each head's first
 * n positions (a strided slice: heads are the outer axis). Graph format 3 (`inPlace`) reads the past from
 * the first `length` rows of a buffer of `capacity` rows and writes the new rows in place: a crop is a length
 * change, and the buffer grows by doubling (one copy) up to the context length.
 */
import { EdgespecError } from "./errors.js";

/** Initial positions of a format-3 cache buffer (doubles on demand up to the context). */
export const INITIAL_CAPACITY = 512;

export class KVCache {
  /** 2·num_layers arrays, [key0, value0, key1, value1, ...], each (1, kv_heads, capacity, head_dim). */
  tensors: Float32Array[];
  length = 0;
  capacity = 0;

  constructor(readonly numLayers: number, readonly numKvHeads: number, readonly headDim: number,
    readonly inPlace = false, readonly maxLength = Infinity) {
    this.tensors = Array.from({ length: 2 * numLayers }, () => new Float32Array(0));
  }

  /** Dims of every cache tensor as fed to the graph. */
  dims(): number[] {
    return [1, this.numKvHeads, this.inPlace ? this.capacity : this.length, this.headDim];
  }

  /** Formats 1–2: replace the contents with a graph's present outputs of `length` positions. */
  set(tensors: Float32Array[], length: number): void {
    this.tensors = tensors;
    this.length = this.capacity = length;
  }

  /** Format 3: make room for `total` positions (grow by doubling, one copy). Throws EdgespecError past the
   * model's context. */
  reserve(total: number): void {
    if (total > this.maxLength) throw new EdgespecError(`context of ${total} tokens is longer than the model's ${this.maxLength}`);
    if (total <= this.capacity) return;
    let cap = Math.max(this.capacity, Math.min(INITIAL_CAPACITY, this.maxLength));
    while (cap < total) cap = Math.min(cap * 2, this.maxLength);
    this.tensors = this.tensors.map((t) => this.copyRows(t, this.capacity, cap, this.length));
    this.capacity = cap;
  }

  /** Keep positions 0..n-1 (no-op when n ≥ length). */
  crop(n: number): void {
    if (n >= this.length) return;
    if (!this.inPlace) this.tensors = this.tensors.map((t) => this.copyRows(t, this.length, n, n));
    if (!this.inPlace) this.capacity = n;
    this.length = n;
  }

  /** Rows 0..rows-1 of each head of `t` (capacity `from`) into a new buffer of capacity `to`. */
  private copyRows(t: Float32Array, from: number, to: number, rows: number): Float32Array {
    const { numKvHeads: h, headDim: d } = this;
    const out = new Float32Array(h * to * d);
    for (let i = 0; i < h; i++) out.set(t.subarray(i * from * d, i * from * d + rows * d), i * to * d);
    return out;
  }
}
