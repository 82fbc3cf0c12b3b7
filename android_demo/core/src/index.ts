/**
 * edgespec core: the speculative decoding loop of edgespec in TypeScript, on onnxruntime's JavaScript API.
 * Runs unchanged on onnxruntime-node, onnxruntime-react-native and onnxruntime-web (pass the module as OrtApi).
 */
export { AdaptiveK, calibrate, expectedTokens, tVerify, type AdaptiveOptions, type CostModel } from "./adaptive.js";
export { ChatSession, checkSettings, DEFAULT_SETTINGS, parseCostModel, type ChatSettings } from "./chat.js";
export { exponential, followChoices, GumbelCoupling, hash32, positionKey, raceScores, uniformNumerator } from "./coupling.js";
export { SpecDecoder, PREFILL_CHUNK, type LoadOptions, type RoundRecord, type Step } from "./decoder.js";
export { EdgespecError } from "./errors.js";
export { compareRows, compareWithReference, firstTokenCheck, greedyCheck, NEAR_TIE_LOGIT_GAP, plainRow, replayVerify,
  type Seeded, type Top2 } from "./evaluate.js";
export type { ExportFiles } from "./files.js";
export { COUPLINGS, generate, Generation, type Chunk, type GenerateOptions } from "./generation.js";
export { FixedK, type KPolicy } from "./kpolicy.js";
export { KVCache, pastNames, WINDOW } from "./kvcache.js";
export { GRAPH_FORMAT } from "./manifest.js";
export { parseManifest, SUPPORTED_FORMATS, MANIFEST_NAME, type FileEntry, type Manifest, type GraphSpec } from "./manifest.js";
export { OnnxLM, Logits, treeFeeds, type ForwardOptions } from "./model.js";
export { openSession, PROVIDERS, type OrtApi, type Provider, type SessionLike } from "./ort.js";
export { Rng } from "./rng.js";
export { acceptReject, greedyAccept, probs, sample, samplingParams, type SamplingParams } from "./sampling.js";
export { GenerationStats } from "./stats.js";
export { checkExportSizes, exportFiles, formatBytes, FREE_SPACE_MARGIN, notAnExport, planTransfer, type TransferFile,
  type TransferPlan, type TransferProgress } from "./transfer.js";
export { ChatTemplate, IncrementalDetokenizer, TextTokenizer, type ChatMessage } from "./text.js";
