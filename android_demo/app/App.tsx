/**
 * The demo's chat app: the export screen (download, import or pick an export; ExportScreen.tsx), then one
 * chat screen with a streaming reply whose accepted draft tokens are underlined, Stop, New, a stats line
 * (tokens, tok/s, alpha, mean K, prefill) and a settings sheet. Settings persist across launches
 * (settings.ts); the last export opens again on start.
 */
import { EdgespecError, type ChatSettings, type Generation } from "@edgespec/core";
import React, { useEffect, useRef, useState } from "react";
import { Button, FlatList, SafeAreaView, StyleSheet, Text, TextInput, View } from "react-native";
import { ExportScreen } from "./src/ExportScreen";
import { DEFAULT_APP_SETTINGS, loadSettings, saveSettings, type AppSettings } from "./src/settings";
import { SettingsSheet } from "./src/SettingsSheet";
import { useEdgespec } from "./src/useEdgespec";

interface Piece { text: string; fromDraft: boolean }
interface Bubble { role: "user" | "assistant"; pieces: Piece[] }

/** "42 tok · 11.8 tok/s · alpha 0.81 · K 3.2 · prefill 350 ms (120 reused) · stopped". */
function statsLine(g: Generation): string {
  const s = g.stats;
  const stop = s.stopReason === "aborted" ? " · stopped" : s.stopReason === "context" ? " · context full" : "";
  return `${s.summary()} · prefill ${Math.round(s.prefillMs)} ms (${s.reusedTokens} reused)${stop}`;
}

export default function App() {
  const { state, load } = useEdgespec();
  const [app, setApp] = useState<AppSettings | null>(null);
  const [showSettings, setShowSettings] = useState(false);
  const [bubbles, setBubbles] = useState<Bubble[]>([]);
  const [input, setInput] = useState("");
  const [busy, setBusy] = useState(false);
  const [stats, setStats] = useState("");
  const stop = useRef(false);

  useEffect(() => {
    loadSettings().then((s) => {
      setApp(s);
      if (s.lastExport) load(s.lastExport, s.provider);
    }, () => setApp(DEFAULT_APP_SETTINGS));
  }, [load]);

  const update = (next: AppSettings) => {
    setApp(next);
    saveSettings(next).catch((e) => setStats(`settings not saved: ${String(e)}`));
  };

  const send = async () => {
    if (state.kind !== "ready" || busy || !app) return;
    const chat = state.chat;
    let g: Generation;
    try {
      g = chat.send(input, app.chat);
    } catch (e) {
      setStats(e instanceof EdgespecError ? e.message : String(e));
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
        if (stop.current) break; // ends the generation after this target run (stats.stopReason "aborted")
      }
      setStats(statsLine(g));
    } catch (e) {
      setStats(e instanceof EdgespecError ? e.message : String(e));
    } finally {
      chat.finish(g);
      setBusy(false);
    }
  };

  if (!app) return <SafeAreaView style={styles.screen}><Text>…</Text></SafeAreaView>;
  if (state.kind !== "ready") {
    return (
      <SafeAreaView style={styles.screen}>
        <ExportScreen
          status={state.kind === "loading" ? `${state.step}…` : state.kind === "error" ? state.message : null}
          error={state.kind === "error"}
          downloadUrl={app.downloadUrl}
          onDownloadUrl={(downloadUrl) => update({ ...app, downloadUrl })}
          onOpen={(dir) => { update({ ...app, lastExport: dir }); load(dir, app.provider); }}
        />
      </SafeAreaView>
    );
  }

  return (
    <SafeAreaView style={styles.screen}>
      <View style={styles.header}>
        <Text style={styles.title}>{state.name}</Text>
        <Button title="Settings" disabled={busy} onPress={() => setShowSettings(true)} />
        <Button title="New" disabled={busy} onPress={() => { state.chat.reset(); setBubbles([]); setStats(""); }} />
        <Button title="Exports" disabled={busy} onPress={() => { update({ ...app, lastExport: null }); load(null, app.provider); }} />
      </View>
      <Text style={styles.meta}>
        {state.provider}{state.fallback ? ` (fell back: ${state.fallback})` : ""} · K {String(app.chat.k)} · draft tokens underlined
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
      <Text style={styles.meta}>{stats}</Text>
      <View style={styles.row}>
        <TextInput style={styles.input} value={input} onChangeText={setInput} placeholder="Ask…" multiline />
        {busy ? <Button title="Stop" onPress={() => { stop.current = true; }} /> : <Button title="Send" onPress={send} />}
      </View>
      <SettingsSheet
        visible={showSettings}
        settings={app.chat}
        provider={app.provider}
        onClose={(chat: ChatSettings, provider: string) => {
          setShowSettings(false);
          update({ ...app, chat, provider });
          if (provider !== app.provider) load(state.dir, provider); // the graphs reopen on the new provider
        }}
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
});
