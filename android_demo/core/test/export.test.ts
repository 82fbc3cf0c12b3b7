/**
 * Tiers (b)–(d) on real exports: the core against the Python runtime's test vectors (tokenizer, chat
 * template, plain greedy ids), speculative greedy against plain greedy, KV reuse across turns, streaming,
 * seeded sampling (draft = target accepts everything; the first token's histogram follows p).
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { AdaptiveK, calibrate } from "../src/adaptive.js";
import type { SpecDecoder } from "../src/decoder.js";
import { ChatSession, DEFAULT_SETTINGS } from "../src/chat.js";
import { firstTokenCheck, greedyCheck, plainGreedyWithGaps } from "../src/evaluate.js";
import { generate } from "../src/generation.js";
import { loadNodeDecoder } from "../src/node.js";
import { samplingParams } from "../src/sampling.js";
import { IncrementalDetokenizer } from "../src/text.js";
import { firstDifference, loadVectors, NO_VECTORS } from "./vectors.js";

const all = loadVectors();
if (!all.length) test("export tests", { skip: NO_VECTORS }, () => {});

for (const v of all) {
  describe(`export ${v.export_dir}`, () => {
    let dec: SpecDecoder;
    before(async () => { dec = await loadNodeDecoder(v.export_dir); });
    after(() => dec?.reset());

    test("tokenizer: same ids as the Python tokenizer on the corpus, and decodes back", () => {
      for (const c of v.corpus) {
        assert.deepEqual(dec.tokenizer.encode(c.text), c.ids, JSON.stringify(c.text));
        assert.equal(dec.tokenizer.decode(c.ids, false), c.decoded);
        assert.equal(dec.tokenizer.decode(c.ids, true), c.decoded_skip_special);
      }
      for (const [tok, id] of Object.entries(v.control_tokens)) assert.deepEqual(dec.tokenizer.encode(tok), [id], tok);
    });

    test("streaming detokenizer: pieces join to the full decode, never a partial character", () => {
      for (const c of v.corpus) {
        const d = new IncrementalDetokenizer(dec.tokenizer);
        const pieces = [...c.ids.map((i) => d.push([i])), d.flush()];
        assert.equal(pieces.join(""), c.decoded_skip_special);
        if (!c.decoded_skip_special.includes("\ufffd")) assert.ok(pieces.every((p) => !p.includes("\ufffd")));
      }
    });

    test("chat template: the same prompt text and ids as the Python runtime", () => {
      for (const c of v.chats) {
        if (c.prompt !== null) assert.equal(dec.template!.render(c.messages), c.prompt);
        assert.deepEqual(dec.encode(c.prompt !== null ? { messages: c.messages } : { prompt: c.messages.at(-1)!.content }), c.ids);
      }
    });

    test("plain greedy ids equal the Python runtime's (up to its near-tie rule)", async () => {
      for (const c of v.chats) {
        const js = await plainGreedyWithGaps(dec, c.ids, v.new_tokens);
        const div = firstDifference(js.ids, c.greedy);
        assert.ok(div === null || c.gaps[div] < v.near_tie_logit_gap,
          `first divergence at ${div}: python top-1/top-2 gap ${c.gaps[div!]} (python ${c.greedy}, core ${js.ids})`);
      }
    });

    test("speculative greedy equals plain greedy (fixed K and adaptive K)", async () => {
      for (const [i, c] of v.chats.entries()) {
        for (const k of [1, 3]) {
          const r = await greedyCheck(dec, c.ids, v.new_tokens, k);
          const nearTie = r.plainGap !== null && r.plainGap < v.near_tie_logit_gap;
          assert.ok(r.identical || nearTie, `chat ${i} K=${k}: divergence at ${r.firstDivergence}, gap ${r.plainGap}`);
          const s = r.stats;
          assert.ok(s.proposed > 0 && s.accepted <= s.evaluated && s.evaluated <= s.proposed);
          assert.ok(s.newTokens <= 1 + s.accepted + s.corrections + s.bonus + s.plainSteps);
          if (v.draft_is_target) assert.equal(s.accepted, s.evaluated);
        }
      }
      const cost = await calibrate(dec.target, dec.draft!, 4, 32, 2);
      assert.ok(cost.verifyMs.length === 5 && cost.verifyMs.every((t) => t > 0) && cost.draftMs > 0);
      const c = v.chats[0];
      dec.reset();
      const plain = await plainGreedyWithGaps(dec, c.ids, v.new_tokens);
      dec.reset();
      const g = await generate(dec, { inputIds: c.ids, maxNewTokens: v.new_tokens, k: new AdaptiveK(cost, { kMax: 4 }) }).run();
      const div = firstDifference(g.tokenIds, plain.ids.filter((t) => !v.stop.includes(t)));
      assert.ok(div === null || plain.gaps[div] < v.near_tie_logit_gap, `adaptive K: divergence at ${div}`);
      assert.equal(g.stats.kPerRound.length, g.stats.rounds);
    });

    test("KV reuse across turns: the second turn equals a fresh run and reuses the first turn's cache", async () => {
      const turn1 = [{ role: "user", content: "def add(a, b):" }];
      dec.reset();
      const a = await generate(dec, { messages: turn1, maxNewTokens: 8, k: 2 }).run();
      const turn2 = [...turn1, { role: "assistant", content: a.text }, { role: "user", content: "and subtract?" }];
      const b = await generate(dec, { messages: turn2, maxNewTokens: 8, k: 2 }).run();
      assert.ok(b.stats.reusedTokens > dec.encode({ messages: turn1 }).length - 2, `reused ${b.stats.reusedTokens}`);
      dec.reset();
      const fresh = await generate(dec, { messages: turn2, maxNewTokens: 8, k: 2 }).run();
      assert.equal(fresh.stats.reusedTokens, 0);
      const div = firstDifference(b.tokenIds, fresh.tokenIds);
      assert.equal(div, null, `turn 2 after reuse ${b.tokenIds} vs fresh ${fresh.tokenIds}`);
    });

    test("chat session: turns with KV reuse, adaptive K from a cost model, a stopped reply kept", async () => {
      const chat = new ChatSession(dec, "You are terse.");
      assert.throws(() => chat.send("hi", DEFAULT_SETTINGS), /calibrate first/);
      assert.throws(() => chat.send("  ", { ...DEFAULT_SETTINGS, k: 2 }), /the message is empty/);
      chat.setCostModel(await calibrate(dec.target, dec.draft!, 4, 32, 2));
      const g1 = chat.send("def add(a, b):", { ...DEFAULT_SETTINGS, maxNewTokens: 6 });
      const pieces: string[] = [];
      for await (const c of g1.chunks()) pieces.push(c.text);
      chat.finish(g1);
      assert.equal(pieces.join(""), g1.text);
      assert.deepEqual(chat.messages.map((m) => m.role), ["system", "user", "assistant"]);
      const g2 = chat.send("and subtract?", { ...DEFAULT_SETTINGS, k: 3, maxNewTokens: 20, latencyBudgetMs: 1e6 });
      for await (const _ of g2.chunks()) break; // the Stop button
      chat.finish(g2);
      assert.ok(g2.stats.reusedTokens > 0);
      assert.equal(g2.stats.stopReason, "aborted");
      assert.equal(chat.messages.length, 5);
      chat.reset();
      assert.deepEqual(chat.messages.map((m) => m.role), ["system"]);
      assert.equal(dec.tokens.length, 0);
      const long = "word ".repeat(v.context_length * 2);
      assert.throws(() => chat.send(long, { ...DEFAULT_SETTINGS, k: 2 }), /the context holds/);
      assert.equal(chat.messages.length, 1, "a refused message is not added");
    });

    test("streaming generation: text pieces, maxNewTokens, stats", async () => {
      dec.reset();
      const g = generate(dec, { prompt: "def add(a, b):", maxNewTokens: 10, k: 3, temperature: 0.8, topP: 0.95, seed: 1 });
      const pieces: string[] = [];
      for await (const piece of g) pieces.push(piece);
      assert.equal(pieces.join(""), g.text);
      assert.equal(g.text, dec.tokenizer.decode(g.tokenIds));
      assert.ok(g.tokenIds.length <= 10 && g.stats.newTokens <= 10);
      assert.ok(["stop_token", "max_new_tokens"].includes(g.stats.stopReason));
      assert.ok(g.stats.tokensPerS > 0 && g.stats.alpha >= 0 && g.stats.alpha <= 1);
      dec.reset();
      const again = await generate(dec, { prompt: "def add(a, b):", maxNewTokens: 10, k: 3, temperature: 0.8, topP: 0.95, seed: 1 }).run();
      assert.deepEqual(again.tokenIds, g.tokenIds, "same seed, same tokens");
      // stopping early: breaking out of the loop ends the generation and frees the decoder
      const h = generate(dec, { prompt: "def add(a, b):", maxNewTokens: 50, k: 2 });
      for await (const _ of h) break;
      assert.equal(h.stats.stopReason, "aborted");
      assert.equal(dec.busy, false);
    });

    test("seeded sampling: the first token of a round follows the target's p (TV < 3·noise + 0.01)", async () => {
      const ids = v.chats[1].ids;
      for (const sp of [samplingParams({ temperature: 0.8, topP: 0.95 }), samplingParams({ temperature: 1, topK: 20 })]) {
        const r = await firstTokenCheck(dec, ids, sp, v.sampling_draws, 3);
        assert.ok(r.tv < 3 * r.tvNoise + 0.01, `tv ${r.tv} vs noise ${r.tvNoise} (${JSON.stringify(sp)})`);
        if (v.draft_is_target) assert.equal(r.accepted, r.proposed, "draft == target: every proposal accepted");
      }
    });
  });
}
