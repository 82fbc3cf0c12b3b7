"""``edgespec export`` (a pair to quantized ONNX graphs, or the voice model) and ``edgespec info`` (an export's
manifest, validation figures and execution provider; ``--verify``: every file against the manifest): their
arguments and what they run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..engine import flags
from ..errors import EdgespecError
from ..io import paths
from .cli_common import NO_EXPORTER, add_provider_options, export_dir


def add_export_parser(sub) -> None:
    """Add the ``export`` subcommand to the CLI's subparsers."""
    p = sub.add_parser("export", help="export a draft/target pair to quantized ONNX graphs")
    p.add_argument("pair", nargs="?", help="pair recipe name (default: %s)" % paths.DEFAULT_PAIR)
    p.add_argument("--target", help="GGUF file, HF directory, hub id or recipe name")
    p.add_argument("--draft", help="GGUF file, HF directory, hub id or recipe name")
    p.add_argument("--out", help="output directory (default: user cache, by pair name)")
    p.add_argument("--precision", choices=("int4", "int8", "fp32"), default="int4")
    p.add_argument("--draft-precision", choices=("int4", "int8", "fp32"), default=None,
                   help="precision of the draft (default: same as --precision)")
    p.add_argument("--block-size", type=flags.pos_int, default=None, help="int4 block size (default 32)")
    p.add_argument("--accuracy-level", type=flags.nonneg_int, default=4, help="int4 MatMulNBits accuracy level (default 4)")
    p.add_argument("--lm-head-bits", type=int, choices=(4, 8, 32), default=None,
                   help="keep the output head at this many bits")
    p.add_argument("--layout", metavar="SPEC", default=None,
                   help="the int4 weight layout of both models in one spelling, b<block>[z][+fragment=bits]…: "
                        "block 16-256, z for zero points, then the bits (4, 8, 32) or the block (b16-b256) of the "
                        "matmuls whose weight name contains a fragment (down_proj, layers.0., lm_head; gguf6: the "
                        "tensors the GGUF stores at 6 bits or more); e.g. b128z+down_proj=8+lm_head=8, "
                        "b128z+gguf6=8, b256+gguf6=b32 (default b32; docs/export.md)")
    p.add_argument("--draft-layout", metavar="SPEC", default=None,
                   help="the draft's layout, when it differs from the target's (it only proposes tokens: a "
                        "coarser layout costs some acceptance, not output quality)")
    p.add_argument("--tune", action="store_true",
                   help="choose each model's int4 layout on this machine: time the candidate layouts' kernels "
                        "here, then keep the target's fastest whose greedy agreement and KL against the source "
                        "weights, and log-likelihood of held text, are at least the default layout's, and the "
                        "draft's by expected speculative decoding speed (about 10 minutes for the default pair; "
                        "`edgespec info` says what it chose and why)")
    p.add_argument("--tune-min-agreement", type=float, default=None, metavar="A",
                   help="with --tune: accept a layout whose greedy agreement with the source weights is at least A "
                        "(0-1) instead of the default layout's agreement, KL and log-likelihood")
    p.add_argument("--draft-vocab", type=flags.pos_int, default=None,
                   help="prune the draft's lm_head to this many frequent token ids (FR-Spec), e.g. 32768")
    p.add_argument("--force", action="store_true",
                   help="replace --out even if it is not an edgespec export or holds other files (deletes them)")
    p.add_argument("--graph-format", type=int, choices=(2, 3, 4), default=None,
                   help="3: in-place KV cache and fused GroupQueryAttention; 4: in-place per-KV-head cache and "
                        "grouped attention (each KV head read once per query group); 2: the traced graph "
                        "(default: 3 where both models allow it — Qwen2/Llama, head size a multiple of 16 — else 2)")
    p.add_argument("--profile", choices=("auto", "small", "full"), default=None,
                   help="which optional graphs to write: full = each model's int8 prefill graph and an int8 KV "
                        "cache (prompts prefill 1.7-1.9x faster, long contexts decode faster; ~3.5 GB of RAM to run "
                        "the default pair), small = the int4 graphs alone (~1.7 GB, for boards under 8 GB); "
                        "auto (the default): full on a machine with at least 7 GiB of RAM, else small "
                        "(`edgespec info` says which and why; docs/export.md)")
    p.add_argument("--prefill-int8", action=argparse.BooleanOptionalAction, default=None,
                   help="write (or, --no-prefill-int8, leave out) the target's int8 prefill graph whatever the "
                        "profile (int4 only): prompt chunks of 64+ tokens run about 2x faster on CPUs with "
                        "VNNI/AMX, for ~0.9 GB more disk and ~1.4 GB more RAM (the runtime's --no-prefill-graph "
                        "leaves it unloaded); under the full profile a model left without its prefill graph also "
                        "keeps a float32 cache unless --kv-int8 is given")
    p.add_argument("--draft-prefill-int8", action=argparse.BooleanOptionalAction, default=None,
                   help="the same for the draft (its prompt catch-up)")
    p.add_argument("--kv-int8", action=argparse.BooleanOptionalAction, default=None,
                   help="keep (or not) both models' KV caches in int8 whatever the profile (graph format 3; "
                        "GroupQueryAttention quantizes and reads them natively): a quarter of the cache memory, "
                        "faster decode after a long context; without the prefill graphs long prompts prefill at "
                        "~0.7x (docs/benchmarks.md)")
    p.add_argument("--voice", action="store_true",
                   help="prepare the speech-recognition model of `edgespec voice` (Moonshine) instead of a pair")


def add_info_parser(sub) -> None:
    """Add the ``info`` subcommand to the CLI's subparsers."""
    p = sub.add_parser("info", help="print an export's manifest and validation figures")
    p.add_argument("dir", nargs="?")
    add_provider_options(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--verify", action="store_true",
                   help="check every file's size and sha256 against the manifest (exit 1 on a mismatch)")


def cmd_export(a) -> int:
    """``edgespec export``: prints the export directory (or the prepared voice model)."""
    try:
        from edgespec.export import ExportOptions, export_pair
    except ImportError:
        raise EdgespecError(NO_EXPORTER) from None
    if a.voice:
        pair_only = {"--prefill-int8": a.prefill_int8, "--draft-prefill-int8": a.draft_prefill_int8,
                     "--kv-int8": a.kv_int8, "--layout": a.layout, "--draft-layout": a.draft_layout,
                     "--tune": a.tune or None, "--profile": a.profile}
        flag = next((f if v is not False else f.replace("--", "--no-", 1) for f, v in pair_only.items()
                     if v is not None), None)
        if flag:
            raise EdgespecError(f"{flag} applies to a pair export, not to --voice")
        from edgespec.export.voice import prepare_moonshine

        print(prepare_moonshine(a.out))
        return 0
    fmt = {} if a.graph_format is None else {"graph_format": a.graph_format}
    t_lay, d_lay = _layouts(a)
    t = ExportOptions(a.precision, accuracy_level=a.accuracy_level, **t_lay, **fmt, prefill_int8=a.prefill_int8,
                      kv_int8=a.kv_int8)
    d = ExportOptions(a.draft_precision or a.precision, accuracy_level=a.accuracy_level, vocab_size=a.draft_vocab,
                      **d_lay, **fmt, prefill_int8=a.draft_prefill_int8, kv_int8=a.kv_int8)
    target, draft = a.target, a.draft
    if a.pair is not None:
        if target or draft:
            raise EdgespecError("give either a pair recipe or --target/--draft, not both")
        target = a.pair
        from edgespec import models

        if a.pair not in models.available():
            raise EdgespecError(f"unknown pair recipe {a.pair!r} (known: {', '.join(models.available())})")
    out = export_pair(target, draft, a.out, t, d, force=a.force, tune=a.tune, min_agreement=a.tune_min_agreement,
                      profile=a.profile or "auto")
    print(out)
    return 0


def _layouts(a) -> tuple[dict, dict]:
    """The target's and the draft's layout fields (:func:`export.build.parse_layout`) from ``--layout``,
    ``--draft-layout``, ``--block-size`` and ``--lm-head-bits``; a contradiction is an error."""
    from edgespec.export.build import parse_layout

    if a.tune_min_agreement is not None and not (a.tune and 0 < a.tune_min_agreement <= 1):
        raise EdgespecError("--tune-min-agreement needs --tune and a value in (0, 1]")
    if a.tune and (a.layout or a.draft_layout or a.block_size is not None or a.lm_head_bits is not None):
        raise EdgespecError("--tune chooses the layout itself: drop --layout, --draft-layout, --block-size and "
                            "--lm-head-bits")
    if a.tune and "int4" != a.precision or a.tune and (a.draft_precision or "int4") != "int4":
        raise EdgespecError(f"--tune chooses among int4 layouts; --precision {a.precision}"
                            + (f" --draft-precision {a.draft_precision}" if a.draft_precision else "")
                            + " asks for another")
    if a.layout and (a.block_size is not None or a.lm_head_bits is not None):
        raise EdgespecError("--layout already gives the block size and the output head's bits: drop --block-size "
                            "and --lm-head-bits")
    if a.layout:
        t = parse_layout(a.layout)
    else:
        t = {"block_size": 32 if a.block_size is None else a.block_size, "lm_head_bits": a.lm_head_bits}
    return t, (parse_layout(a.draft_layout) if a.draft_layout else t)


def cmd_info(a) -> int:
    """``edgespec info``: the manifest as text or JSON; ``--verify``: exit 1 on a file that does not match."""
    from onnxruntime import get_available_providers as available_providers

    from ..io.manifest import load_manifest
    from ..io.onnx_model import parse_provider_options, resolve_provider, short_provider_name

    d = export_dir(a.dir, auto_export=False)
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
    if m.profile:
        print(f"profile: {m.profile} ({m.profile_chosen_by or 'reason not recorded'})")
    for role in ("target", "draft"):
        g = getattr(m, role)
        q = g.quantization
        print(f"{role}: {g.architecture}, {g.num_layers} layers, {g.num_kv_heads} KV heads × {g.head_dim}, "
              f"logits {g.vocab_size}, {q.precision}"
              + (f" (block {q.block_size}{', zero points' if q.zero_points else ''}, accuracy level "
                 f"{q.accuracy_level})" if q.block_size else "")
              + "".join(f", {frag}{' (the tensors the GGUF stores at 6+ bits)' if frag == 'gguf6' else ''} "
                        f"{b} bits" for frag, b in q.tensor_bits.items())
              + "".join(f", {frag}{' (the tensors the GGUF stores at 6+ bits)' if frag == 'gguf6' else ''} "
                        f"block {b}" for frag, b in q.tensor_blocks.items())
              + f", lm_head {q.lm_head_bits} bits, embedding {q.embedding_bits} bits, graph format {g.graph_format}"
              + (f", KV cache {g.kv_cache}" if g.kv_cache != "float32" else "")
              + (f" (prefill graph {g.prefill_cache_type})" if g.prefill_path and g.prefill_cache_type != g.kv_cache
                 else ""))
        print(f"  source: {g.source}  sha256 {g.source_sha256[:16]}…")
        if q.chosen_by:
            print(f"  layout: {q.chosen_by}")
        _print_tune(g.validation.get("tune"))
        r = g.validation.get("reference")
        if r:
            print(f"  {q.precision} vs {r.get('against', 'the source weights')}: greedy agreement "
                  f"{r['greedy_agreement']:.3f} over {r['positions']} positions, max|Δ logit| "
                  f"{r['max_abs_logit_error']:.2g}" + (f", KL {r['kl_mean']:.4f} nats" if "kl_mean" in r else "")
                  + f"; with past vs full recompute {r['max_abs_past_vs_full']:.1e}")
        v = g.validation.get("fp32", {})
        if v:
            print(f"  fp32 vs PyTorch max|Δ|: prefill {v['max_abs_prefill']:.1e}, with past "
                  f"{v['max_abs_with_past']:.1e}; with past vs full recompute {v['max_abs_past_vs_full']:.1e}")
        qv = g.validation.get("quantized")
        if qv:
            print(f"  {q.precision} vs fp32: greedy agreement {qv['greedy_agreement']:.3f} over {qv['positions']} "
                  f"positions, max|Δ logit| {qv['max_abs_logit_error']:.2f}")
        kv = g.validation.get("kv_int8")
        if kv:
            print(f"  int8 KV cache vs float32: greedy agreement {kv['greedy_agreement']:.3f} over {kv['positions']} "
                  f"positions, max|Δ logit| {kv['max_abs_logit_error']:.2f}")
            pk = kv.get("with_prefill_graph")
            if pk:
                print(f"  after a prefill on the float32 prefill graph: greedy agreement {pk['greedy_agreement']:.3f} "
                      f"over {pk['positions']} positions, max|Δ logit| {pk['max_abs_logit_error']:.2f}")
        pv = g.validation.get("prefill_int8")
        if g.prefill_path and pv:
            print(f"  int8 prefill graph {g.prefill_path}: greedy agreement {pv['vs_fp32']['greedy_agreement']:.3f} "
                  f"with fp32, {pv['vs_graph']['greedy_agreement']:.3f} with the {q.precision} graph")
    st = m.special_tokens
    print(f"stop tokens: {list(st.stop)}; eos {st.eos}; context {min(m.target.context_length, m.draft.context_length)}")
    print(f"execution provider: {provider['used']}" + (f" ({why})" if why else
                                                       f" (available here: {', '.join(provider['available'])})"))
    return 0


def _print_tune(t: dict | None) -> None:
    """``edgespec info``'s lines for ``validation["tune"]`` (:func:`export.tune.tune`): each candidate's matmul
    milliseconds and, where it was built, its accuracy."""
    if not isinstance(t, dict) or not isinstance(t.get("candidates"), list):
        return
    one, k = (t.get("rows") or [1, "K+1"])[:2]
    print(f"  tuned on {t.get('cpu')}, {t.get('date')}: ms of matmuls per {one}-row step / {k}-row verify")
    for c in t["candidates"]:
        try:
            acc = (f", greedy agreement {c['greedy_agreement']:.3f}"
                   + (f", KL {c['kl_mean']:.4f}" if c.get("kl_mean") is not None else "")
                   + (f", NLL of held text {c['nll']:.4f}" if c.get("nll") is not None else "")
                   if "greedy_agreement" in c else "")
            if "tokens_per_s" in c:  # a draft: judged by the speculative decoding speed it gives
                acc = (f", acceptance {c['acceptance']:.3f}, step {c['step_ms'][0]:.1f} ms → "
                       f"{c['tokens_per_s']:.1f} tok/s at K={t.get('k')}")
            elif c.get("step_ms"):
                acc += f", graph step {c['step_ms'][0]:.1f} / {c['step_ms'][1]:.1f} ms"
            print(f"    {c['layout']:<28} {c['ms'][0]:7.1f} / {c['ms'][1]:7.1f}{acc}"
                  + ("  (chosen)" if c.get("chosen") else "  (below the floor)" if c.get("accepted") is False
                     else "  (held the floor; not chosen)" if c.get("accepted") else ""))
        except (KeyError, TypeError, ValueError, IndexError):
            continue


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
