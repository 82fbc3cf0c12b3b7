"""``edgespec`` command line: export, chat, generate, complete, serve, info (and bench/eval).

Every user error ends as one line on stderr and exit code 2 (1 for runtime failures); never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

from ..core.stats import format_stats
from ..engine import flags
from ..errors import EdgespecError, EdgespecWarning, caused_by_interrupt
from .cli_bench import add_bench_parser, add_eval_parser, cmd_bench, cmd_eval
from .cli_common import add_provider_options, export_dir, provider_options, read_stdin
from .cli_models import add_export_parser, add_info_parser, cmd_export, cmd_info


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        print(f"edgespec: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _add_generation_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", nargs="?", help="export directory (default: the default pair in the user cache)")
    p.add_argument("--temperature", type=flags.temperature, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=flags.nonneg_int, default=0, help="0 = off")
    p.add_argument("--top-p", type=flags.top_p, default=1.0, help="1 = off")
    p.add_argument("--seed", type=flags.seed, default=None)
    p.add_argument("--coupling", choices=("auto", "gumbel", "standard"), default="auto",
                   help="sampling rule: gumbel = drafter-invariant (same seed, same text at any K); standard = "
                        "accept/reject; auto (default) = gumbel with --seed, standard without")
    p.add_argument("--max-new-tokens", type=flags.pos_int, default=512)
    p.add_argument("--k", type=flags.nonneg_int, default=None, help="fixed draft length K (default: adaptive)")
    p.add_argument("--latency-budget-ms", type=flags.latency_ms, default=None,
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
    p.add_argument("--draft-p-min", type=flags.probability, default=None,
                   help="stop drafting when the draft's top probability falls below this")
    add_provider_options(p)
    p.add_argument("--threads", type=flags.pos_int, default=None, help="onnxruntime intra-op threads (CPU provider)")
    p.add_argument("--prefill-graph", action=argparse.BooleanOptionalAction, default=True,
                   help="run prompt chunks on the export's int8 prefill graph where it has one (`export "
                        "--prefill-int8`; default on; --no-prefill-graph: do not load it, ~1.4 GB less RAM)")


_COMMANDS = ("export", "chat", "generate", "serve", "bench", "eval", "info", "complete", "voice")


def _version() -> str:
    """The installed distribution's version (pyproject.toml's, which ``edgespec.__version__`` repeats): read from its
    metadata, as this layer imports nothing above it (tests/test_layers.py)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("edgespec")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="edgespec", description="Lossless speculative sampling on onnxruntime.")
    parser.add_argument("--version", action="version", version=f"edgespec {_version()}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)  # no command: see main()

    add_export_parser(sub)

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
    from .fim_cli import add_arguments, add_draft_window

    add_arguments(p)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the serve extra)")
    _add_generation_options(p)  # the sampling flags are the defaults of requests that do not set them
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s: loopback only)")
    p.add_argument("--port", type=flags.port, default=8080)
    p.add_argument("--max-queue", type=flags.nonneg_int, default=8,
                   help="requests that may wait while one generates; more get 429 (default %(default)s)")
    p.add_argument("--max-body-bytes", type=flags.pos_int, default=4 << 20, help="larger request bodies get 413")
    add_draft_window(p)
    p.add_argument("--infill-samplers", choices=("refuse", "server"), default="refuse",
                   help="/infill requests whose `samplers` list names one edgespec lacks (llama.cpp's `infill`, "
                        "sent by llama.vscode and llama.vim): refuse them (400, default), or sample them with the "
                        "server's settings instead (reported as generation_settings.samplers_replaced)")

    add_bench_parser(sub)
    add_eval_parser(sub)
    add_info_parser(sub)

    from ..voice.cli import add_voice_parser

    add_voice_parser(sub)
    return parser


def _load(a):
    from ..engine.decoder import SpecDecoder

    d = export_dir(a.dir, auto_export=True)
    from dataclasses import replace

    from ..io.onnx_model import DEFAULT_MEMORY

    return SpecDecoder.load(d, provider=a.provider, provider_options=provider_options(a), threads=a.threads,
                            load_draft=a.mode == "spec", shared_thread_pool=True,
                            memory=replace(DEFAULT_MEMORY, prefill_graph=a.prefill_graph))


def _proposers(a) -> tuple[str, ...]:
    """--mode/--suffix/--lookup/--tree as proposers in priority order (:func:`~edgespec.engine.presets.mode_proposers`:
    a fixed-size tree replaces the draft chain, an adaptive one is offered beside it)."""
    from ..engine.presets import mode_proposers

    return mode_proposers(a.mode, a.lookup, a.suffix, a.tree, fixed_k=a.k is not None)


def _k_policy(a, decoder):
    """None (fixed K from the options) or an adaptive controller (:func:`~edgespec.engine.presets.k_policy`)."""
    from ..engine import presets

    if a.k is not None and a.latency_budget_ms is not None:
        raise EdgespecError("--k fixes K; --latency-budget-ms needs adaptive K (drop --k)")
    memory = a.command if a.controller_memory else None  # one memory per command: chat and complete answer apart
    return presets.k_policy(decoder, a.k, a.latency_budget_ms, memory=memory)


def _gen_kwargs(a, decoder) -> dict:
    """Keyword arguments of :meth:`SpecDecoder.generate` for the generation flags: ``options``
    (:func:`~edgespec.engine.presets.generation_options`) and ``policy``."""
    from ..engine.presets import generation_options

    options = generation_options(a.mode, a.lookup, a.suffix, a.tree, a.k, max_new_tokens=a.max_new_tokens,
                                 temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed,
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
    prompt = check_text(a.prompt, "--prompt") if a.prompt is not None else read_stdin()
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
        raise EdgespecError("the server needs the serve extra: pip install -e '.[serve]' in the edgespec checkout"
                            ) from None
    sock = serve.listen(a.host, a.port)  # before loading: a port in use is said at once
    dec = _load(a)
    engine = serve.Engine(dec, _gen_kwargs(a, dec), a.max_queue, a.max_new_tokens)
    engine.infill_samplers = a.infill_samplers
    engine.fim_draft_window = a.draft_window
    return serve.serve(engine, sock, a.max_body_bytes)


def _run(a) -> int:
    if a.command == "export":
        return cmd_export(a)
    if a.command == "info":
        return cmd_info(a)
    if a.command == "bench":
        return cmd_bench(a)
    if a.command == "eval":
        return cmd_eval(a)
    if a.command == "generate":
        return _cmd_generate(a)
    if a.command == "complete":
        from .fim_cli import run_complete

        return run_complete(a, _load, _gen_kwargs, read_stdin)
    if a.command == "voice":
        from ..voice.cli import run_voice

        return run_voice(a, export_dir)
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
        if not caused_by_interrupt(e):
            raise
        print("\nedgespec: interrupted", file=sys.stderr)
        return 130


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
