/**
 * Loading an export from app storage into a ChatSession: the check of its format and file sizes first
 * (rnFiles.checkBeforeLoad), the execution provider (with CPU fallback, which the core decides and
 * reports), and the device's cost model for adaptive K (cached next to the export,
 * re-measured when the cache is missing or bad). Every decision lives in @edgespec/core; this is wiring.
 */
import { calibrate, ChatSession, EdgespecError, parseCostModel, SpecDecoder } from "@edgespec/core";
import * as ort from "onnxruntime-react-native";
import { useCallback, useRef, useState } from "react";
import RNFS from "react-native-fs";
import { checkBeforeLoad, rnExportFiles } from "./rnFiles";

export type LoadState =
  | { kind: "idle" }
  | { kind: "loading"; step: string }
  | { kind: "ready"; chat: ChatSession; provider: string; fallback: string | null; name: string; dir: string }
  | { kind: "error"; message: string };

const SYSTEM = "You are a helpful coding assistant. Answer briefly.";

export function useEdgespec() {
  const [state, setState] = useState<LoadState>({ kind: "idle" });
  const current = useRef<SpecDecoder | null>(null);

  /** Load the export in `dir` on `provider` (null: back to the export screen); the previous one is released. */
  const load = useCallback(async (dir: string | null, provider: string) => {
    const old = current.current;
    current.current = null;
    await Promise.all([old?.target.session.release?.(), old?.draft?.session.release?.()]).catch(() => {});
    if (dir === null) {
      setState({ kind: "idle" });
      return;
    }
    try {
      setState({ kind: "loading", step: "checking the export's files" });
      await checkBeforeLoad(dir); // another format, or an incomplete copy: one clear message, nothing opened
      setState({ kind: "loading", step: "opening the graphs" });
      // onnxruntime-react-native's module satisfies the core's OrtApi (InferenceSession.create, Tensor)
      const decoder = await SpecDecoder.load(ort, rnExportFiles(dir), { provider });
      current.current = decoder;
      setState({ kind: "loading", step: "measuring this device (once)" });
      const cachePath = `${dir}/.calibration-${decoder.target.provider}.json`;
      let cost = parseCostModel((await RNFS.exists(cachePath)) ? await RNFS.readFile(cachePath, "utf8") : null);
      if (!cost) {
        cost = await calibrate(decoder.target, decoder.draft!, 6);
        await RNFS.writeFile(cachePath, JSON.stringify(cost), "utf8");
      }
      setState({ kind: "ready", chat: new ChatSession(decoder, SYSTEM, cost), provider: decoder.target.provider,
        fallback: decoder.target.fallbackReason, name: decoder.manifest.name, dir });
    } catch (e) {
      setState({ kind: "error", message: e instanceof EdgespecError ? e.message : `unexpected: ${String(e)}` });
    }
  }, []);

  return { state, load };
}
