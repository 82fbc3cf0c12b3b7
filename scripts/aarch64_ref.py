"""x86 side of ``scripts/aarch64-check.sh``: build the tiny export, and judge aarch64 token ids against x86 ones.

    python scripts/aarch64_ref.py tiny OUT_DIR
        A tiny random qwen2 pair (int4 target, int8 draft) exported to OUT_DIR, reused when OUT_DIR already
        holds a complete export. Needs the exporter (``pip install -e '.[export,test]'``).
    python scripts/aarch64_ref.py divergence RESULTS_DIR
        The first index where RESULTS_DIR/aarch64-plain.json's greedy ids leave x86-plain.json's ("" if none).
    python scripts/aarch64_ref.py row EXPORT_DIR PROMPT IDS_JSON N OUT.npy
        This machine's plain-path logits row after PROMPT + the first N ids of IDS_JSON (run on aarch64).
    python scripts/aarch64_ref.py greedy EXPORT_DIR PROMPT TOKENS K OUT.json
        This machine's speculative greedy vs its own plain greedy under the verify-path rule (run on aarch64).
    python scripts/aarch64_ref.py verdict EXPORT_DIR PROMPT RESULTS_DIR LABEL
        Reads RESULTS_DIR/{x86,aarch64}-plain.json (``edgespec generate --json`` output), aarch64-row.npy
        (aarch64's row at the first divergence, if any), aarch64-greedy.json and {x86,aarch64}-chat.txt.
        Plain ids across the machines: equal, or a divergence that both machines' rows explain as a kernel
        flip (:func:`edgespec.bench.evaluate.compare_rows`: each row's argmax is its own token, the same two
        candidates on top); aarch64's speculative run: the verify-path rule on aarch64 itself. Prints one
        verdict line; exit code 0 when every comparison passes, 1 otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def tiny(out: Path) -> None:
    if (out / "edgespec.json").is_file():
        print(f"reusing tiny export {out}")
        return
    import tempfile

    sys.path.insert(0, str(REPO / "tests"))
    from tinymodels import build_model

    from edgespec.export import ExportOptions, export_pair

    with tempfile.TemporaryDirectory() as tmp:
        target = build_model(Path(tmp) / "target", "qwen2", seed=0, layers=2, hidden=64)
        draft = build_model(Path(tmp) / "draft", "qwen2", seed=0, noise=0.1)
        export_pair(str(target), str(draft), out, ExportOptions("int4", block_size=16), ExportOptions("int8"))
    print(f"tiny export written to {out}")


def _prompt_ids(dec, prompt: str) -> list[int]:
    return dec.encode(messages=[{"role": "user", "content": prompt}])


def row(export_dir: Path, prompt: str, ids_json: Path, n: int, out: Path) -> None:
    """Dump this machine's plain-path logits row after the prompt + the first ``n`` ids of ``ids_json``'s
    ``token_ids`` (float32 .npy), for :func:`edgespec.bench.evaluate.compare_rows` on the other side."""
    import numpy as np

    from edgespec.engine.decoder import SpecDecoder
    from edgespec.bench.evaluate import plain_row

    dec = SpecDecoder.load(export_dir, load_draft=False)
    ids = json.loads(ids_json.read_text())["token_ids"][:n]
    np.save(out, plain_row(dec, _prompt_ids(dec, prompt), ids))


def greedy(export_dir: Path, prompt: str, tokens: int, k: int, out: Path) -> None:
    """This machine's speculative greedy vs its own plain greedy under the verify-path rule
    (:func:`edgespec.bench.evaluate.greedy_check`), as JSON."""
    from edgespec.engine.decoder import SpecDecoder
    from edgespec.bench.evaluate import greedy_check

    dec = SpecDecoder.load(export_dir)
    r = greedy_check(dec, _prompt_ids(dec, prompt), tokens, k=k)
    keep = ("identical", "ok", "consistent", "first_divergence", "plain_gap", "delta", "plain_top2", "verify_top2",
            "near_tie", "problem", "plain_tokens", "spec_tokens")
    out.write_text(json.dumps({**{x: r[x] for x in keep}, "alpha": r["stats"].alpha}))


def divergence(results: Path) -> str:
    """The first index where aarch64's plain greedy ids leave x86's, or "" when they are equal."""
    a, b = (json.loads((results / f"{s}-plain.json").read_text())["token_ids"] for s in ("x86", "aarch64"))
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None and len(a) != len(b):
        i = min(len(a), len(b))
    return "" if i is None else str(i)


def verdict(export_dir: Path, prompt: str, results: Path, label: str) -> int:
    import numpy as np

    from edgespec.engine.decoder import SpecDecoder
    from edgespec.bench.evaluate import NEAR_TIE_LOGIT_GAP, compare_greedy

    dec = SpecDecoder.load(export_dir, load_draft=False)
    ids = _prompt_ids(dec, prompt)
    ref = json.loads((results / "x86-plain.json").read_text())["token_ids"]
    other = json.loads((results / "aarch64-plain.json").read_text())["token_ids"]
    arm_row = results / "aarch64-row.npy"
    r = compare_greedy(dec, ids, ref, other, np.load(arm_row) if arm_row.is_file() else None)
    ok = bool(r["ok"])
    if r["identical"]:
        parts = [f"plain {len(other)}/{len(ref)} token ids equal to x86"]
    else:
        parts = [f"plain diverges from x86 at token {r['first_divergence']} of {len(ref)} (x86 gap {r['gap']}, "
                 f"δ {r.get('delta')}, near-tie < {NEAR_TIE_LOGIT_GAP}: {r['gap'] is not None and r['gap'] < NEAR_TIE_LOGIT_GAP}; "
                 f"kernel flip by the two machines' rows: {'yes' if ok else 'NO: ' + str(r.get('problem'))})"]
    g = json.loads((results / "aarch64-greedy.json").read_text())
    ok &= g["ok"]
    parts.append(f"aarch64 spec (K=4, alpha {g['alpha']:.2f}) vs its own plain: " + (
        "identical" if g["identical"] else
        f"diverges at token {g['first_divergence']}, verify-path rule {'passes' if g['ok'] else 'FAILS'} "
        f"(plain gap {g['plain_gap']}, δ {g['delta']}{'; ' + g['problem'] if g['problem'] else ''})"))
    chat_x86, chat_arm = ((results / f"{s}-chat.txt").read_text() for s in ("x86", "aarch64"))
    chat_ok = bool(chat_arm.strip())
    ok &= chat_ok
    parts.append("chat " + ("same text as x86" if chat_arm == chat_x86 else
                            "replied (text differs from x86)" if chat_ok else "gave NO reply"))
    print(f"aarch64-check {label}: {'PASS' if ok else 'FAIL'}: " + "; ".join(parts))
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "tiny":
        tiny(Path(argv[1]))
        return 0
    if len(argv) == 5 and argv[0] == "verdict":
        return verdict(Path(argv[1]), argv[2], Path(argv[3]), argv[4])
    if len(argv) == 6 and argv[0] == "row":
        row(Path(argv[1]), argv[2], Path(argv[3]), int(argv[4]), Path(argv[5]))
        return 0
    if len(argv) == 6 and argv[0] == "greedy":
        greedy(Path(argv[1]), argv[2], int(argv[3]), int(argv[4]), Path(argv[5]))
        return 0
    if len(argv) == 2 and argv[0] == "divergence":
        print(divergence(Path(argv[1])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
