/** Node.js glue: an export directory on disk as ExportFiles, and a one-call loader on onnxruntime-node. */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { SpecDecoder, type LoadOptions } from "./decoder.js";
import type { ExportFiles } from "./files.js";
import type { OrtApi } from "./ort.js";

/** ExportFiles over a directory. */
export function nodeExportFiles(dir: string): ExportFiles {
  const abs = (rel: string) => path.join(dir, rel);
  return {
    dir,
    async exists(rel) {
      try {
        return (await fs.stat(abs(rel))).isFile();
      } catch {
        return false;
      }
    },
    readText: (rel) => fs.readFile(abs(rel), "utf8"),
    async readBytes(rel) {
      return new Uint8Array(await fs.readFile(abs(rel)));
    },
    graphPath: abs,
  };
}

/** Load the export in `dir` on onnxruntime-node (imported here, so the core itself never depends on it). */
export async function loadNodeDecoder(dir: string, o: LoadOptions = {}): Promise<SpecDecoder> {
  const ort = (await import("onnxruntime-node")) as unknown as { default?: OrtApi } & OrtApi;
  return SpecDecoder.load(ort.default ?? ort, nodeExportFiles(dir), o);
}
