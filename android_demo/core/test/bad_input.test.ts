/**
 * Tier (e): bad input rejects with one clear EdgespecError, never a native crash: a missing or corrupt
 * graph, a manifest of another format version, an empty prompt, a prompt over the context, bad options.
 * Runs on the first export under 100 MB among the vectors (each case edits a copy of it in a temporary directory),
 * the graph-format-4 cases on the first such export of graph format 4, and the kv_cache cases on every tiny
 * export of graph format 3 (float32 and int8 caches).
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
const target = (dir: string) => JSON.parse(readFileSync(path.join(dir, "edgespec.json"), "utf8")).target;
const graphFormat = (dir: string) => (target(dir).graph_format as number | undefined) ?? 2;
const tiny4 = vectors.filter((v) => v.export_bytes < 100e6 && graphFormat(v.export_dir) === 4).slice(0, 1);
const tiny3 = vectors.filter((v) => v.export_bytes < 100e6 && graphFormat(v.export_dir) === 3);
if (!vectors.length) test("bad input", { skip: NO_VECTORS }, () => {});

/** A copy of `exportDir` edited in a temporary directory, and the check that loading one rejects with one line. */
function fixtures(exportDir: string) {
  const root = mkdtempSync(path.join(tmpdir(), "edgespec-core-"));
  after(() => rmSync(root, { recursive: true, force: true }));
  const copy = (name: string, edit: (dir: string) => void): string => {
    const dir = path.join(root, name);
    cpSync(exportDir, dir, { recursive: true });
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
  return { root, copy, rejects };
}

for (const v of tiny) {
  describe(`bad input on ${v.export_dir}`, () => {
    const { root, copy, rejects } = fixtures(v.export_dir);

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
      await rejects(copy("graph5", edit((m) => ({ ...m, draft: { ...(m.draft as object), graph_format: 5 } }))),
        /draft\.graph_format is 5; this edgespec core reads graph formats up to 4/);
      // a manifest that claims the other graph format than its graph has
      const other = (m: Record<string, unknown>) => ((m.target as { graph_format?: number }).graph_format ?? 2) >= 3 ? 2 : 3;
      await rejects(copy("mismatch", edit((m) => ({ ...m, target: { ...(m.target as object), graph_format: other(m) } }))),
        /does not match the manifest|failed to run|cannot load|input_names lacks/);
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

for (const v of tiny4) {
  describe(`bad graph-format-4 export on ${v.export_dir}`, () => {
    const { copy, rejects } = fixtures(v.export_dir);
    type Graph = { input_names: string[]; output_names: string[]; num_layers: number; head_dim: number; vocab_size: number;
      graph_format: number };
    const editTarget = (name: string, f: (g: Graph) => void) => copy(name, (d) => {
      const p = path.join(d, "edgespec.json");
      const m = JSON.parse(readFileSync(p, "utf8"));
      f(m.target);
      writeFileSync(p, JSON.stringify(m));
    });

    test("the export loads and runs", async () => {
      const dec = await loadNodeDecoder(v.export_dir);
      assert.equal(dec.target.spec.graph_format, 4);
      assert.equal(dec.tcache.grouped, true);
    });

    test("a missing or unlisted input, a missing present output: one clear error", async () => {
      await rejects(editTarget("nopast", (g) => { g.input_names = g.input_names.filter((n) => n !== "past_key_values.1.value.1"); }),
        /target\.input_names lacks past_key_values\.1\.value\.1 \(not an edgespec graph of graph format 4\)/);
      await rejects(editTarget("nopresent", (g) => { g.output_names = ["logits"]; }), /target\.output_names lacks present/);
      // the manifest says one more layer than the graph has: the graph lacks that layer's inputs
      await rejects(editTarget("layers", (g) => {
        g.num_layers += 1;
        g.input_names.push(...[0, 1].flatMap((h) => [`past_key_values.${g.num_layers - 1}.key.${h}`, `past_key_values.${g.num_layers - 1}.value.${h}`]));
      }), /the target graph does not match the manifest \(no past_key_values\.\d\.key\.0/);
      // the manifest says format 3 (per-layer past names) for this format-4 graph
      await rejects(editTarget("as3", (g) => { g.graph_format = 3; }), /target\.input_names lacks past_key_values\.0\.key, /);
      await rejects(editTarget("as3names", (g) => {
        g.graph_format = 3;
        g.input_names = ["input_ids", "position_ids", "attention_mask", ...Array.from({ length: g.num_layers }, (_, i) =>
          [`past_key_values.${i}.key`, `past_key_values.${i}.value`]).flat()];
        g.output_names = ["logits", ...Array.from({ length: g.num_layers }, (_, i) => [`present.${i}.key`, `present.${i}.value`]).flat()];
      }), /the target graph does not match the manifest \(no past_key_values\.0\.key, /);
    });

    test("shapes the manifest gets wrong: head_dim, vocab_size", async () => {
      await rejects(editTarget("headdim", (g) => { g.head_dim *= 2; }),
        /past_key_values\.0\.key\.0 has \d+ where the manifest's head_dim is \d+/);
      await rejects(editTarget("vocab", (g) => { g.vocab_size += 1; }), /logits has \d+ where the manifest's vocab_size is \d+/);
    });
  });
}

for (const v of tiny3) {
  const kv = (target(v.export_dir).kv_cache as string | undefined) ?? "float32";
  describe(`kv_cache on the graph-format-3 export ${v.export_dir} (${kv})`, () => {
    const { copy, rejects } = fixtures(v.export_dir);
    const editTarget = (name: string, f: (g: Record<string, unknown>) => void) => copy(name, (d) => {
      const p = path.join(d, "edgespec.json");
      const m = JSON.parse(readFileSync(p, "utf8"));
      f(m.target);
      writeFileSync(p, JSON.stringify(m));
    });

    test("the export loads with buffers of its kv_cache type", async () => {
      const dec = await loadNodeDecoder(v.export_dir, { loadDraft: false });
      assert.equal(dec.target.spec.kv_cache, kv);
      assert.ok(dec.tcache.tensors.every((t) => t instanceof (kv === "int8" ? Int8Array : Float32Array)));
    });

    test("a manifest whose kv_cache is not the graph's, or not a cache type: one clear error", async () => {
      const other = kv === "int8" ? "float32" : "int8";
      await rejects(editTarget("other", (g) => { g.kv_cache = other; }), new RegExp(
        `the target graph does not match the manifest \\(it takes past_key_values\\.0\\.key as ${kv}, the manifest's kv_cache is ${other}; export again\\)`));
      await rejects(editTarget("fp8", (g) => { g.kv_cache = "fp8"; }), /target\.kv_cache must be one of float32, int8, got "fp8"/);
    });
  });
}
