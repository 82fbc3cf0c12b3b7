/** Test vectors written by scripts/make_vectors.py: EDGESPEC_VECTORS is a directory of them or a list of
 * files separated by the platform's path delimiter. Each names the export directory it was made from. */
import { readdirSync, readFileSync, statSync } from "node:fs";
import * as path from "node:path";
import type { Top2 } from "../src/evaluate.js";
import type { ChatMessage } from "../src/text.js";
import type { ReplayRecord } from "./conformance/replay.js";

export interface Vectors {
  file: string;
  export_dir: string;
  new_tokens: number;
  sampling_draws: number;
  draft_is_target: boolean;
  /** fp32 exports: plain and speculative ids must equal the Python runtime's exactly. */
  exact: boolean;
  /** Reported only (a divergence's plain gap below it is a "near tie"); the verdict is the verify-path rule. */
  near_tie_logit_gap: number;
  seeded_sampling: { temperature: number; top_p: number };
  /** The Gumbel coupling's noise: per (seed as a decimal string, n), for `ids`: the position key [b, b2], the
   * exact integer m of U = (m + 0.5) / 2^53, and E = −ln U as numpy computed it. */
  noise: { seed: string; n: number; ids: number[]; key: [number, number]; numerators: number[]; e: number[] }[];
  export_bytes: number;
  context_length: number;
  stop: number[];
  control_tokens: Record<string, number>;
  corpus: { text: string; ids: number[]; decoded: string; decoded_skip_special: string }[];
  /** Per prompt: Python's plain greedy ids (stop token included) with the top-1/top-2 gap (a figure) and the
   * top two [id, logit] of each step's row; its seeded plain ids (Gumbel coupling, `seeded_sampling`, `seed`;
   * stop token excluded) with the top two [id, race score] of each step (a race score −∞ is null in the file). */
  chats: { messages: ChatMessage[]; prompt: string | null; ids: number[]; greedy: number[]; gaps: number[];
    greedy_top2: Top2[]; seed: number; seeded: number[]; seeded_top2: Top2[];
    replay?: ReplayRecord }[];
  /** The target's rows ([ids, values]: the top entries, largest first) on the first chat's prompt: a tree verify
   * (`tokens` with `parents`, the root the prompt's last token), the two-token run `after` once the accepted
   * `path` (node indices) is kept by a scattered crop, and on a fresh cache the run `frontier` whose mask hides
   * the past slots `hidden`. Absent in vectors written before graph format 4. */
  tree?: { parents: number[]; tokens: number[]; depth: number[]; rows: [number[], number[]][]; path: number[];
    after: number[]; after_rows: [number[], number[]][]; hidden: number[]; frontier: number[];
    frontier_rows: [number[], number[]][] };
}

export function loadVectors(): Vectors[] {
  const spec = process.env.EDGESPEC_VECTORS;
  if (!spec) return [];
  const files = spec.split(path.delimiter).filter(Boolean).flatMap((p) =>
    statSync(p).isDirectory() ? readdirSync(p).filter((f) => f.endsWith(".json")).sort().map((f) => path.join(p, f)) : [p]);
  const inf = (t: Top2[]) => t.map((pair) => pair.map(([id, x]) => [id, x ?? -Infinity])) as Top2[]; // null: −∞
  return files.map((file) => {
    const v = { file, ...JSON.parse(readFileSync(file, "utf8")) } as Vectors;
    for (const c of v.chats) Object.assign(c, { greedy_top2: inf(c.greedy_top2), seeded_top2: inf(c.seeded_top2) });
    return v;
  });
}

export const NO_VECTORS = "no test vectors: set EDGESPEC_VECTORS (pytest tests/test_android_core.py --android-core does)";

/** Index of the first difference of a and b (length mismatch counts), or null. */
export function firstDifference(a: readonly number[], b: readonly number[]): number | null {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? null : Math.min(a.length, b.length);
}
