/** ExportFiles over the app's storage with react-native-fs: the export directory pushed with adb. */
import type { ExportFiles } from "@edgespec/core";
import RNFS from "react-native-fs";

/** Where the README's `adb push` puts exports: the app's external files directory, readable without permissions. */
export const EXPORTS_ROOT = `${RNFS.ExternalDirectoryPath}/exports`;

function base64ToBytes(b64: string): Uint8Array {
  const bin = globalThis.atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

export function rnExportFiles(dir: string): ExportFiles {
  const abs = (rel: string) => `${dir}/${rel}`;
  return {
    dir,
    async exists(rel) {
      return (await RNFS.exists(abs(rel))) && (await RNFS.stat(abs(rel))).isFile();
    },
    readText: (rel) => RNFS.readFile(abs(rel), "utf8"),
    readBytes: async (rel) => base64ToBytes(await RNFS.readFile(abs(rel), "base64")),
    graphPath: abs, // onnxruntime-react-native opens a file path; external weights are found next to it
  };
}

/** Export directories under EXPORTS_ROOT (those with an edgespec.json). */
export async function listExports(): Promise<string[]> {
  if (!(await RNFS.exists(EXPORTS_ROOT))) return [];
  const items = await RNFS.readDir(EXPORTS_ROOT);
  const dirs = items.filter((i) => i.isDirectory()).map((i) => i.path);
  const ok = await Promise.all(dirs.map((d) => RNFS.exists(`${d}/edgespec.json`)));
  return dirs.filter((_, i) => ok[i]);
}
