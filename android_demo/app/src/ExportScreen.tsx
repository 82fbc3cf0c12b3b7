/**
 * The first screen: the exports in app storage (tap one to load it), and getting one there: download from
 * the address of an export folder, or import from a folder on the phone, with a progress bar (bytes, file
 * n of m), Cancel, and the core's clear errors (not enough space, another model format, a bad manifest).
 */
import { EdgespecError, formatBytes, type TransferProgress } from "@edgespec/core";
import React, { useCallback, useEffect, useRef, useState } from "react";
import { Button, ScrollView, StyleSheet, Text, TextInput, View } from "react-native";
import { EXPORTS_ROOT, listExports } from "./rnFiles";
import { downloadExport, importExport, type Transfer } from "./transfer";

interface Props {
  /** Shown above the list: a loading step or the last load error. */
  status: string | null;
  error: boolean;
  downloadUrl: string;
  onDownloadUrl(url: string): void;
  onOpen(dir: string): void;
}

const message = (e: unknown) => (e instanceof EdgespecError ? e.message : `unexpected: ${String(e)}`);

export function ExportScreen({ status, error, downloadUrl, onDownloadUrl, onOpen }: Props) {
  const [found, setFound] = useState<string[]>([]);
  const [importDir, setImportDir] = useState("/sdcard/Download/");
  const [progress, setProgress] = useState<TransferProgress | null>(null);
  const [note, setNote] = useState<string | null>(null);
  const [running, setRunning] = useState(false);
  const transfer = useRef<Transfer | null>(null);

  const refresh = useCallback(() => { listExports().then(setFound, (e) => setNote(message(e))); }, []);
  useEffect(refresh, [refresh]);

  const start = async (t: Transfer) => {
    transfer.current = t;
    setRunning(true);
    setNote(null);
    try {
      const dir = await t.promise;
      setNote(`ready: ${dir.split("/").pop()}`);
      refresh();
    } catch (e) {
      setNote(message(e));
    } finally {
      transfer.current = null;
      setRunning(false);
      setProgress(null);
    }
  };

  const busy = running;
  const pct = progress && progress.totalBytes ? Math.floor((100 * progress.doneBytes) / progress.totalBytes) : 0;
  return (
    <ScrollView contentContainerStyle={styles.screen}>
      <Text style={styles.title}>edgespec</Text>
      {status && <Text style={error ? styles.error : styles.meta}>{status}</Text>}
      <Text style={styles.head}>Exports in {EXPORTS_ROOT}</Text>
      {found.length === 0 && <Text style={styles.meta}>none yet: download or import one below, or push one with adb</Text>}
      {found.map((d) => <Button key={d} title={d.split("/").pop()!} disabled={busy} onPress={() => onOpen(d)} />)}

      <Text style={styles.head}>Download (the address of an export folder, served over HTTP)</Text>
      <TextInput style={styles.input} value={downloadUrl} onChangeText={onDownloadUrl} autoCapitalize="none"
        placeholder="http://192.168.1.20:8000/qwen2.5-coder-1.5b+0.5b" />
      <Button title="Download" disabled={busy || !downloadUrl.trim()} onPress={() => start(downloadExport(downloadUrl, setProgress))} />

      <Text style={styles.head}>Import (a folder on this phone)</Text>
      <TextInput style={styles.input} value={importDir} onChangeText={setImportDir} autoCapitalize="none" />
      <Button title="Import" disabled={busy || !importDir.trim()} onPress={() => start(importExport(importDir, setProgress))} />

      {running && !progress && <Text style={styles.meta}>reading the manifest…</Text>}
      {running && progress && (
        <View style={styles.progress}>
          <View style={styles.track}><View style={[styles.bar, { width: `${pct}%` }]} /></View>
          <Text style={styles.meta}>
            {pct}% · {formatBytes(progress.doneBytes)} of {formatBytes(progress.totalBytes)} · file {progress.fileIndex + 1} of{" "}
            {progress.files}: {progress.file}
          </Text>
          <Button title="Cancel" onPress={() => transfer.current?.cancel()} />
        </View>
      )}
      {note && <Text style={/^ready/.test(note) ? styles.meta : styles.error}>{note}</Text>}
    </ScrollView>
  );
}

const styles = StyleSheet.create({
  screen: { padding: 12, gap: 8 },
  title: { fontSize: 18, fontWeight: "600" },
  head: { marginTop: 12, fontWeight: "600" },
  meta: { color: "#666", fontSize: 12 },
  error: { color: "#b00020" },
  input: { borderWidth: 1, borderColor: "#ccc", borderRadius: 6, padding: 6 },
  progress: { gap: 4, marginTop: 8 },
  track: { height: 8, backgroundColor: "#eee", borderRadius: 4, overflow: "hidden" },
  bar: { height: 8, backgroundColor: "#1b5e20" },
});
