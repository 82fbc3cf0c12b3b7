/**
 * Tokenizer, chat template and streaming detokenization (the TypeScript twin of edgespec/io/text.py), on
 * `@huggingface/tokenizers` (reads the export's tokenizer.json) and `@huggingface/jinja` (renders its chat
 * template with Jinja's trim_blocks/lstrip_blocks, as the Python runtime's sandboxed environment).
 */
import { Template } from "@huggingface/jinja";
import { Tokenizer } from "@huggingface/tokenizers";
import { EdgespecError } from "./errors.js";
import { firstLine } from "./ort.js";

export interface ChatMessage {
  role: string;
  content: string;
}

/**
 * Added tokens that Qwen2.5's own tokenizer configuration marks `"special": false` (text when decoded), while a
 * GGUF marks the six FIM/repository ones CONTROL: decoding keeps them, as edgespec/io/text.py's TEXT_TOKENS.
 */
export const TEXT_TOKENS: ReadonlySet<string> = new Set(["<tool_call>", "</tool_call>", "<|fim_prefix|>",
  "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]);

/** The export's tokenizer: ids are plain numbers; special tokens are added on encode only when asked (a raw prompt). */
export class TextTokenizer {
  private readonly tok: Tokenizer;
  private readonly control: ReadonlySet<number>; // special added tokens that decoding drops

  /** `json`: the text of tokenizer.json. Throws EdgespecError if the tokenizer library cannot read it. */
  constructor(json: string, where = "tokenizer.json") {
    try {
      this.tok = new Tokenizer(JSON.parse(json), { clean_up_tokenization_spaces: false });
    } catch (e) {
      throw new EdgespecError(`${where}: cannot load tokenizer (${firstLine(e)})`);
    }
    const control = new Set<number>();
    for (const [id, t] of this.tok.get_added_tokens_decoder()) if (t.special && !TEXT_TOKENS.has(t.content)) control.add(id);
    this.control = control;
  }

  /** Token ids of `text` (control tokens such as `<|fim_prefix|>` map to their single id); with `addSpecial`, the
   * tokens the tokenizer puts around a text too (Gemma's and Llama 3's `<bos>`; none for Qwen), as for a raw prompt. */
  encode(text: string, addSpecial = false): number[] {
    return this.tok.encode(text, { add_special_tokens: addSpecial }).ids;
  }

  /** Text of `ids`; control tokens are dropped (TEXT_TOKENS kept) unless `skipSpecialTokens` is false. */
  decode(ids: readonly number[], skipSpecialTokens = true): string {
    const kept = skipSpecialTokens ? ids.filter((i) => !this.control.has(i)) : [...ids];
    if (!kept.length) return "";
    return this.tok.decode(kept, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
  }

  /**
   * 1 + the largest id of the real vocabulary (added tokens included). Filler entries at the top that only
   * pad the vocabulary to the model's head width (`[PAD151665]` … in a GGUF-converted Qwen tokenizer, each
   * named after its own id) are not tokens (as edgespec/io/integrity.py's tokenizer_width).
   */
  width(): number {
    const byId = new Map<number, string>();
    let top = -1;
    for (const [t, i] of this.tok.get_vocab(true)) {
      byId.set(i, t);
      if (i > top) top = i;
    }
    while (top >= 0 && byId.get(top) === `[PAD${top}]`) top--;
    return top + 1;
  }

  /** The first added (control) token whose text occurs in `text`, or null. */
  controlTokenIn(text: string): string | null {
    for (const t of this.tok.get_added_tokens_decoder().values()) if (t.content && text.includes(t.content)) return t.content;
    return null;
  }

  idToToken(id: number): string | undefined {
    return this.tok.id_to_token(id);
  }

  tokenToId(token: string): number | undefined {
    return this.tok.token_to_id(token);
  }
}

/** A Hugging Face style Jinja chat template. */
export class ChatTemplate {
  private readonly template: Template;

  /** Throws EdgespecError if the template does not parse. */
  constructor(source: string, readonly bosToken = "", readonly eosToken = "") {
    try {
      this.template = new Template(source);
    } catch (e) {
      throw new EdgespecError(`cannot parse the chat template (${firstLine(e)})`);
    }
  }

  /** The prompt text for `messages`, ending with the assistant's turn header when `addGenerationPrompt`. */
  render(messages: readonly ChatMessage[], addGenerationPrompt = true): string {
    try {
      return this.template.render({
        messages: messages.map((m) => ({ role: m.role, content: m.content })),
        add_generation_prompt: addGenerationPrompt, bos_token: this.bosToken, eos_token: this.eosToken,
      });
    } catch (e) {
      throw new EdgespecError(`the chat template refused these messages (${firstLine(e)})`);
    }
  }
}

/**
 * Turns a growing token list into text pieces without ever emitting a partial UTF-8 character.
 *
 * Keeps a short window of already-emitted tokens as context (byte-level BPE decoders depend on neighbours),
 * decodes window+new, and emits only the part past the already-emitted text once it no longer ends in
 * U+FFFD. The concatenation of all pieces equals `decode(all tokens)`.
 */
export class IncrementalDetokenizer {
  private ids: number[] = [];
  private prefix = 0; // start of the context window
  private read = 0; // tokens whose text has been emitted

  constructor(private readonly tok: TextTokenizer, private readonly skipSpecialTokens = true) {}

  /** Add token ids; returns the newly completed text (possibly empty). */
  push(ids: readonly number[]): string {
    this.ids.push(...ids);
    const done = this.tok.decode(this.ids.slice(this.prefix, this.read), this.skipSpecialTokens);
    const full = this.tok.decode(this.ids.slice(this.prefix), this.skipSpecialTokens);
    if (full.length > done.length && !full.endsWith("\ufffd")) {
      this.prefix = this.read;
      this.read = this.ids.length;
      return full.slice(done.length);
    }
    return "";
  }

  /** Whatever is left (a trailing invalid byte sequence decodes as U+FFFD, as in a full decode). */
  flush(): string {
    const done = this.tok.decode(this.ids.slice(this.prefix, this.read), this.skipSpecialTokens);
    const full = this.tok.decode(this.ids.slice(this.prefix), this.skipSpecialTokens);
    this.prefix = this.read = this.ids.length;
    return full.slice(done.length);
  }
}
