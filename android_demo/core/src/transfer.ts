/**
 * Getting an export onto a device: which files a download or import copies (the manifest's `files` list),
 * whether they fit in the free space, whether what is on disk is complete before loading it (sizes against
 * the manifest), and a clear error for a folder that holds a model of another format. Storage-neutral: the
 * app passes the sizes and free space it reads with react-native-fs; the tests pass Node's.
 */
import { EdgespecError } from "./errors.js";
import { MANIFEST_NAME, type Manifest } from "./manifest.js";

/** Room kept free beyond the export's bytes when planning a transfer (bytes). */
export const FREE_SPACE_MARGIN = 256 * 1024 * 1024;

export interface TransferFile {
  path: string;
  size: number;
  sha256: string;
}

export interface TransferPlan {
  /** Every file of the export, the manifest last (written last, so a partial copy is never an export). */
  files: TransferFile[];
  /** Files not yet present with their recorded size (what a resumed transfer copies). */
  fetch: TransferFile[];
  totalBytes: number;
  fetchBytes: number;
}

/** Progress of a transfer: bytes done of all bytes to copy, and the file being copied. */
export interface TransferProgress {
  doneBytes: number;
  totalBytes: number;
  file: string;
  fileIndex: number;
  files: number;
}

/** A file name that marks a model of another format, and what to call it. */
const OTHER_FORMATS: [RegExp, string][] = [
  [/^genai_config\.json$/, "an onnxruntime-genai model folder"],
  [/^mlc-chat-config\.json$/, "an MLC LLM model folder"],
  [/\.gguf$/i, "a GGUF model (llama.cpp)"],
  [/\.safetensors$|^pytorch_model.*\.bin$/, "a Hugging Face model folder"],
  [/\.pte$/, "an ExecuTorch program"],
  [/\.(tflite|task)$/, "a TensorFlow Lite or MediaPipe model"],
  [/\.onnx$/, "an ONNX model without an edgespec manifest"],
];

/** "1.8 GB", "557 kB", "201 B" (decimal units). */
export function formatBytes(n: number): string {
  if (n < 1e3) return `${n} B`;
  const [unit, d] = n < 1e6 ? ["kB", 1e3] : n < 1e9 ? ["MB", 1e6] : ["GB", 1e9];
  return `${(n / d).toFixed(n / d < 10 ? 1 : 0)} ${unit}`;
}

/**
 * The error for a folder (or download address) without an edgespec.json: names the other model format its
 * file `names` show, or lists a few of them.
 */
export function notAnExport(where: string, names: readonly string[]): EdgespecError {
  for (const [re, what] of OTHER_FORMATS)
    if (names.some((n) => re.test(n)))
      return new EdgespecError(`${where}: not an edgespec export (no ${MANIFEST_NAME}): it looks like ${what}; ` +
        "make an export from it with `edgespec export` on a computer, then copy that folder");
  const shown = names.slice(0, 5).join(", ") || "nothing";
  return new EdgespecError(`${where}: not an edgespec export (no ${MANIFEST_NAME}; it holds ${shown})`);
}

/** The files of the graphs' int8 prefill graphs (`prefill_path` and its `.data` file, as the exporter names
 * them, and the `kv_scales` an int8 cache's float32 prefill uses): the core never loads them, so a device
 * neither copies nor needs them (~0.9 GB for the 1.5B target). */
export function unusedFiles(m: Manifest): Set<string> {
  const out = new Set<string>();
  for (const g of [m.target, m.draft]) {
    if (g.prefill_path !== null) [g.prefill_path, `${g.prefill_path}.data`].forEach((p) => out.add(p));
    if (g.kv_scales !== null) out.add(g.kv_scales);
  }
  return out;
}

/** Every file the manifest names (graphs, tokenizer, template, kept ids) and lists, with the recorded size
 * and sha256 where the manifest lists it (null: an older manifest without `files`); not the prefill graphs'
 * files (`unusedFiles`). */
export function exportFiles(m: Manifest): { path: string; entry: { size: number; sha256: string } | null }[] {
  const named = [m.target.path, m.draft.path, m.tokenizer, m.chat_template, m.target.kept_token_ids, m.draft.kept_token_ids]
    .filter((p): p is string => p !== null);
  const unused = unusedFiles(m);
  const paths = [...new Set([...named, ...Object.keys(m.files)])].filter((p) => !unused.has(p)).sort();
  return paths.map((path) => ({ path, entry: m.files[path] ?? null }));
}

/**
 * Plan copying an export whose manifest is `m` (`manifestBytes`: its size). `have`: sizes of the files
 * already at the destination (absent or null: not there). `freeBytes`: free space at the destination (null:
 * unknown). Throws EdgespecError: the manifest lists no files (an export older than edgespec 0.1: copy it
 * with adb), its list lacks a file it names, or the files to copy do not fit in the free space.
 */
export function planTransfer(m: Manifest, manifestBytes: number, have: Record<string, number | null>,
  freeBytes: number | null, where: string): TransferPlan {
  if (!Object.keys(m.files).length)
    throw new EdgespecError(`${where}: this manifest lists no files (an export older than edgespec 0.1): ` +
      "copy the folder with adb, or export it again");
  const unlisted = exportFiles(m).filter((f) => f.entry === null).map((f) => f.path);
  if (unlisted.length) throw new EdgespecError(`${where}: the manifest's file list lacks ${unlisted.slice(0, 3).join(", ")}`);
  const unused = unusedFiles(m);
  const files: TransferFile[] = Object.entries(m.files).filter(([path]) => !unused.has(path))
    .sort(([a], [b]) => (a < b ? -1 : 1)).map(([path, e]) => ({ path, size: e.size, sha256: e.sha256 }));
  files.push({ path: MANIFEST_NAME, size: manifestBytes, sha256: "" });
  const fetch = files.filter((f) => f.path === MANIFEST_NAME || have[f.path] !== f.size);
  const sum = (fs: TransferFile[]) => fs.reduce((a, f) => a + f.size, 0);
  const plan = { files, fetch, totalBytes: sum(files), fetchBytes: sum(fetch) };
  if (freeBytes !== null && plan.fetchBytes + FREE_SPACE_MARGIN > freeBytes)
    throw new EdgespecError(`${where}: needs ${formatBytes(plan.fetchBytes + FREE_SPACE_MARGIN)} free ` +
      `(${formatBytes(plan.fetchBytes)} to copy and ${formatBytes(FREE_SPACE_MARGIN)} to spare); ` +
      `the device has ${formatBytes(freeBytes)} free`);
  return plan;
}

/**
 * The size check before loading: every file the manifest names or lists is present, and each listed one has
 * its recorded size. `sizeOf(rel)`: the file's size in bytes, or null when it is missing. Throws EdgespecError
 * naming the first missing or wrongly sized file (an interrupted copy or download).
 */
export async function checkExportSizes(m: Manifest, sizeOf: (rel: string) => Promise<number | null>,
  where: string): Promise<void> {
  for (const { path, entry } of exportFiles(m)) {
    const size = await sizeOf(path);
    if (size === null) throw new EdgespecError(`${where}: ${path} is missing (incomplete export: copy or download it again)`);
    if (entry && size !== entry.size)
      throw new EdgespecError(`${where}: ${path} is ${formatBytes(size)} (${size} bytes), the manifest says ` +
        `${formatBytes(entry.size)} (${entry.size} bytes): an incomplete copy; copy or download it again`);
  }
}
