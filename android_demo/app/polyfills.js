// What Hermes (React Native 0.76) lacks and the core needs; index.js imports this before anything else.
// - TextDecoder: Hermes has TextEncoder only, and @huggingface/tokenizers decodes bytes with TextDecoder.
//   @bacons/text-decoder gives the WHATWG decoder's output on every split of multi-byte text (a truncated
//   character is one U+FFFD), which the streaming detokenizer relies on (android_demo/README.md).
// - Symbol.asyncIterator: Hermes has none, so `for await (const piece of generation)` threw "Object is not
//   async iterable" (found by the Hermes tier); Babel's async-iteration helpers use it once it is defined.
import "@bacons/text-decoder/install";

if (typeof Symbol.asyncIterator !== "symbol")
  Object.defineProperty(Symbol, "asyncIterator", { value: Symbol.for("Symbol.asyncIterator") });
