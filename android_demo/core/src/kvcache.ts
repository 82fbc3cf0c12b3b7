/**
 * A KV cache that knows its length; rollback is `crop(n)`, called at one site in the decoder.
 *
 * Per layer two float32 tensors (1, kv_heads, length, head_dim), row-major, as the graphs' `present.*`
 * outputs return them. A crop copies each head's first n positions (a strided slice: heads are the outer axis).
 */
export class KVCache {
  /** 2·num_layers arrays, [key0, value0, key1, value1, ...], each (1, kv_heads, length, head_dim). */
  tensors: Float32Array[];
  length = 0;

  constructor(readonly numLayers: number, readonly numKvHeads: number, readonly headDim: number) {
    this.tensors = Array.from({ length: 2 * numLayers }, () => new Float32Array(0));
  }

  /** Dims of every cache tensor. */
  dims(): number[] {
    return [1, this.numKvHeads, this.length, this.headDim];
  }

  /** Replace the contents with a graph's present outputs of `length` positions. */
  set(tensors: Float32Array[], length: number): void {
    this.tensors = tensors;
    this.length = length;
  }

  /** Keep positions 0..n-1 (no-op when n ≥ length). */
  crop(n: number): void {
    if (n >= this.length) return;
    const { numKvHeads: h, headDim: d, length: len } = this;
    this.tensors = this.tensors.map((t) => {
      const out = new Float32Array(h * n * d);
      for (let i = 0; i < h; i++) out.set(t.subarray(i * len * d, i * len * d + n * d), i * n * d);
      return out;
    });
    this.length = n;
  }
}
