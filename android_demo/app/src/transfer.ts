/**
 * Getting an export into app storage: download it from the address of an export folder (any static HTTP
 * server, e.g. `python -m http.server` in the exports folder on the computer that made it), or import it from
 * a folder on the phone (a USB copy to Download/). Both read the manifest first (an unsupported format, or a
 * folder of another model format, is refused before anything is copied), check the free space, copy file by
 * file with progress (the manifest last, so a partial copy is never listed as an export), check each file's
 * size and sha256, and resume by skipping files already complete. The decisions are @edgespec/core's
 * (transfer.ts, tested on Node); this is react-native-fs wiring.
 */
import { EdgespecError, MANIFEST_NAME, notAnExport, parseManifest, planTransfer, type TransferFile,
  type TransferProgress } from "@edgespec/core";
import RNFS from "react-native-fs";
import { EXPORTS_ROOT, sizeOf } from "./rnFiles";

export type OnProgress = (p: TransferProgress) => void;

/** A transfer in progress: `cancel()` stops it (the files copied so far stay, for a later resume). */
export interface Transfer {
  promise: Promise<string>;
  cancel(): void;
}

/** The export folder's name in app storage: the last part of the address or path. */
function destName(source: string): string {
  const last = source.replace(/[?#].*$/, "").replace(/\/+$/, "").split("/").pop() ?? "";
  const name = decodeURIComponent(last).replace(/[^A-Za-z0-9._+-]/g, "_");
  if (!name || name === "." || name === "..") throw new EdgespecError(`${source}: cannot name an export folder after it`);
  return name;
}

async function ensureDirFor(file: string): Promise<void> {
  await RNFS.mkdir(file.slice(0, file.lastIndexOf("/")));
}

async function verify(f: TransferFile, path: string): Promise<void> {
  const size = await sizeOf(path);
  if (size !== f.size) throw new EdgespecError(`${f.path}: got ${size ?? 0} bytes, the manifest says ${f.size}`);
  if (f.sha256 && (await RNFS.hash(path, "sha256")) !== f.sha256) {
    await RNFS.unlink(path);
    throw new EdgespecError(`${f.path}: its sha256 is not the manifest's (a corrupt copy; it was removed, try again)`);
  }
}

/** Copy `plan`'s files with `copy(file, dest, onBytes)`; the manifest text is written last. */
async function run(source: string, manifestText: string, copy: (f: TransferFile, dest: string,
  onBytes: (n: number) => void) => Promise<void>, onProgress: OnProgress, cancelled: () => boolean): Promise<string> {
  const m = parseManifest(manifestText, `${source}/${MANIFEST_NAME}`);
  const dir = `${EXPORTS_ROOT}/${destName(source)}`;
  const have: Record<string, number | null> = {};
  for (const rel of Object.keys(m.files)) have[rel] = await sizeOf(`${dir}/${rel}`);
  const { freeSpace } = await RNFS.getFSInfo();
  const plan = planTransfer(m, new TextEncoder().encode(manifestText).length, have, freeSpace, source);
  let done = 0;
  for (const [i, f] of plan.fetch.entries()) {
    if (cancelled()) throw new EdgespecError("the transfer was cancelled (start it again to resume)");
    const report = (n: number) => onProgress({ doneBytes: done + n, totalBytes: plan.fetchBytes, file: f.path,
      fileIndex: i, files: plan.fetch.length });
    report(0);
    const dest = `${dir}/${f.path}`;
    await ensureDirFor(dest);
    if (f.path === MANIFEST_NAME) await RNFS.writeFile(dest, manifestText, "utf8");
    else {
      await copy(f, `${dest}.part`, report);
      await verify(f, `${dest}.part`);
      if (await RNFS.exists(dest)) await RNFS.unlink(dest);
      await RNFS.moveFile(`${dest}.part`, dest);
    }
    done += f.size;
    report(0);
  }
  return dir;
}

/** Download the export at `baseUrl` (the folder holding edgespec.json) into app storage. */
export function downloadExport(baseUrl: string, onProgress: OnProgress): Transfer {
  const base = baseUrl.trim().replace(/\/+$/, "");
  let jobId: number | null = null, stopped = false;
  const fetchFile = async (url: string, dest: string, onBytes: (n: number) => void) => {
    const job = RNFS.downloadFile({ fromUrl: url, toFile: dest, progressInterval: 250,
      begin: (r) => { jobId = r.jobId; }, progress: (r) => onBytes(r.bytesWritten) });
    jobId = job.jobId;
    const r = await job.promise;
    jobId = null;
    if (stopped) throw new EdgespecError("the download was cancelled (start it again to resume)");
    if (r.statusCode !== 200) throw new EdgespecError(`${url}: HTTP ${r.statusCode}`);
  };
  const promise = (async () => {
    if (!/^https?:\/\//.test(base)) throw new EdgespecError(`${baseUrl}: give an http:// or https:// address of an export folder`);
    const tmp = `${RNFS.CachesDirectoryPath}/edgespec-manifest.json`;
    try {
      await fetchFile(`${base}/${MANIFEST_NAME}`, tmp, () => {});
    } catch (e) {
      if (e instanceof EdgespecError && / HTTP 404$/.test(e.message))
        throw new EdgespecError(`${base}: no ${MANIFEST_NAME} there (HTTP 404): give the address of an edgespec export folder`);
      throw e;
    }
    const text = await RNFS.readFile(tmp, "utf8");
    return run(base, text, (f, dest, onBytes) => fetchFile(`${base}/${f.path.split("/").map(encodeURIComponent).join("/")}`, dest, onBytes),
      onProgress, () => stopped);
  })();
  return { promise, cancel: () => { stopped = true; if (jobId !== null) RNFS.stopDownload(jobId); } };
}

/** Import the export folder `srcDir` on the phone (e.g. /sdcard/Download/qwen2.5-coder-1.5b+0.5b). */
export function importExport(srcDir: string, onProgress: OnProgress): Transfer {
  const src = srcDir.trim().replace(/\/+$/, "");
  let stopped = false;
  const promise = (async () => {
    if (!(await RNFS.exists(src))) throw new EdgespecError(`${src}: no such folder`);
    if (!(await RNFS.exists(`${src}/${MANIFEST_NAME}`))) throw notAnExport(src, (await RNFS.readDir(src)).map((i) => i.name));
    const text = await RNFS.readFile(`${src}/${MANIFEST_NAME}`, "utf8");
    // copyFile reports no progress: progress moves file by file
    return run(src, text, (f, dest) => RNFS.copyFile(`${src}/${f.path}`, dest), onProgress, () => stopped);
  })();
  return { promise, cancel: () => { stopped = true; } };
}
