/**
 * The conformance suite (conformance/suite.ts) on Node against the Python runtime's vectors: the replayed
 * speculative loop (K = 1, 3 and adaptive, graphs replayed from the Python runtime's logits) gives the
 * Python runtime's greedy ids exactly, and the tokenizer, template and detokenizer results are the Python
 * ones. With EDGESPEC_CONFORMANCE_OUT set, writes `<name>.input.json` (what the Hermes run needs) and
 * `<name>.node.json` (this engine's result) there, for tests/test_android_core.py's Hermes comparison.
 */
import assert from "node:assert/strict";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import { describe, test } from "node:test";
import { MANIFEST_NAME, parseManifest } from "../src/manifest.js";
import { runConformance, type ConformanceInput } from "./conformance/suite.js";
import { loadVectors, NO_VECTORS } from "./vectors.js";

const all = loadVectors();
if (!all.length) test("conformance", { skip: NO_VECTORS }, () => {});

/** The suite's input for one vectors file: the export's text files and the vectors the suite uses. */
function conformanceInput(v: ReturnType<typeof loadVectors>[number]): ConformanceInput {
  const read = (rel: string) => readFileSync(path.join(v.export_dir, rel), "utf8");
  const manifest = read(MANIFEST_NAME);
  const m = parseManifest(manifest);
  const texts: Record<string, string> = { [MANIFEST_NAME]: manifest, [m.tokenizer]: read(m.tokenizer) };
  if (m.chat_template !== null) texts[m.chat_template] = read(m.chat_template);
  return { name: path.basename(v.file, ".json"), texts, corpus: v.corpus.map(({ text }) => ({ text })),
    control_tokens: v.control_tokens, chats: v.chats };
}

for (const v of all) {
  describe(`conformance ${path.basename(v.file)}`, () => {
    test("replayed loop, tokenizer, template and streaming equal the Python runtime's", async () => {
      const input = conformanceInput(v);
      if (!input.chats.some((c) => c.replay)) assert.fail(`${v.file} has no replay record (make_vectors.py writes one)`);
      const r = await runConformance(input);
      r.tokenizer.forEach((t, i) => {
        const c = v.corpus[i];
        assert.deepEqual(t.ids, c.ids, JSON.stringify(c.text));
        assert.equal(t.decoded, c.decoded);
        assert.equal(t.decodedSkip, c.decoded_skip_special);
        assert.equal(t.pieces.join(""), c.decoded_skip_special);
      });
      for (const [tok, id] of Object.entries(v.control_tokens)) assert.deepEqual(r.control[tok], [id], tok);
      r.template.forEach((t, i) => {
        assert.equal(t.prompt, v.chats[i].prompt);
        assert.deepEqual(t.ids, v.chats[i].ids);
      });
      assert.equal(r.replay.length, 4 * v.chats.filter((c) => c.replay).length);
      for (const run of r.replay) {
        const want = v.chats[run.chat].greedy.filter((t) => !v.stop.includes(t));
        const what = `chat ${run.chat} K=${run.k}`;
        assert.deepEqual(run.ids, want, `${what}: the replayed loop's ids are not Python's greedy ids`);
        assert.equal(run.chunks.map(([t]) => t).join(""), run.text, what);
        assert.ok(run.stats.invariants, `${what}: stats invariants ${JSON.stringify(run.stats)}`);
        if (run.k !== "auto") assert.ok(run.stats.proposed! > 0 && run.counts!.draft.runs > 0, `${what}: nothing was drafted`);
        if (run.k === "mixed") assert.ok(run.stats.plainSteps! > 0, `${what}: no plain step`);
        assert.equal(run.draftMisses, 0, `${what}: the draft proposed from a prefix the Python runtime never recorded`);
        if (v.draft_is_target && run.k !== "auto") assert.equal(run.stats.accepted, run.stats.proposed, what);
        if (run.k === "auto") assert.ok(run.stats.kPerRound === null && run.chunks.every(([, d]) => d === null), what);
      }
      assert.deepEqual(r.stop, { stopReason: "aborted", busy: false, chunks: 1 });
      assert.ok(r.sampler.draws.every((x) => r.sampler.probs[1][x] > 0));
      const out = process.env.EDGESPEC_CONFORMANCE_OUT;
      if (out) {
        mkdirSync(out, { recursive: true });
        writeFileSync(path.join(out, `${input.name}.input.json`), JSON.stringify(input));
        writeFileSync(path.join(out, `${input.name}.node.json`), JSON.stringify(r));
      }
    });
  });
}
