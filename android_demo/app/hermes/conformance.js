// The core's conformance suite (../core/test/conformance/suite.ts) as a Hermes program: Metro bundles it
// with the app's config and Babel preset, React Native's hermesc compiles it, a Hermes VM runs it and prints
// one JSON line per input. tests/test_android_core.py writes hermes/build/inputs.json first (the export's
// text files and the Python runtime's vectors: a Hermes VM has no file system) and compares the printed
// results with Node's on the same inputs.
import "../polyfills"; // first, as in index.js: Hermes has no TextDecoder and no Symbol.asyncIterator
import { runConformance } from "../../core/test/conformance/suite";

const inputs = require("./build/inputs.json");
const out = globalThis.print ?? console.log;

(async () => {
  for (const input of inputs) out(`RESULT ${JSON.stringify(await runConformance(input))}`);
  out("DONE");
})().catch((e) => out(`ERROR ${e && e.stack ? e.stack : String(e)}`));
