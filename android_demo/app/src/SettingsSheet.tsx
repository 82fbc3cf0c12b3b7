/** The settings sheet: K (auto = adaptive, or fixed), latency budget, temperature, execution provider. */
import { checkSettings, EdgespecError, type ChatSettings } from "@edgespec/core";
import React, { useState } from "react";
import { Button, Modal, StyleSheet, Text, TextInput, View } from "react-native";

export const MOBILE_PROVIDERS = ["cpu", "xnnpack", "nnapi", "qnn"] as const;

interface Props {
  visible: boolean;
  settings: ChatSettings;
  provider: string;
  onClose(settings: ChatSettings, provider: string): void;
}

export function SettingsSheet({ visible, settings, provider, onClose }: Props) {
  const [k, setK] = useState(String(settings.k));
  const [budget, setBudget] = useState(settings.latencyBudgetMs === null ? "" : String(settings.latencyBudgetMs));
  const [temperature, setTemperature] = useState(String(settings.temperature));
  const [ep, setEp] = useState(provider);
  const [error, setError] = useState<string | null>(null);

  const save = () => {
    try {
      const next = checkSettings({
        ...settings,
        k: k.trim() === "auto" ? "auto" : Number(k),
        latencyBudgetMs: budget.trim() === "" ? null : Number(budget),
        temperature: Number(temperature),
      });
      setError(null);
      onClose(next, ep);
    } catch (e) {
      setError(e instanceof EdgespecError ? e.message : String(e));
    }
  };

  return (
    <Modal visible={visible} animationType="slide" transparent onRequestClose={save}>
      <View style={styles.sheet}>
        <Text style={styles.label}>K (draft length): "auto" or 0–16 (0 = target only)</Text>
        <TextInput style={styles.input} value={k} onChangeText={setK} autoCapitalize="none" />
        <Text style={styles.label}>Latency budget per round (ms, empty = none; used by auto K)</Text>
        <TextInput style={styles.input} value={budget} onChangeText={setBudget} keyboardType="numeric" />
        <Text style={styles.label}>Temperature (0 = greedy)</Text>
        <TextInput style={styles.input} value={temperature} onChangeText={setTemperature} keyboardType="numeric" />
        <Text style={styles.label}>Execution provider (reloads the export; falls back to CPU)</Text>
        <View style={styles.row}>
          {MOBILE_PROVIDERS.map((p) => (
            <Button key={p} title={p === ep ? `[${p}]` : p} onPress={() => setEp(p)} />
          ))}
        </View>
        {error && <Text style={styles.error}>{error}</Text>}
        <Button title="Done" onPress={save} />
      </View>
    </Modal>
  );
}

const styles = StyleSheet.create({
  sheet: { marginTop: "auto", backgroundColor: "#fff", padding: 16, gap: 6, borderTopLeftRadius: 12, borderTopRightRadius: 12, elevation: 8 },
  label: { color: "#333", fontSize: 13 },
  input: { borderWidth: 1, borderColor: "#ccc", borderRadius: 6, padding: 6 },
  row: { flexDirection: "row", gap: 6, flexWrap: "wrap" },
  error: { color: "#b00020" },
});
