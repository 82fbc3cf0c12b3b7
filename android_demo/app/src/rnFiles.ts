/**
 * Export folders in app storage with react-native-fs: ExportFiles over one (what the core loads), the list
 * of exports, and the check before loading (a folder of another model format, or files whose sizes are not
 * the manifest's, are refused with one clear message before onnxruntime opens anything).
 */
import { checkExportSizes, MANIFEST_NAME, notAnExport, parseManifest, type ExportFiles } from "@edgespec/core";
import RNFS from "react-native-fs";

/** Where downloads and imports go, and where the README's `adb push` puts exports: the app's external files
 * directory, readable without permissions. */
export const EXPORTS_ROOT = `${RNFS.ExternalDirectoryPath}/exports`;

function base64ToBytes(b64: string): Uint8Array {
  const bin = globalThis.atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** Size of a file in bytes, or null when there is none. */
export async function sizeOf(path: string): Promise<number | null> {
  if (!(await RNFS.exists(path))) return null;
  const s = await RNFS.stat(path);
  return s.isFile() ? Number(s.size) : null;
}

export function rnExportFiles(dir: string): ExportFiles {
  const abs = (rel: string) => `${dir}/${rel}`;
  return {
    dir,
    exists: async (rel) => (await sizeOf(abs(rel))) !== null,
    readText: (rel) => RNFS.readFile(abs(rel), "utf8"),
    readBytes: async (rel) => base64ToBytes(await RNFS.readFile(abs(rel), "base64")),
    graphPath: abs, // onnxruntime-react-native opens a file path; external weights are found next to it
  };
}

/** Folders under EXPORTS_ROOT, those with an edgespec.json first (the others are shown with the reason). */
export async function listExports(): Promise<string[]> {
  if (!(await RNFS.exists(EXPORTS_ROOT))) return [];
  const dirs = (await RNFS.readDir(EXPORTS_ROOT)).filter((i) => i.isDirectory()).map((i) => i.path);
  const ok = await Promise.all(dirs.map((d) => RNFS.exists(`${d}/${MANIFEST_NAME}`)));
  return [...dirs.filter((_, i) => ok[i]), ...dirs.filter((_, i) => !ok[i])];
}

/** Throws EdgespecError unless `dir` is an edgespec export this core reads whose files have the sizes its
 * manifest records. */
export async function checkBeforeLoad(dir: string): Promise<void> {
  if (!(await RNFS.exists(`${dir}/${MANIFEST_NAME}`))) throw notAnExport(dir, (await RNFS.readDir(dir)).map((i) => i.name));
  const m = parseManifest(await RNFS.readFile(`${dir}/${MANIFEST_NAME}`, "utf8"), `${dir}/${MANIFEST_NAME}`);
  await checkExportSizes(m, (rel) => sizeOf(`${dir}/${rel}`), dir);
}
