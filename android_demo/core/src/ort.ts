/**
 * The small slice of onnxruntime's JavaScript API the core uses, so that one core runs on
 * `onnxruntime-node` (tests here), `onnxruntime-react-native` (Android/iOS) and `onnxruntime-web`: pass the
 * module itself (`import * as ort from "onnxruntime-react-native"`) wherever an `OrtApi` is asked for.
 */
import { EdgespecError } from "./errors.js";

export type TensorType = "float32" | "int8" | "int64" | "bool";
export type TensorData = Float32Array | Int8Array | BigInt64Array | Uint8Array;

/** An onnxruntime Tensor: `data` is a typed array of `dims` (row-major). */
export interface TensorLike {
  readonly type: string;
  readonly dims: readonly number[];
  readonly data: unknown;
}

/** An input's or output's metadata: tensors have an element `type` ("float32", "int8", ...) and a shape. */
export type ValueMetadata = { name: string; isTensor?: boolean; type?: string; shape?: ReadonlyArray<number | string> };

/** An onnxruntime InferenceSession. */
export interface SessionLike {
  readonly inputNames: readonly string[];
  readonly outputNames: readonly string[];
  /** Inputs' and outputs' names and (tensors) shapes, dimensions a number or a symbol; absent where the
   * runtime does not report them (onnxruntime-common < 1.22). */
  readonly inputMetadata?: readonly ValueMetadata[];
  readonly outputMetadata?: readonly ValueMetadata[];
  /** `fetches`: output names → null, or a Tensor to write that output into (a pre-allocated output). */
  run(feeds: Record<string, TensorLike>, fetches?: Record<string, TensorLike | null>): Promise<Record<string, TensorLike>>;
  release?(): Promise<void>;
}

/** Session options the core sets (a subset of onnxruntime's `InferenceSession.SessionOptions`). */
export interface SessionOptionsLike {
  executionProviders?: string[];
  graphOptimizationLevel?: "disabled" | "basic" | "extended" | "all";
  intraOpNumThreads?: number;
  logSeverityLevel?: 0 | 1 | 2 | 3 | 4;
  /** Session config entries, nested by dots (`{ session: { intra_op: { allow_spinning: "0" } } }`). */
  extra?: Record<string, unknown>;
}

/** The onnxruntime module: `InferenceSession.create` and the `Tensor` constructor. */
export interface OrtApi {
  InferenceSession: { create(path: string, options?: SessionOptionsLike): Promise<SessionLike> };
  Tensor: new (type: TensorType, data: TensorData, dims: readonly number[]) => TensorLike;
}

/**
 * Execution providers by the names onnxruntime's JavaScript packages use. CPU always exists; the mobile
 * package offers `xnnpack`, `nnapi` (Android) and `coreml` (iOS); `qnn` needs a build with the QNN provider.
 */
export const PROVIDERS = ["cpu", "xnnpack", "nnapi", "qnn", "coreml", "webgpu", "wasm"] as const;
export type Provider = (typeof PROVIDERS)[number];

/** A loaded session and the execution provider it actually runs on. */
export interface OpenedSession {
  session: SessionLike;
  provider: string;
  /** Why the requested provider was not used (null when it was). */
  fallbackReason: string | null;
}

/**
 * Open `path` on `provider` (onnxruntime still runs the nodes that provider does not take on its CPU
 * kernels), falling back to a CPU session if that provider cannot take the graph (not in this
 * onnxruntime build, or it refuses the model). Throws EdgespecError when even CPU cannot load it
 * (a missing or corrupt graph), with onnxruntime's first line of explanation.
 */
export async function openSession(ort: OrtApi, path: string, provider: string = "cpu",
  threads?: number): Promise<OpenedSession> {
  if (!(PROVIDERS as readonly string[]).includes(provider))
    throw new EdgespecError(`unknown execution provider "${provider}" (one of ${PROVIDERS.join(", ")})`);
  const options = (ep: string): SessionOptionsLike => ({
    executionProviders: [ep], graphOptimizationLevel: "all", logSeverityLevel: 3,
    // the draft's and the target's thread pools must not spin-wait on the same few cores between runs
    extra: { session: { intra_op: { allow_spinning: "0" } } },
    ...(threads ? { intraOpNumThreads: threads } : {}),
  });
  let fallbackReason: string | null = null;
  if (provider !== "cpu") {
    try {
      return { session: await ort.InferenceSession.create(path, options(provider)), provider, fallbackReason };
    } catch (e) {
      fallbackReason = firstLine(e);
    }
  }
  try {
    return { session: await ort.InferenceSession.create(path, options("cpu")), provider: "cpu", fallbackReason };
  } catch (e) {
    throw new EdgespecError(`${path}: onnxruntime cannot load this graph (${firstLine(e)})`);
  }
}

export function firstLine(e: unknown): string {
  const s = e instanceof Error ? e.message : String(e);
  return s.split("\n")[0].replace(/\u001b\[[0-9;]*m/g, "").slice(0, 300);
}
