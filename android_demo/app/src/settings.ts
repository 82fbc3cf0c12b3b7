/**
 * The app's persisted settings: the chat settings (K, latency budget, temperature, ...), the execution
 * provider, the last export and the last download address, in one JSON file in the app's documents folder.
 * A missing or bad file gives the defaults (each field is checked by the core's checkSettings), never an error.
 */
import { checkSettings, DEFAULT_SETTINGS, type ChatSettings } from "@edgespec/core";
import RNFS from "react-native-fs";

export interface AppSettings {
  chat: ChatSettings;
  provider: string;
  lastExport: string | null;
  downloadUrl: string;
}

export const DEFAULT_APP_SETTINGS: AppSettings = { chat: DEFAULT_SETTINGS, provider: "cpu", lastExport: null, downloadUrl: "" };
const PATH = `${RNFS.DocumentDirectoryPath}/edgespec-settings.json`;

/** The settings saved last, or the defaults (a field that does not check out falls back alone). */
export async function loadSettings(): Promise<AppSettings> {
  let raw: Partial<AppSettings> = {};
  try {
    if (await RNFS.exists(PATH)) raw = JSON.parse(await RNFS.readFile(PATH, "utf8")) ?? {};
  } catch {
    raw = {};
  }
  let chat = DEFAULT_SETTINGS;
  try {
    chat = checkSettings({ ...DEFAULT_SETTINGS, ...(raw.chat ?? {}) });
  } catch {
    // a setting the core refuses: the defaults
  }
  const str = (v: unknown, d: string) => (typeof v === "string" ? v : d);
  return { chat, provider: str(raw.provider, "cpu"), lastExport: typeof raw.lastExport === "string" ? raw.lastExport : null,
    downloadUrl: str(raw.downloadUrl, "") };
}

export async function saveSettings(s: AppSettings): Promise<void> {
  await RNFS.writeFile(PATH, JSON.stringify(s), "utf8");
}
