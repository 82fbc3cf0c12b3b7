/** Tier (a) and the exports' own manifests: the app's transfer plan, size check and other-format errors. */
import assert from "node:assert/strict";
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { test } from "node:test";
import { MANIFEST_NAME, parseManifest } from "../src/manifest.js";
import { checkExportSizes, formatBytes, FREE_SPACE_MARGIN, notAnExport, planTransfer } from "../src/transfer.js";
import { loadVectors } from "./vectors.js";

const SHA = "a".repeat(64);
const graph = (p: string) => ({ path: p, architecture: "qwen2", num_layers: 1, num_kv_heads: 2, head_dim: 4, vocab_size: 10,
  context_length: 32, quantization: { precision: "fp32" }, source: "s", source_sha256: "x",
  input_names: ["input_ids", "position_ids", "attention_mask", "past_key_values.0.key", "past_key_values.0.value"],
  output_names: ["logits", "present.0.key", "present.0.value"] });
const FILES = { "target/model.onnx": { size: 1000, sha256: SHA }, "target/model.onnx.data": { size: 2e9, sha256: SHA },
  "draft/model.onnx": { size: 500, sha256: SHA }, "tokenizer.json": { size: 70, sha256: SHA } };
const manifest = (files: Record<string, unknown> | null = FILES) => parseManifest(JSON.stringify({ name: "n", format: 1,
  target: graph("target/model.onnx"), draft: graph("draft/model.onnx"), tokenizer: "tokenizer.json", chat_template: null,
  special_tokens: { bos: null, eos: 2, pad: 0, stop: [2] }, tokenizer_sha256: "y", edgespec_version: "0.1.0",
  ...(files ? { files } : {}) }));

test("formatBytes: decimal units", () => {
  assert.deepEqual([201, 557056, 1.8e9, 26.4e9].map(formatBytes), ["201 B", "557 kB", "1.8 GB", "26 GB"]);
});

test("manifest files: parsed with sizes; a bad entry or a path outside the export is refused", () => {
  assert.equal(manifest().files["target/model.onnx.data"].size, 2e9);
  assert.deepEqual(manifest(null).files, {});
  assert.throws(() => manifest({ "a.bin": { size: -1, sha256: SHA } }), /files\["a.bin"\] must be/);
  assert.throws(() => manifest({ "../x": { size: 1, sha256: SHA } }), /must be a path inside the export/);
  assert.throws(() => manifest([] as unknown as Record<string, unknown>), /files must be an object/);
});

test("planTransfer: every file, the manifest last; skips complete files; refuses what does not fit", () => {
  const m = manifest();
  const p = planTransfer(m, 3000, {}, null, "u");
  assert.deepEqual(p.files.map((f) => f.path), ["draft/model.onnx", "target/model.onnx", "target/model.onnx.data", "tokenizer.json", MANIFEST_NAME]);
  assert.equal(p.totalBytes, 1000 + 2e9 + 500 + 70 + 3000);
  const resumed = planTransfer(m, 3000, { "target/model.onnx.data": 2e9, "tokenizer.json": 69 }, null, "u");
  assert.deepEqual(resumed.fetch.map((f) => f.path), ["draft/model.onnx", "target/model.onnx", "tokenizer.json", MANIFEST_NAME]);
  assert.equal(resumed.fetchBytes, 1000 + 500 + 70 + 3000);
  assert.throws(() => planTransfer(m, 3000, {}, 1.5e9, "u"), /u: needs 2\.3 GB free .* the device has 1\.5 GB free/);
  assert.equal(planTransfer(m, 3000, {}, p.fetchBytes + FREE_SPACE_MARGIN, "u").fetch.length, 5);
  assert.throws(() => planTransfer(manifest(null), 3000, {}, null, "u"), /lists no files .* copy the folder with adb/);
  const { "draft/model.onnx": _, ...lacking } = FILES;
  assert.throws(() => planTransfer(manifest(lacking), 3000, {}, null, "u"), /file list lacks draft\/model.onnx/);
});

test("an int8 prefill graph (edgespec export --prefill-int8) is neither copied nor required on the device", async () => {
  const files = { ...FILES, "target/prefill.onnx": { size: 900, sha256: SHA }, "target/prefill.onnx.data": { size: 9e8, sha256: SHA } };
  const m = parseManifest(JSON.stringify({ ...JSON.parse(JSON.stringify(manifest())), files,
    target: { ...graph("target/model.onnx"), prefill_path: "target/prefill.onnx" } }));
  assert.equal(m.target.prefill_path, "target/prefill.onnx");
  assert.equal(manifest().target.prefill_path, null);
  const p = planTransfer(m, 3000, {}, null, "u");
  assert.deepEqual(p.files.map((f) => f.path), ["draft/model.onnx", "target/model.onnx", "target/model.onnx.data", "tokenizer.json", MANIFEST_NAME]);
  assert.equal(p.totalBytes, 1000 + 2e9 + 500 + 70 + 3000);
  const sizes: Record<string, number> = Object.fromEntries(Object.entries(FILES).map(([k, v]) => [k, v.size]));
  await checkExportSizes(m, async (rel) => sizes[rel] ?? null, "d");
  assert.throws(() => parseManifest(JSON.stringify({ ...JSON.parse(JSON.stringify(manifest())),
    target: { ...graph("target/model.onnx"), prefill_path: "../x.onnx" } })), /target.prefill_path must be a path inside/);
});

test("an int8 cache's scales for the float32 prefill (kv_scales) stay behind with the prefill graph", () => {
  const files = { ...FILES, "target/prefill.onnx": { size: 900, sha256: SHA }, "target/prefill.onnx.data": { size: 9e8, sha256: SHA },
    "target/kv_scales.npz": { size: 57000, sha256: SHA } };
  const m = parseManifest(JSON.stringify({ ...JSON.parse(JSON.stringify(manifest())), files,
    target: { ...graph("target/model.onnx"), prefill_path: "target/prefill.onnx", kv_cache: "int8",
      prefill_kv_cache: "float32", kv_scales: "target/kv_scales.npz", graph_format: 3 } }));
  assert.equal(m.target.kv_scales, "target/kv_scales.npz");
  assert.equal(manifest().target.kv_scales, null);
  assert.ok(!planTransfer(m, 3000, {}, null, "u").files.some((f) => f.path.endsWith("kv_scales.npz")));
  assert.throws(() => parseManifest(JSON.stringify({ ...JSON.parse(JSON.stringify(manifest())),
    target: { ...graph("target/model.onnx"), kv_scales: "/etc/x.npz" } })), /target.kv_scales must be a path inside/);
});

test("checkExportSizes: a missing or truncated file is named before loading", async () => {
  const m = manifest();
  const sizes: Record<string, number> = Object.fromEntries(Object.entries(FILES).map(([k, v]) => [k, v.size]));
  const sizeOf = async (rel: string) => sizes[rel] ?? null;
  await checkExportSizes(m, sizeOf, "d");
  sizes["target/model.onnx.data"] = 123456789;
  await assert.rejects(checkExportSizes(m, sizeOf, "d"),
    /d: target\/model.onnx.data is 123 MB \(123456789 bytes\), the manifest says 2\.0 GB \(2000000000 bytes\): an incomplete copy/);
  sizes["target/model.onnx.data"] = 2e9;
  delete sizes["tokenizer.json"];
  await assert.rejects(checkExportSizes(m, sizeOf, "d"), /d: tokenizer.json is missing/);
  await checkExportSizes(manifest(null), async (rel) => (rel.endsWith(".onnx") || rel === "tokenizer.json" ? 1 : null), "old");
});

test("notAnExport: names the other format, or lists what the folder holds", () => {
  const cases: [string[], RegExp][] = [
    [["genai_config.json", "model.onnx", "model.onnx.data"], /onnxruntime-genai model folder/],
    [["qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"], /a GGUF model \(llama\.cpp\)/],
    [["config.json", "model.safetensors", "tokenizer.json"], /a Hugging Face model folder/],
    [["model.pte"], /ExecuTorch/],
    [["model.onnx"], /an ONNX model without an edgespec manifest/],
    [["notes.txt", "a.png"], /no edgespec\.json; it holds notes\.txt, a\.png\)/],
    [[], /it holds nothing/],
  ];
  for (const [names, re] of cases) assert.match(notAnExport("/sdcard/x", names).message, re);
  assert.match(notAnExport("/sdcard/x", ["m.gguf"]).message, /^\/sdcard\/x: not an edgespec export .*`edgespec export`/);
});

for (const v of loadVectors()) {
  test(`transfer on ${path.basename(v.export_dir)}: the plan covers the files on disk; a truncated copy is caught`, async () => {
    const text = await fs.readFile(path.join(v.export_dir, MANIFEST_NAME), "utf8");
    const m = parseManifest(text);
    const plan = planTransfer(m, Buffer.byteLength(text), {}, null, v.export_dir);
    const onDisk = async (root: string, rel: string) => (await fs.stat(path.join(root, rel)).catch(() => null))?.size ?? null;
    for (const f of plan.files) assert.equal(await onDisk(v.export_dir, f.path), f.size, f.path);
    assert.ok(plan.totalBytes <= v.export_bytes);
    await checkExportSizes(m, (rel) => onDisk(v.export_dir, rel), v.export_dir);
    // a copy that stopped half-way through the largest file (the target's weights)
    const big = plan.files.filter((f) => f.path !== MANIFEST_NAME).sort((a, b) => b.size - a.size)[0];
    const partial = async (rel: string) => (rel === big.path ? Math.floor(big.size / 2) : onDisk(v.export_dir, rel));
    await assert.rejects(checkExportSizes(m, partial, "copy"), new RegExp(`copy: ${big.path.replace(/\./g, "\\.")} is .* an incomplete copy`));
    const have = Object.fromEntries(await Promise.all(plan.files.map(async (f) => [f.path, await partial(f.path)])));
    assert.deepEqual(planTransfer(m, Buffer.byteLength(text), have, null, "copy").fetch.map((f) => f.path), [big.path, MANIFEST_NAME]);
  });
}
