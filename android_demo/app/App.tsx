/**
 * The demo's one chat screen: pick an export pushed to app storage, chat with a streaming reply whose
 * accepted draft tokens are highlighted, a stats line (tok/s, alpha, mean K) and a settings sheet.
 */
import { DEFAULT_SETTINGS, EdgespecError, type ChatSettings } from "@edgespec/core";
import React, { useEffect, useRef, useState } from "react";
import { Button, FlatList, SafeAreaView, StyleSheet, Text, TextInput, View } from "react-native";
import { SettingsSheet } from "./src/SettingsSheet";
import { EXPORTS_ROOT, listExports } from "./src/rnFiles";
import { useEdgespec } from "./src/useEdgespec";

interface Piece { text: string; fromDraft: boolean }
interface Bubble { role: "user" | "assistant"; pieces: Piece[] }

export default function App() {
  const { state, load } = useEdgespec();
  const [exportsFound, setExportsFound] = useState<string[]>([]);
  const [provider, setProvider] = useState("cpu");
  const [settings, setSettings] = useState<ChatSettings>(DEFAULT_SETTINGS);
  const [showSettings, setShowSettings] = useState(false);
  const [bubbles, setBubbles] = useState<Bubble[]>([]);
  const [input, setInput] = useState("");
  const [busy, setBusy] = useState(false);
  const [statsLine, setStatsLine] = useState("");
  const stop = useRef(false);
  const [dir, setDir] = useState<string | null>(null);

  useEffect(() => { listExports().then(setExportsFound); }, []);
  useEffect(() => { if (dir) load(dir, provider); }, [dir, provider, load]);

  const send = async () => {
    if (state.kind !== "ready" || busy) return;
    const chat = state.chat;
    let g;
    try {
      g = chat.send(input, settings);
    } catch (e) {
      setStatsLine(e instanceof EdgespecError ? e.message : String(e));
      return;
    }
    setBubbles((b) => [...b, { role: "user", pieces: [{ text: input, fromDraft: false }] }, { role: "assistant", pieces: [] }]);
    setInput("");
    setBusy(true);
    stop.current = false;
    try {
      for await (const c of g.chunks()) {
        setBubbles((b) => {
          const last = b[b.length - 1];
          return [...b.slice(0, -1), { ...last, pieces: [...last.pieces, c] }];
        });
        if (stop.current) break;
      }
    } catch (e) {
      setStatsLine(e instanceof EdgespecError ? e.message : String(e));
    } finally {
      chat.finish(g);
      setStatsLine(g.stats.summary());
      setBusy(false);
    }
  };

  if (state.kind !== "ready") {
    return (
      <SafeAreaView style={styles.screen}>
        <Text style={styles.title}>edgespec</Text>
        {state.kind === "loading" && <Text>{state.step}…</Text>}
        {state.kind === "error" && <Text style={styles.error}>{state.message}</Text>}
        <Text>Exports in {EXPORTS_ROOT}:</Text>
        {exportsFound.length === 0 && <Text>none — push one with adb (see android_demo/README.md)</Text>}
        {exportsFound.map((d) => <Button key={d} title={d.split("/").pop()!} onPress={() => setDir(d)} />)}
      </SafeAreaView>
    );
  }

  return (
    <SafeAreaView style={styles.screen}>
      <View style={styles.header}>
        <Text style={styles.title}>{state.name}</Text>
        <Button title="Settings" onPress={() => setShowSettings(true)} />
        <Button title="New" disabled={busy} onPress={() => { state.chat.reset(); setBubbles([]); setStatsLine(""); }} />
      </View>
      <Text style={styles.meta}>
        {state.provider}{state.fallback ? ` (fell back: ${state.fallback})` : ""} · draft tokens underlined
      </Text>
      <FlatList
        data={bubbles}
        keyExtractor={(_, i) => String(i)}
        renderItem={({ item }) => (
          <Text style={item.role === "user" ? styles.user : styles.assistant}>
            {item.pieces.map((p, i) => <Text key={i} style={p.fromDraft ? styles.draft : undefined}>{p.text}</Text>)}
          </Text>
        )}
      />
      <Text style={styles.meta}>{statsLine}</Text>
      <View style={styles.row}>
        <TextInput style={styles.input} value={input} onChangeText={setInput} placeholder="Ask…" multiline />
        {busy ? <Button title="Stop" onPress={() => { stop.current = true; }} /> : <Button title="Send" onPress={send} />}
      </View>
      <SettingsSheet
        visible={showSettings}
        settings={settings}
        provider={provider}
        onClose={(s, ep) => { setSettings(s); setShowSettings(false); if (ep !== provider) setProvider(ep); }}
      />
    </SafeAreaView>
  );
}

const styles = StyleSheet.create({
  screen: { flex: 1, padding: 12, gap: 8 },
  header: { flexDirection: "row", alignItems: "center", gap: 8 },
  title: { fontSize: 18, fontWeight: "600", flex: 1 },
  meta: { color: "#666", fontSize: 12 },
  user: { alignSelf: "flex-end", backgroundColor: "#e3f2fd", padding: 8, borderRadius: 8, marginVertical: 4 },
  assistant: { alignSelf: "flex-start", backgroundColor: "#f5f5f5", padding: 8, borderRadius: 8, marginVertical: 4 },
  draft: { textDecorationLine: "underline", color: "#1b5e20" },
  row: { flexDirection: "row", alignItems: "flex-end", gap: 8 },
  input: { flex: 1, borderWidth: 1, borderColor: "#ccc", borderRadius: 8, padding: 8, maxHeight: 120 },
  error: { color: "#b00020" },
});
