"""Acceptance of the two sampling rules on one export: accept/reject (Leviathan et al. 2023) vs the Gumbel coupling.

    python bench/probes/coupling_alpha.py EXPORT_DIR [--per-class 2] [--seeds 3] [--k 4] [--max-new-tokens 64]
                                   [--temperature 0.8 --top-p 0.95] [--out bench/results/coupling-alpha.json]

For every built-in prompt, every seed and both rules, one speculative generation with a fixed K (the draft chain);
reports alpha (accepted / evaluated draft tokens) per class and overall, and the mean tokens per round. The
standard rule accepts with probability 1 − TV(p, q) per position; the coupling with at least (1 − TV)/(1 + TV)
(Daliri et al. 2024), so its alpha is lower by construction and this measures by how much on real models. Counts,
not timings: it may run beside other work. Prints a Markdown table; ``--out`` also writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from edgespec import SpecDecoder  # noqa: E402
from edgespec.bench.prompts import builtin  # noqa: E402

RULES = ("standard", "gumbel")


def measure(export_dir, per_class: int, seeds: int, k: int, max_new_tokens: int, temperature: float,
            top_p: float) -> dict:
    dec = SpecDecoder.load(export_dir)
    counts = defaultdict(lambda: [0, 0, 0, 0])  # (rule, class) → accepted, evaluated, tokens, rounds
    for prompt in builtin(per_class):
        ids = dec.encode(messages=list(prompt.messages))
        if len(ids) + max_new_tokens >= dec.context_length:
            continue  # does not fit this export's context
        for seed in range(seeds):
            for rule in RULES:
                dec.reset()
                s = dec.generate(input_ids=ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                 top_p=top_p, seed=seed, k=k, coupling=rule).run().stats
                for key in ((rule, prompt.cls), (rule, "all")):
                    c = counts[key]
                    c[0] += s.accepted
                    c[1] += s.evaluated
                    c[2] += s.new_tokens
                    c[3] += s.rounds
    rows = {f"{rule}/{cls}": {"alpha": c[0] / c[1] if c[1] else None, "evaluated": c[1],
                              "tokens_per_round": c[2] / c[3] if c[3] else None}
            for (rule, cls), c in sorted(counts.items())}
    return {"export": str(export_dir), "k": k, "temperature": temperature, "top_p": top_p, "seeds": seeds,
            "per_class": per_class, "max_new_tokens": max_new_tokens, "rows": rows}


def table(r: dict) -> str:
    classes = sorted({key.split("/", 1)[1] for key in r["rows"]}, key=lambda c: (c == "all", c))
    out = ["| class | alpha, accept/reject | alpha, Gumbel coupling | ratio | tokens/round (a/r, Gumbel) |",
           "|---|---|---|---|---|"]
    for cls in classes:
        a, g = r["rows"][f"standard/{cls}"], r["rows"][f"gumbel/{cls}"]
        ratio = g["alpha"] / a["alpha"] if a["alpha"] and g["alpha"] is not None else None
        out.append(f"| {cls} | {a['alpha']:.3f} | {g['alpha']:.3f} | {ratio:.2f} | "
                   f"{a['tokens_per_round']:.2f}, {g['tokens_per_round']:.2f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export_dir")
    ap.add_argument("--per-class", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    r = measure(a.export_dir, a.per_class, a.seeds, a.k, a.max_new_tokens, a.temperature, a.top_p)
    r["command"] = "python bench/probes/coupling_alpha.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(table(r))
    if a.out:
        a.out.write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
