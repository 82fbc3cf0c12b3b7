"""x86 side of ``scripts/aarch64-check.sh``: build the tiny export, and judge aarch64 token ids against x86 ones.

    python scripts/aarch64_ref.py tiny OUT_DIR
        A tiny random qwen2 pair (int4 target, int8 draft) exported to OUT_DIR, reused when OUT_DIR already
        holds a complete export. Needs the exporter (``pip install -e '.[export,test]'``).
    python scripts/aarch64_ref.py verdict EXPORT_DIR PROMPT RESULTS_DIR LABEL
        Reads RESULTS_DIR/{x86,aarch64}-{plain,spec}.json (``edgespec generate --json`` output) and
        RESULTS_DIR/{x86,aarch64}-chat.txt, compares the greedy token ids with
        :func:`edgespec.evaluate.compare_greedy` (equal, or the first divergence at a near-tie of the x86
        target's logits) and prints one verdict line; exit code 0 when every comparison passes, 1 otherwise.
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


def verdict(export_dir: Path, prompt: str, results: Path, label: str) -> int:
    from edgespec.decoder import SpecDecoder
    from edgespec.evaluate import NEAR_TIE_LOGIT_GAP, compare_greedy

    dec = SpecDecoder.load(export_dir, load_draft=False)
    ids = dec.encode(messages=[{"role": "user", "content": prompt}])
    ref = json.loads((results / "x86-plain.json").read_text())["token_ids"]
    parts, ok = [], True
    for mode in ("plain", "spec"):
        run = json.loads((results / f"aarch64-{mode}.json").read_text())
        other = run["token_ids"]
        r = compare_greedy(dec, ids, ref, other)
        ok &= r["ok"]
        if mode == "spec":
            mode = f"spec (K=4, aarch64 alpha {run['stats']['alpha']:.2f})"
        if r["identical"]:
            parts.append(f"{mode} {len(other)}/{len(ref)} token ids equal")
        else:
            parts.append(f"{mode} diverges at token {r['first_divergence']} of {len(ref)} (x86 top-1/top-2 gap "
                         f"{r['gap']:.4f}, near-tie < {NEAR_TIE_LOGIT_GAP}: {'yes' if r['ok'] else 'NO'})")
    chat_x86, chat_arm = ((results / f"{s}-chat.txt").read_text() for s in ("x86", "aarch64"))
    chat_ok = bool(chat_arm.strip())
    ok &= chat_ok
    parts.append("chat " + ("same text as x86" if chat_arm == chat_x86 else
                            "replied (text differs from x86)" if chat_ok else "gave NO reply"))
    print(f"aarch64-check {label}: {'PASS' if ok else 'FAIL'}: " + "; ".join(parts) + " (vs x86 plain greedy)")
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "tiny":
        tiny(Path(argv[1]))
        return 0
    if len(argv) == 5 and argv[0] == "verdict":
        return verdict(Path(argv[1]), argv[2], Path(argv[3]), argv[4])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
