"""``edgespec bench --context``: decode and prefill speed as the context grows, for one or more exports.

For each context length L the prompt is a chat message holding about L tokens of Python source (from the
standard library that ships with the interpreter, so it needs no download) and a question about it; each
mode then generates from fresh caches. Decode tok/s (new tokens over the time after the first token's
prefill) is what a long conversation or a pasted file costs per generated token; prefill tok/s is prompt
tokens over the prefill time. Exports (e.g. graph format 2 and 3 of one pair) and modes run interleaved at
every length, in one process, so their ratios are side by side.
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import numpy as np

from .runner import Mode, cpus, run_one
from ..engine.decoder import SpecDecoder
from .prompts import Prompt

QUESTION = "\n```\n\nWhat does this code do? Answer in a few sentences, then show one example call."


def source_text() -> str:
    """Python source of the standard library's ``argparse`` and ``textwrap`` (about 30,000 tokens)."""
    return "".join(Path(m.__file__).read_text(encoding="utf-8") for m in (argparse, __import__("textwrap")))


def long_prompt(dec: SpecDecoder, n_tokens: int, text: str | None = None) -> Prompt:
    """A ``code`` prompt whose chat rendering is about ``n_tokens`` tokens (the source cut to fit).

    Raises:
        ValueError: ``n_tokens`` is too short for the chat template and the question.
    """
    text = text if text is not None else source_text()
    wrap = lambda body: Prompt("code", ({"role": "user", "content": "```python\n" + body + QUESTION},))
    overhead = len(dec.encode(messages=list(wrap("").messages)))
    if n_tokens <= overhead:
        raise ValueError(f"a context of {n_tokens} tokens is shorter than the prompt's frame ({overhead})")
    ids = dec.tokenizer.encode(text, add_special_tokens=False).ids[:n_tokens - overhead]
    return wrap(dec.tokenizer.decode(ids))


def context_sweep(export_dirs: list[str | Path], contexts: list[int], modes: list[str], max_new_tokens: int = 64,
                  provider: str = "cpu", threads: int | None = None, repeats: int = 1) -> dict:
    """Decode and prefill tok/s after each context length, for each export and mode (greedy).

    Returns ``{"rows": [{export, context, prompt_tokens, mode, decode_tok_s, prefill_tok_s, alpha}], "flat":
    {export: {mode: decode tok/s at the longest context / at the shortest}}, ...}``. Each (export, length,
    mode) keeps the median-decode-rate run of ``repeats``; each repeat runs every cell once, the exports
    interleaved, so that a slow stretch of the machine hits short and long contexts alike. Raises ValueError for a
    length that does not fit an export's context with ``max_new_tokens``.
    """
    from ..control.calibrate import calibrate

    decs = {str(d): SpecDecoder.load(d, provider=provider, threads=threads, shared_thread_pool=True)
            for d in export_dirs}
    parsed = [Mode.parse(m) for m in modes]
    for dec in decs.values():
        for proposers in ((), ("draft",)):  # warm-up: first runs allocate
            dec.generate("Hello", max_new_tokens=4, k=2, proposers=proposers).run()
        if any(m.k is None for m in parsed):
            calibrate(dec)
    text = source_text()
    prompts: dict[tuple[int, str], list[int] | str] = {}
    for n in contexts:
        for name, dec in decs.items():
            if n + max_new_tokens > dec.context_length:
                raise ValueError(f"{name}: context {n} + {max_new_tokens} new tokens exceeds {dec.context_length}")
            prompts[n, name] = long_prompt(dec, n, text)
    # Every repeat visits every cell (length, mode, export) once, in the same order: a slow stretch of the machine
    # (minutes, on a shared VM) then hits the short and the long contexts alike instead of biasing their ratio.
    runs: dict[tuple[int, str, str], list[dict]] = {}
    for _ in range(repeats):
        for n in contexts:
            for mode in parsed:
                for name, dec in decs.items():
                    runs.setdefault((n, mode.name, name), []).append(
                        run_one(dec, mode, prompts[n, name], max_new_tokens, 0.0, 0))
    rows = []
    for (n, mode_name, name), rs in runs.items():
        rs = sorted(rs, key=lambda r: r["decode_tok_s"])
        r = rs[(len(rs) - 1) // 2]
        rows.append({"export": name, "context": n, "prompt_tokens": r["prompt_tokens"], "mode": mode_name,
                     "decode_tok_s": r["decode_tok_s"], "prefill_tok_s": r["prefill_tok_s"],
                     "new_tokens": r["new_tokens"], "alpha": r["alpha"],
                     "decode_tok_s_repeats": [x["decode_tok_s"] for x in rs]})
    flat = {}
    for name in decs:
        for mode in modes:
            mine = sorted((r["context"], r["decode_tok_s"]) for r in rows if r["export"] == name and r["mode"] == mode)
            flat.setdefault(name, {})[mode] = mine[-1][1] / mine[0][1] if mine and mine[0][1] > 0 else None
    graph_formats = {name: dec.target.spec.graph_format for name, dec in decs.items()}
    return {"contexts": contexts, "modes": modes, "max_new_tokens": max_new_tokens, "exports": list(decs),
            "graph_formats": graph_formats, "rows": rows, "flat": flat,
            "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": cpus(),
                        "provider": provider, "threads": threads}}


def format_sweep(result: dict) -> str:
    """A Markdown table: one row per export and mode, decode tok/s per context, flatness, prefill tok/s."""
    ctx = result["contexts"]
    head = ("| export (graph format) | mode | " + " | ".join(f"decode after {n}" for n in ctx)
            + f" | {ctx[-1]} / {ctx[0]} | prefill tok/s at {ctx[-1]} |")
    lines = [head, "|" + "---|" * (len(ctx) + 4)]
    for name in result["exports"]:
        for mode in result["modes"]:
            mine = {r["context"]: r for r in result["rows"] if r["export"] == name and r["mode"] == mode}
            flat = result["flat"][name][mode]
            lines.append(f"| {Path(name).name} ({result['graph_formats'][name]}) | {mode} | "
                         + " | ".join(f"{mine[n]['decode_tok_s']:.2f}" for n in ctx)
                         + f" | {flat:.2f} | {mine[ctx[-1]]['prefill_tok_s']:.0f} |")
    return "\n".join(lines)


def plot_sweep(result: dict, path: str | Path) -> None:
    """PNG: decode tok/s against context length, one line per export and mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in result["exports"]:
        for mode in result["modes"]:
            pts = sorted((r["context"], r["decode_tok_s"]) for r in result["rows"]
                         if r["export"] == name and r["mode"] == mode)
            ax.plot(*np.array(pts).T, marker="o",
                    label=f"{Path(name).name} (format {result['graph_formats'][name]}), {mode}")
    ax.set_xlabel("context (tokens before decoding)")
    ax.set_ylabel("decode tok/s")
    ax.set_ylim(bottom=0)
    ax.set_title("Decode speed against context length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
