"""``edgespec`` command line: export, chat, generate, complete, serve, info (and bench/eval).

Every user error ends as one line on stderr and exit code 2 (1 for runtime failures); never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from pathlib import Path

from ..io import paths
from ..errors import EdgespecError, EdgespecWarning
from ..core.stats import format_stats


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        print(f"edgespec: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _checked_int(s: str, what: str, ok) -> int:
    try:
        v = int(s)
    except ValueError:
        v = None
    if v is None or not ok(v):
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
    return v


def _checked_float(s: str, what: str, ok) -> float:
    try:
        v = float(s)
    except ValueError:
        v = None
    if v is None or not math.isfinite(v) or not ok(v):  # nan and ±inf are never accepted
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
    return v


def _int(s: str) -> int:
    return _checked_int(s, "an integer", lambda v: True)


def _nonneg_int(s: str) -> int:
    return _checked_int(s, "an integer ≥ 0", lambda v: v >= 0)


def _pos_int(s: str) -> int:
    return _checked_int(s, "an integer ≥ 1", lambda v: v >= 1)


def _checked_port(s: str) -> int:
    return _checked_int(s, "a port in [1, 65535]", lambda v: 1 <= v <= 65535)


def _contexts(s: str) -> list[int]:
    """Comma-separated context lengths, each ≥ 1, e.g. ``128,1024,2048,3500``."""
    parts = [x.strip() for x in s.split(",") if x.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts, got {s!r}")
    return [_checked_int(x, "token counts ≥ 1 (e.g. 128,1024)", lambda v: v >= 1) for x in parts]


def _temperature(s: str) -> float:
    return _checked_float(s, "a finite number ≥ 0", lambda v: v >= 0)


def _top_p(s: str) -> float:
    return _checked_float(s, "a number in (0, 1]", lambda v: 0 < v <= 1)


def _probability(s: str) -> float:
    return _checked_float(s, "a number in [0, 1]", lambda v: 0 <= v <= 1)


def _latency_ms(s: str) -> float:
    return _checked_float(s, "a finite number of milliseconds > 0", lambda v: v > 0)


def _add_generation_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", nargs="?", help="export directory (default: the default pair in the user cache)")
    p.add_argument("--temperature", type=_temperature, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=_nonneg_int, default=0, help="0 = off")
    p.add_argument("--top-p", type=_top_p, default=1.0, help="1 = off")
    p.add_argument("--seed", type=_nonneg_int, default=None)
    p.add_argument("--coupling", choices=("auto", "gumbel", "standard"), default="auto",
                   help="sampling rule: gumbel = drafter-invariant (same seed, same text at any K); standard = "
                        "accept/reject; auto (default) = gumbel with --seed, standard without")
    p.add_argument("--max-new-tokens", type=_pos_int, default=512)
    p.add_argument("--k", type=_nonneg_int, default=None, help="fixed draft length K (default: adaptive)")
    p.add_argument("--latency-budget-ms", type=_latency_ms, default=None,
                   help="keep each round's predicted time under this many ms (adaptive K)")
    p.add_argument("--controller-memory", action=argparse.BooleanOptionalAction, default=True,
                   help="adaptive K starts from what it learned in earlier runs on this device and export, and "
                        "saves what it learns (default on; --no-controller-memory: start cold, save nothing)")
    p.add_argument("--mode", choices=("spec", "lookup", "suffix", "plain"), default="spec",
                   help="spec: draft model; lookup: prompt lookup only; suffix: suffix trees only; plain: target only")
    p.add_argument("--tree", action="store_true", help="token trees (with --k: the node budget)")
    p.add_argument("--lookup", action=argparse.BooleanOptionalAction, default=True,
                   help="prompt lookup first, the draft model when it has no match (default on; --no-lookup: the "
                        "draft model alone)")
    p.add_argument("--suffix", action="store_true",
                   help="suffix trees over the conversation and earlier answers first (SuffixDecoding)")
    p.add_argument("--draft-p-min", type=_probability, default=None,
                   help="stop drafting when the draft's top probability falls below this")
    _add_provider_options(p)
    p.add_argument("--threads", type=_pos_int, default=None, help="onnxruntime intra-op threads (CPU provider)")


def _add_provider_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--provider", default="cpu",
                   help="execution provider: cpu, xnnpack, qnn, nnapi, coreml, openvino, … (default cpu); "
                        "CPU with a notice when it is missing or rejects a graph")
    p.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the execution provider, e.g. backend_path=libQnnHtp.so (repeatable)")


_COMMANDS = ("export", "chat", "generate", "serve", "bench", "eval", "info", "complete", "voice")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="edgespec", description="Lossless speculative sampling on onnxruntime.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)  # no command: see main()

    p = sub.add_parser("export", help="export a draft/target pair to quantized ONNX graphs")
    p.add_argument("pair", nargs="?", help="pair recipe name (default: %s)" % paths.DEFAULT_PAIR)
    p.add_argument("--target", help="GGUF file, HF directory, hub id or recipe name")
    p.add_argument("--draft", help="GGUF file, HF directory, hub id or recipe name")
    p.add_argument("--out", help="output directory (default: user cache, by pair name)")
    p.add_argument("--precision", choices=("int4", "int8", "fp32"), default="int4")
    p.add_argument("--draft-precision", choices=("int4", "int8", "fp32"), default=None,
                   help="precision of the draft (default: same as --precision)")
    p.add_argument("--block-size", type=_pos_int, default=32, help="int4 block size (default 32)")
    p.add_argument("--accuracy-level", type=_nonneg_int, default=4, help="int4 MatMulNBits accuracy level (default 4)")
    p.add_argument("--lm-head-bits", type=int, choices=(4, 8, 32), default=None,
                   help="keep the output head at this many bits")
    p.add_argument("--draft-vocab", type=_pos_int, default=None,
                   help="prune the draft's lm_head to this many frequent token ids (FR-Spec), e.g. 32768")
    p.add_argument("--force", action="store_true",
                   help="replace --out even if it is not an edgespec export or holds other files (deletes them)")
    p.add_argument("--graph-format", type=int, choices=(2, 3, 4), default=None,
                   help="3: in-place KV cache and fused GroupQueryAttention; 4: in-place per-KV-head cache and "
                        "grouped attention (each KV head read once per query group); 2: the traced graph "
                        "(default: 3 where both models allow it — Qwen2/Llama, head size a multiple of 16 — else 2)")
    p.add_argument("--voice", action="store_true",
                   help="prepare the speech-recognition model of `edgespec voice` (Moonshine) instead of a pair")

    p = sub.add_parser("chat", help="interactive chat (streams; /reset /stats /system /help /exit)")
    _add_generation_options(p)
    p.add_argument("--show-accept", action="store_true",
                   help="underline (on a terminal) text that came from accepted draft tokens")
    p.add_argument("--system", default=None, help="system prompt")

    p = sub.add_parser("generate", help="one completion for scripts (prompt from --prompt or stdin)")
    _add_generation_options(p)
    p.add_argument("--prompt", help="the user message (default: read stdin)")
    p.add_argument("--raw", action="store_true", help="no chat template: the prompt is fed as is")
    p.add_argument("--json", action="store_true", help="print one JSON object with text and stats")
    p.add_argument("--json-schema", metavar="FILE", default=None,
                   help="constrain the output to JSON that validates against the JSON Schema in FILE "
                        "(needs llguidance, extra serve)")

    p = sub.add_parser("complete", help="fill in the middle: code before and after the cursor (FIM models)")
    _add_generation_options(p)
    from .fim_cli import add_arguments

    add_arguments(p)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the serve extra)")
    _add_generation_options(p)  # the sampling flags are the defaults of requests that do not set them
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s: loopback only)")
    p.add_argument("--port", type=_checked_port, default=8080)
    p.add_argument("--max-queue", type=_nonneg_int, default=8,
                   help="requests that may wait while one generates; more get 429 (default %(default)s)")
    p.add_argument("--max-body-bytes", type=_pos_int, default=4 << 20, help="larger request bodies get 413")
    p.add_argument("--infill-samplers", choices=("refuse", "server"), default="refuse",
                   help="/infill requests whose `samplers` list names one edgespec lacks (llama.cpp's `infill`, "
                        "sent by llama.vscode and llama.vim): refuse them (400, default), or sample them with the "
                        "server's settings instead (reported as generation_settings.samplers_replaced)")

    p = sub.add_parser("bench", help="plain vs speculative modes on a prompt set: JSON + PNG")
    p.add_argument("dir", nargs="?", help="export directory (default: the default pair)")
    p.add_argument("--modes", default=None,
                   help="comma-separated: plain, k<K>, adaptive, adaptive@<ms>, any of them +lookup/+suffix/+tree "
                        "(default plain,k1,k2,k4,k6,adaptive,adaptive+lookup; with --context plain,adaptive+lookup; "
                        "adaptive+lookup is what chat, generate and serve run by default)")
    p.add_argument("--context", type=_contexts, default=None,
                   help="context sweep instead of the prompt set: decode and prefill tok/s after pasts of these "
                        "lengths, e.g. 128,1024,2048,3500")
    p.add_argument("--also", action="append", default=[], metavar="DIR",
                   help="with --context: another export measured side by side in the same run (repeatable)")
    p.add_argument("--latency-budget-ms", type=_latency_ms, default=None, help="also run adaptive@<this budget>")
    p.add_argument("--prompts", help="prompt file (JSON lines {class, prompt} or one prompt per line)")
    p.add_argument("--per-class", type=_pos_int, default=None, help="built-in prompts per class (default all)")
    p.add_argument("--max-new-tokens", type=_pos_int, default=128)
    p.add_argument("--temperature", type=_temperature, default=0.0)
    p.add_argument("--seed", type=_nonneg_int, default=0)
    _add_provider_options(p)
    p.add_argument("--threads", type=_pos_int, default=None)
    p.add_argument("--cost-curve", action="store_true",
                   help="also measure t(N)/t(1), c, and the speedup Leviathan et al.'s formula predicts")
    p.add_argument("--repeats", type=_pos_int, default=1,
                   help="run every (prompt, mode) N times and keep the median-rate run (default %(default)s)")
    p.add_argument("--new-controller-per-prompt", action="store_true",
                   help="adaptive modes: a new controller for every prompt (default: one per prompt class, "
                        "carried across its prompts as chat carries it across turns)")
    p.add_argument("--out", default="edgespec-bench", help="write OUT.json and OUT.png (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the JSON result to stdout")

    p = sub.add_parser("eval", help="losslessness: greedy identity, sampling check, likelihood")
    p.add_argument("dir", nargs="?")
    p.add_argument("--prompts")
    p.add_argument("--per-class", type=_pos_int, default=2)
    p.add_argument("--max-new-tokens", type=_pos_int, default=64)
    p.add_argument("--k", type=_pos_int, default=4)
    p.add_argument("--draws", type=_pos_int, default=300, help="seeds for the first-token sampling check")
    p.add_argument("--ll-samples", type=_pos_int, default=8, help="sampled texts per mode for the likelihood")
    _add_provider_options(p)
    p.add_argument("--out", default=None, help="also write the JSON result to this file")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("info", help="print an export's manifest and validation figures")
    p.add_argument("dir", nargs="?")
    _add_provider_options(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--verify", action="store_true",
                   help="check every file's size and sha256 against the manifest (exit 1 on a mismatch)")

    from ..voice.cli import add_voice_parser

    add_voice_parser(sub)
    return parser


_NO_EXPORTER = ("the exporter is not installed: pip install -e '.[export]' in the edgespec checkout "
                "(or pip install 'edgespec[export]')")


def _export_dir(arg: str | None, auto_export: bool) -> Path:
    if arg is not None:
        return Path(arg)
    d = paths.default_export_dir()
    if not (d / "edgespec.json").is_file() and auto_export:
        print(f"edgespec: the default pair {paths.DEFAULT_PAIR} is not exported yet; exporting it to {d} "
              "(once; takes several minutes)", file=sys.stderr)
        try:
            from edgespec.export import export_pair
        except ImportError:
            raise EdgespecError(_NO_EXPORTER) from None
        export_pair(None, None)
    return d


def _read_stdin() -> str:
    """All of stdin as text; undecodable bytes are an error naming stdin (never a traceback)."""
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EdgespecError(f"stdin is not valid UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r})") from None


def _cmd_export(a) -> int:
    try:
        from edgespec.export import ExportOptions, export_pair
    except ImportError:
        raise EdgespecError(_NO_EXPORTER) from None
    if a.voice:
        from edgespec.export.voice import prepare_moonshine

        print(prepare_moonshine(a.out))
        return 0
    fmt = {} if a.graph_format is None else {"graph_format": a.graph_format}
    t = ExportOptions(a.precision, a.block_size, a.accuracy_level, a.lm_head_bits, **fmt)
    d = ExportOptions(a.draft_precision or a.precision, a.block_size, a.accuracy_level, a.lm_head_bits,
                      a.draft_vocab, **fmt)
    target, draft = a.target, a.draft
    if a.pair is not None:
        if target or draft:
            raise EdgespecError("give either a pair recipe or --target/--draft, not both")
        target = a.pair
        from edgespec import models

        if a.pair not in models.available():
            raise EdgespecError(f"unknown pair recipe {a.pair!r} (known: {', '.join(models.available())})")
    out = export_pair(target, draft, a.out, t, d, force=a.force)
    print(out)
    return 0


def _cmd_info(a) -> int:
    from onnxruntime import get_available_providers as available_providers

    from ..io.manifest import load_manifest
    from ..io.onnx_model import parse_provider_options, resolve_provider, short_provider_name

    d = _export_dir(a.dir, auto_export=False)
    m = load_manifest(d)
    if a.verify:
        return _verify(d, m)
    full, why = resolve_provider(a.provider)
    parse_provider_options(a.provider_option)
    provider = {"requested": a.provider, "used": short_provider_name(full), "fallback_reason": why,
                "available": [short_provider_name(p) for p in available_providers()]}
    if a.json:
        print(json.dumps({**json.loads(m.to_json()), "execution_provider": provider}))
        return 0
    print(f"{m.name}  ({d})")
    for role in ("target", "draft"):
        g = getattr(m, role)
        q = g.quantization
        print(f"{role}: {g.architecture}, {g.num_layers} layers, {g.num_kv_heads} KV heads × {g.head_dim}, "
              f"logits {g.vocab_size}, {q.precision}"
              + (f" (block {q.block_size}, accuracy level {q.accuracy_level})" if q.block_size else "")
              + f", lm_head {q.lm_head_bits} bits, embedding {q.embedding_bits} bits, graph format {g.graph_format}")
        print(f"  source: {g.source}  sha256 {g.source_sha256[:16]}…")
        v = g.validation.get("fp32", {})
        if v:
            print(f"  fp32 vs PyTorch max|Δ|: prefill {v['max_abs_prefill']:.1e}, with past "
                  f"{v['max_abs_with_past']:.1e}; with past vs full recompute {v['max_abs_past_vs_full']:.1e}")
        qv = g.validation.get("quantized")
        if qv:
            print(f"  {q.precision} vs fp32: greedy agreement {qv['greedy_agreement']:.3f} over {qv['positions']} "
                  f"positions, max|Δ logit| {qv['max_abs_logit_error']:.2f}")
    st = m.special_tokens
    print(f"stop tokens: {list(st.stop)}; eos {st.eos}; context {min(m.target.context_length, m.draft.context_length)}")
    print(f"execution provider: {provider['used']}" + (f" ({why})" if why else
                                                       f" (available here: {', '.join(provider['available'])})"))
    return 0


def _verify(d: Path, m) -> int:
    """``info --verify``: every file's size and sha256 against the manifest, one line each."""
    from ..io.integrity import check_file

    if not m.files:
        print(f"{d}: this export records no file sizes or hashes (exported before edgespec kept them); "
              "export it again to verify it", file=sys.stderr)
        return 0
    bad = 0
    for rel, entry in m.files.items():
        try:
            check_file(d / rel, entry, verify="always")
            print(f"ok  {rel}  {entry.size} bytes  sha256 {entry.sha256[:16]}…")
        except EdgespecError as e:
            bad += 1
            print(f"edgespec: error: {e}", file=sys.stderr)
    print(f"{len(m.files) - bad}/{len(m.files)} files match the manifest")
    return 1 if bad else 0


def _provider_options(a) -> dict:
    from ..io.onnx_model import parse_provider_options

    return parse_provider_options(a.provider_option)


def _load(a):
    from ..engine.decoder import SpecDecoder

    d = _export_dir(a.dir, auto_export=True)
    return SpecDecoder.load(d, provider=a.provider, provider_options=_provider_options(a), threads=a.threads,
                            load_draft=a.mode == "spec",
                            shared_thread_pool=True)


def _proposers(a) -> tuple[str, ...]:
    """--mode/--suffix/--lookup/--tree as proposers in priority order: a fixed-size tree replaces the draft
    chain, an adaptive one is offered beside it."""
    from ..engine import presets

    if a.mode == "plain":
        return presets.proposers(draft=False)
    if a.mode in ("lookup", "suffix"):
        return presets.proposers((a.mode,), draft=False)
    first = (("suffix",) if a.suffix else ()) + (("lookup",) if a.lookup else ())
    return presets.proposers(first, tree=a.tree, fixed_k=a.k is not None)


def _k_policy(a, decoder):
    """None (fixed K from the options) or an adaptive controller."""
    from ..engine import presets

    if a.k is not None and a.latency_budget_ms is not None:
        raise EdgespecError("--k fixes K; --latency-budget-ms needs adaptive K (drop --k)")
    memory = a.command if a.controller_memory else None  # one memory per command: chat and complete answer apart
    return presets.k_policy(decoder, a.k, a.latency_budget_ms, memory=memory)


def _gen_kwargs(a, decoder) -> dict:
    """Keyword arguments of :meth:`SpecDecoder.generate` for the generation flags: ``options`` and ``policy``."""
    from ..engine.generation import GenerationOptions
    from ..engine.presets import DEFAULT_K

    k = a.k if a.k is not None else DEFAULT_K
    options = GenerationOptions(max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_k=a.top_k,
                                top_p=a.top_p, seed=a.seed, proposers=_proposers(a), k=k, n_nodes=k,
                                draft_p_min=a.draft_p_min, coupling=a.coupling)
    return dict(options=options, policy=_k_policy(a, decoder) if options.proposers else None)


def _json_schema_constraint(path: str):
    """The grammar of the JSON Schema in ``path``. Raises EdgespecError (one line): unreadable, not JSON, not
    a schema llguidance compiles, or llguidance missing."""
    from ..core.constrain import Constraint

    try:
        schema = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise EdgespecError(f"--json-schema {path}: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:  # RecursionError: nested past Python's limit
        raise EdgespecError(f"--json-schema {path}: not JSON ({str(e)[:80]})") from None
    try:
        return Constraint.json_schema(schema)
    except ValueError as e:
        raise EdgespecError(f"--json-schema {path}: {e}") from None


def _cmd_generate(a) -> int:
    from ..io.text import check_text

    constraint = _json_schema_constraint(a.json_schema) if a.json_schema else None
    prompt = check_text(a.prompt, "--prompt") if a.prompt is not None else _read_stdin()
    if not prompt.strip():
        raise EdgespecError("empty prompt (give --prompt TEXT or text on stdin)")
    dec = _load(a)
    kw = _gen_kwargs(a, dec)
    if constraint is not None:
        import dataclasses

        from ..core.processors import Processing

        kw["options"] = dataclasses.replace(kw["options"], processing=Processing(constraint=constraint))
    g = dec.generate(prompt, **kw) if a.raw else dec.generate(messages=[{"role": "user", "content": prompt}], **kw)
    if a.json:
        g.run()
        print(json.dumps({"text": g.text, "token_ids": g.token_ids, "stats": g.stats.to_dict()}))
        return 0
    for piece in g:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    print(format_stats(g.stats), file=sys.stderr)
    return 0


def _cmd_serve(a) -> int:
    try:
        from . import serve
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise EdgespecError("the server needs the serve extra: pip install -e '.[serve]' in the edgespec checkout "
                            "(or pip install 'edgespec[serve]')") from None
    sock = serve.listen(a.host, a.port)  # before loading: a port in use is said at once
    dec = _load(a)
    engine = serve.Engine(dec, _gen_kwargs(a, dec), a.max_queue, a.max_new_tokens)
    engine.infill_samplers = a.infill_samplers
    return serve.serve(engine, sock, a.max_body_bytes)


def _prompt_set(a):
    from ..bench import prompts

    return prompts.load_file(a.prompts) if a.prompts else prompts.builtin(a.per_class)


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def _cmd_bench(a) -> int:
    from ..bench.runner import Mode, format_bench, plot, run_bench

    if a.context is not None:
        return _cmd_context_sweep(a)
    if a.also:
        raise EdgespecError("--also needs --context")
    modes = [m.strip() for m in (a.modes or "plain,k1,k2,k4,k6,adaptive,adaptive+lookup").split(",") if m.strip()]
    if a.latency_budget_ms is not None:
        modes.append(f"adaptive@{a.latency_budget_ms:g}")
    for m in modes:
        Mode.parse(m)
    if "plain" not in modes:
        modes.insert(0, "plain")
    prompts = _prompt_set(a)
    d = _export_dir(a.dir, auto_export=False)
    base = next((a.out[:-len(x)] for x in (".json", ".png") if a.out.endswith(x)), a.out)  # OUT.json, OUT.png
    json_out, png_out = Path(base + ".json"), Path(base + ".png")
    if not json_out.parent.is_dir():
        raise EdgespecError(f"{json_out.parent}: no such directory for --out")
    result = run_bench(d, modes, prompts, a.max_new_tokens, a.temperature, a.seed, a.provider, a.threads,
                       provider_options=_provider_options(a),
                       cost=a.cost_curve, progress=not a.json, sessions=not a.new_controller_per_prompt, repeats=a.repeats)
    result["command"] = "edgespec " + " ".join(sys.argv[1:])
    _write_json(json_out, result)
    try:
        plot(result, png_out)
        wrote = f"wrote {json_out} and {png_out}"
    except ImportError:
        print("edgespec: matplotlib is not installed: no plot (pip install 'edgespec[bench]')", file=sys.stderr)
        wrote = f"wrote {json_out} (no plot)"
    if a.json:
        print(json.dumps(result))
    else:
        print(format_bench(result))
        print(wrote)
    return 0


def _cmd_context_sweep(a) -> int:
    from ..bench.runner import Mode
    from ..bench.context import context_sweep, format_sweep, plot_sweep

    modes = [m.strip() for m in (a.modes or "plain,adaptive+lookup").split(",") if m.strip()]
    for m in modes:
        Mode.parse(m)
    dirs = [_export_dir(a.dir, auto_export=False)] + [_export_dir(d, auto_export=False) for d in a.also]
    base = next((a.out[:-len(x)] for x in (".json", ".png") if a.out.endswith(x)), a.out)
    json_out, png_out = Path(base + ".json"), Path(base + ".png")
    if not json_out.parent.is_dir():
        raise EdgespecError(f"{json_out.parent}: no such directory for --out")
    try:
        result = context_sweep(dirs, a.context, modes, a.max_new_tokens, a.provider, a.threads, a.repeats)
    except ValueError as e:
        raise EdgespecError(str(e)) from None
    result["command"] = "edgespec " + " ".join(sys.argv[1:])
    _write_json(json_out, result)
    try:
        plot_sweep(result, png_out)
    except ImportError:
        print("edgespec: matplotlib is not installed: no plot (pip install 'edgespec[bench]')", file=sys.stderr)
    print(json.dumps(result) if a.json else format_sweep(result))
    if not a.json:
        print(f"wrote {json_out} and {png_out}")
    return 0


def _cmd_eval(a) -> int:
    from ..engine.decoder import SpecDecoder
    from ..bench.evaluate import run_eval

    prompts = _prompt_set(a)
    d = _export_dir(a.dir, auto_export=False)
    dec = SpecDecoder.load(d, provider=a.provider, provider_options=_provider_options(a), shared_thread_pool=True)
    r = run_eval(dec, prompts, a.max_new_tokens, a.k, a.draws, a.ll_samples, progress=not a.json)
    r["command"] = "edgespec " + " ".join(sys.argv[1:])
    if a.out:
        _write_json(Path(a.out), r)
    if a.json:
        print(json.dumps(r))
        return 0
    for name, rows in (("greedy", r["greedy"]), (f"seeded sampling (T={r['settings']['temperature']:g})", r["seeded"])):
        n_id = sum(g["identical"] for g in rows)
        n_ok = sum(g["ok"] and not g["identical"] for g in rows)
        print(f"{name}: {n_id}/{len(rows)} speculative runs identical to plain, {n_ok} diverge where the verify "
              f"path's own numbers chose otherwise (kernel noise), {len(rows) - n_id - n_ok} fail")
        for g in rows:
            if not g["identical"]:
                print(f"  {g['class']}: first divergence at token {g['first_divergence']}, plain gap "
                      f"{_fmt(g['plain_gap'])}, δ {_fmt(g['delta'])}: {'ok' if g['ok'] else 'FAIL: ' + str(g['problem'])}")
    for k, s in r["kernel_noise"]["by_k"].items():
        if s["positions"]:
            print(f"kernel noise, K+1 = {int(k) + 1}-row verify vs one-token step ({s['positions']} positions): "
                  f"max |Δ logit| median {s['median_max_abs']:.4f}, p99 {s['p99_max_abs']:.4f}, max "
                  f"{s['max_abs']:.4f}; greedy flips {s['flips_per_1000']:.1f} per 1,000 tokens")
    for s in r["sampling"]:
        print(f"sampling ({s['class']}, {s['coupling']} rule): first-token TV {s['tv']:.3f} over {s['draws']} "
              f"seeds; sampling noise alone {s['tv_noise']:.3f}")
    for mode, l in r["likelihood"].items():
        extra = f", alpha {l['alpha']:.3f}" if l.get("alpha") is not None else ""
        print(f"likelihood ({mode}): mean log p {l['mean_log_likelihood']:.3f} ± {l['stderr']:.3f} "
              f"(perplexity {l['perplexity']:.2f}, {l['samples']} texts{extra})")
    ok = all(g["ok"] for g in r["greedy"] + r["seeded"])
    return 0 if ok else 1


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _run(a) -> int:
    if a.command == "export":
        return _cmd_export(a)
    if a.command == "info":
        return _cmd_info(a)
    if a.command == "bench":
        return _cmd_bench(a)
    if a.command == "eval":
        return _cmd_eval(a)
    if a.command == "generate":
        return _cmd_generate(a)
    if a.command == "complete":
        from .fim_cli import run_complete

        return run_complete(a, _load, _gen_kwargs, _read_stdin)
    if a.command == "voice":
        from ..voice.cli import run_voice

        return run_voice(a, _export_dir)
    if a.command == "serve":
        return _cmd_serve(a)
    if a.command == "chat":
        from .chat import run_chat

        return run_chat(a, _load(a), _gen_kwargs)
    return 0


def _show_warning(message, category, filename, lineno, file=None, line=None):
    if issubclass(category, EdgespecWarning):
        print(f"edgespec: warning: {message}", file=sys.stderr)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


_default_showwarning = warnings.showwarning


def _console_streams() -> None:
    """Print what the terminal's encoding can show (a cp1252 console gets '?' for the rest): never lose an
    answer to a UnicodeEncodeError. ``--json`` output is ASCII (escaped), so valid UTF-8 anywhere."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and (stream.encoding or "").lower().replace("-", "") != "utf8":
            try:
                stream.reconfigure(errors="replace")
            except (ValueError, OSError):
                pass


def main(argv: list[str] | None = None) -> int:
    """The ``edgespec`` command; returns the exit code (0 ok, 1 a failed check, 2 bad input, 130 Ctrl-C)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # also during start-up (imports, argument parsing, loading)
        print("\nedgespec: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # Ctrl-C inside a C extension (its initialisation) can arrive wrapped, e.g. ImportError
        if not _interrupted(e):
            raise
        print("\nedgespec: interrupted", file=sys.stderr)
        return 130


def _interrupted(e: BaseException) -> bool:
    """Whether a KeyboardInterrupt is among the causes of ``e``."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _main(argv: list[str] | None) -> int:
    _console_streams()
    warnings.showwarning = _show_warning
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.command is None:
        print(f"edgespec: error: choose a command: {', '.join(_COMMANDS)} (edgespec --help)", file=sys.stderr)
        return 2
    try:
        code = _run(a)
        sys.stdout.flush()  # a closed pipe shows here, not as "Exception ignored" at interpreter exit
        return code
    except BrokenPipeError:  # e.g. `edgespec info | head -1`: the reader left; stop quietly like other tools
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout has no file descriptor (embedded use)
            pass
        return 141  # 128 + SIGPIPE, as the shell reports for a tool killed by the closed pipe
    except (EdgespecError, ValueError) as e:
        print(f"edgespec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nedgespec: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
