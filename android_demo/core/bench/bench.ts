/**
 * Node side of scripts/bench_node_vs_python.py: runs the core on token-id prompts in the given modes and
 * prints one JSON line per generation (tok/s, alpha, mean K). Reads its job as JSON from argv[2]:
 * {"export_dir", "prompts": [[ids]], "modes": ["plain", "k4", "adaptive"], "max_new_tokens", "threads"}.
 */
import { AdaptiveK, calibrate } from "../src/adaptive.js";
import { generate } from "../src/generation.js";
import { loadNodeDecoder } from "../src/node.js";

interface Job { export_dir: string; prompts: number[][]; modes: string[]; max_new_tokens: number; threads?: number }

const job = JSON.parse(process.argv[2]) as Job;
const dec = await loadNodeDecoder(job.export_dir, { threads: job.threads });
const cost = job.modes.includes("adaptive") ? await calibrate(dec.target, dec.draft!, 6) : null;
// warm-up: a session's first runs are slower
await generate(dec, { inputIds: job.prompts[0], maxNewTokens: 4, mode: "plain" }).run();
dec.reset();
for (const [i, ids] of job.prompts.entries()) {
  for (const mode of job.modes) {
    dec.reset();
    const k = mode === "adaptive" ? new AdaptiveK(cost!, { kMax: 6 }) : mode === "plain" ? 0 : Number(mode.slice(1));
    const g = await generate(dec, { inputIds: ids, maxNewTokens: job.max_new_tokens, k, mode: mode === "plain" ? "plain" : "spec" }).run();
    const s = g.stats;
    console.log(JSON.stringify({ runtime: "node", prompt: i, mode, new_tokens: s.newTokens, tokens_per_s: s.tokensPerS,
      decode_tokens_per_s: s.decodeTokensPerS, alpha: s.alpha, mean_k: s.meanK, wall_ms: s.wallMs, token_ids: g.tokenIds }));
  }
}
