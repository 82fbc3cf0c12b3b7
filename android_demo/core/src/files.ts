/**
 * Where an export's files come from. Node reads a directory (`nodeExportFiles` in node.ts); a React Native
 * app implements the same four calls over its app storage (react-native-fs or expo-file-system).
 */
export interface ExportFiles {
  /** The export directory, for messages. */
  readonly dir: string;
  /** Whether `rel` (a path inside the export) is an existing file. */
  exists(rel: string): Promise<boolean>;
  /** UTF-8 text of `rel`. */
  readText(rel: string): Promise<string>;
  /** Bytes of `rel`. */
  readBytes(rel: string): Promise<Uint8Array>;
  /** A path or URI of `rel` that `InferenceSession.create` accepts (external weights next to it). */
  graphPath(rel: string): string;
}
