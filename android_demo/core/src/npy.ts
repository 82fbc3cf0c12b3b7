/** A reader for the one NumPy file an export may hold: a pruned draft head's kept token ids (int64, 1-D). */
import { EdgespecError } from "./errors.js";

/** Ids from a version 1–3 `.npy` of little-endian int64 (`<i8`), C order, one dimension. Throws EdgespecError. */
export function readNpyInt64(bytes: Uint8Array, where: string): Int32Array {
  const magic = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59];
  if (bytes.length < 10 || magic.some((b, i) => bytes[i] !== b)) throw new EdgespecError(`${where}: not a .npy file`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const major = bytes[6];
  const headerLen = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
  const start = (major === 1 ? 10 : 12) + headerLen;
  const header = new TextDecoder().decode(bytes.subarray(major === 1 ? 10 : 12, start));
  const shape = /'shape':\s*\((\d+),?\)/.exec(header);
  if (!/'descr':\s*'<i8'/.test(header) || /'fortran_order':\s*True/.test(header) || !shape)
    throw new EdgespecError(`${where}: expected a 1-D little-endian int64 array, got header ${header.trim()}`);
  const n = Number(shape[1]);
  if (bytes.length < start + 8 * n) throw new EdgespecError(`${where}: truncated (${n} ids announced)`);
  const out = new Int32Array(n);
  for (let i = 0; i < n; i++) out[i] = Number(view.getBigInt64(start + 8 * i, true));
  return out;
}
