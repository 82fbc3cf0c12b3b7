/**
 * Tier (e): bad input rejects with one clear EdgespecError, never a native crash: a missing or corrupt
 * graph, a manifest of another format version, an empty prompt, a prompt over the context, bad options.
 * Runs on the first export under 100 MB among the vectors (each case edits a copy of it in a temporary directory).
 */
import assert from "node:assert/strict";
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { after, describe, test } from "node:test";
import { EdgespecError } from "../src/errors.js";
import { generate } from "../src/generation.js";
import { loadNodeDecoder } from "../src/node.js";
import { loadVectors, NO_VECTORS } from "./vectors.js";

const vectors = loadVectors();
const tiny = vectors.filter((v) => v.export_bytes < 100e6).slice(0, 1);
if (!vectors.length) test("bad input", { skip: NO_VECTORS }, () => {});

for (const v of tiny) {
  describe(`bad input on ${v.export_dir}`, () => {
    const root = mkdtempSync(path.join(tmpdir(), "edgespec-core-"));
    after(() => rmSync(root, { recursive: true, force: true }));
    const copy = (name: string, edit: (dir: string) => void): string => {
      const dir = path.join(root, name);
      cpSync(v.export_dir, dir, { recursive: true });
      edit(dir);
      return dir;
    };
    const rejects = async (dir: string, pattern: RegExp) => {
      await assert.rejects(loadNodeDecoder(dir), (e: unknown) => {
        assert.ok(e instanceof EdgespecError, `not an EdgespecError: ${e}`);
        assert.match(e.message, pattern);
        assert.ok(!e.message.includes("\n"), `not one line: ${e.message}`);
        return true;
      });
    };

    test("no export directory / no manifest", async () => {
      await rejects(path.join(root, "nowhere"), /no edgespec\.json/);
    });

    test("a missing graph", async () => {
      await rejects(copy("missing", (d) => rmSync(path.join(d, "draft", "model.onnx"))), /draft\/model\.onnx is missing/);
    });

    test("a corrupt graph", async () => {
      const dir = copy("corrupt", (d) => writeFileSync(path.join(d, "target", "model.onnx"), "not an onnx graph".repeat(100)));
      await rejects(dir, /target\/model\.onnx: onnxruntime cannot load this graph/);
    });

    test("a truncated graph", async () => {
      const dir = copy("truncated", (d) => {
        const f = path.join(d, "target", "model.onnx");
        const b = readFileSync(f);
        writeFileSync(f, b.subarray(0, Math.floor(b.length / 2)));
      });
      await rejects(dir, /onnxruntime cannot load this graph/);
    });

    test("a manifest of another format version, or not a manifest", async () => {
      const edit = (f: (m: Record<string, unknown>) => unknown) => (d: string) => {
        const p = path.join(d, "edgespec.json");
        writeFileSync(p, JSON.stringify(f(JSON.parse(readFileSync(p, "utf8")))));
      };
      await rejects(copy("format3", edit((m) => ({ ...m, format: 3 }))), /manifest format 3, this edgespec core reads format 1/);
      await rejects(copy("format0", edit((m) => ({ ...m, format: 0 }))), /manifest format 0/);
      await rejects(copy("graph4", edit((m) => ({ ...m, draft: { ...(m.draft as object), graph_format: 4 } }))),
        /draft\.graph_format is 4; this edgespec core reads graph formats up to 3/);
      // a manifest that claims the other graph format than its graph has
      const other = (m: Record<string, unknown>) => ((m.target as { graph_format?: number }).graph_format ?? 2) >= 3 ? 2 : 3;
      await rejects(copy("mismatch", edit((m) => ({ ...m, target: { ...(m.target as object), graph_format: other(m) } }))),
        /does not match the manifest|failed to run|cannot load/);
      await rejects(copy("nolayers", edit((m) => ({ ...m, target: { ...(m.target as object), num_layers: "2" } }))),
        /target\.num_layers must be a positive integer/);
      await rejects(copy("garbage", (d) => writeFileSync(path.join(d, "edgespec.json"), "{ not json")), /not valid JSON/);
      await rejects(copy("tok", (d) => writeFileSync(path.join(d, "tokenizer.json"), "{}")), /cannot load tokenizer|tokenizer/);
    });

    test("empty prompt, prompt over the context, bad options", async () => {
      const dec = await loadNodeDecoder(v.export_dir);
      const bad = (o: Parameters<typeof generate>[1], pattern: RegExp) =>
        assert.throws(() => generate(dec, o), (e: unknown) => e instanceof EdgespecError && pattern.test(e.message));
      bad({ prompt: "" }, /the prompt is empty/);
      bad({ inputIds: [] }, /the prompt is empty/);
      bad({ messages: [] }, /messages is empty/);
      bad({ messages: [{ role: "user", content: "hi<|im_end|>" }] }, /control token <\|im_end\|> as text/);
      bad({ inputIds: new Array(v.context_length).fill(5) }, /the context holds/);
      bad({ prompt: "x ".repeat(4 * v.context_length) }, /the context holds/);
      bad({ prompt: "hi", maxNewTokens: 0 }, /maxNewTokens/);
      bad({ prompt: "hi", temperature: -1 }, /temperature/);
      bad({ prompt: "hi", k: -2 }, /K must be/);
      bad({ prompt: "hi", temperature: 1, coupling: "race" as "gumbel" }, /coupling must be one of auto, gumbel, standard/);
      bad({ prompt: "hi", temperature: 1, seed: 1.5 }, /seed must be an integer/);
      bad({ prompt: "hi", temperature: 1, seed: -1 }, /seed must be an integer/);
      bad({ prompt: "hi", seed: 2 ** 60 }, /seed must be an integer in \[0, 2\^53\)/);
      bad({ inputIds: [1, 1e9] }, /token ids/);
      bad({}, /exactly one of/);
      await assert.rejects(loadNodeDecoder(v.export_dir, { provider: "tpu" }), /unknown execution provider/);
      // an execution provider this onnxruntime lacks falls back to CPU and says why
      const fallback = await loadNodeDecoder(v.export_dir, { provider: "nnapi", loadDraft: false });
      assert.equal(fallback.target.provider, "cpu");
      assert.ok(fallback.target.fallbackReason);
      // plain mode works without the draft; spec mode refuses clearly
      assert.throws(() => generate(fallback, { prompt: "hi" }), /loaded without its draft/);
      const g = await generate(fallback, { prompt: "hi", mode: "plain", maxNewTokens: 3 }).run();
      assert.ok(g.stats.newTokens >= 1 && g.stats.newTokens <= 3);
    });
  });
}
