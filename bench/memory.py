"""Peak RSS of ``edgespec chat`` and ``edgespec generate --mode plain`` under several session memory settings.

Every (setting, command) runs in a fresh process, one after the other, in one invocation, so the figures are
side by side. A setting is a :class:`edgespec.io.onnx_model.SessionMemory` (``ort-defaults``: onnxruntime's own
defaults and no page release, edgespec's settings before issue 17; ``edgespec``: today's default). The chat is a scripted
conversation of ``--turns`` user turns with ``--max-new-tokens`` each (greedy, so every setting does the same
work); the target's KV cache reaches about 1,000 positions with the defaults. For each run: RSS after loading,
peak RSS (the kernel's ru_maxrss of the process), RSS growth per context token over the second half of the
conversation (MB/token, least squares over every target run), and decode tok/s (the mean of the turns').

    python bench/memory.py [EXPORT_DIR ...] [--settings ort-defaults,cpu_arena=0] [--commands chat,plain]
                           [--turns 8] [--max-new-tokens 120]

Several export directories (e.g. the same pair exported with ``--graph-format 2`` and ``3``) are measured one
after the other in the same invocation; ``DIR@SETTING,SETTING`` measures that directory under its own settings
instead of ``--settings`` (e.g. ``old-export@ort-defaults new-export@edgespec``). The setting
``checkout=PATH`` runs another source checkout of edgespec (``PYTHONPATH=PATH``, e.g. ``git archive`` of the
commit before a change) with its own defaults: the "before" of a change outside the session settings.

On a shared machine, hold its CPU lock around the command (``flock /work/locks/cpu.lock python bench/memory.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from edgespec.io import paths
from edgespec.io.manifest import load_manifest
from edgespec.io.onnx_model import SessionMemory

TURNS = [
    "Write a Python function that parses a CSV file into a list of dictionaries.",
    "Now add type hints and a docstring to it.",
    "Explain how a hash map handles collisions, briefly.",
    "Write a bash one-liner that counts lines in all .py files under a folder.",
    "What is the difference between a process and a thread?",
    "Write a unit test with pytest for the CSV function above.",
    "Rewrite the CSV function without the csv module.",
    "Summarise our conversation in three bullet points.",
    "Write a SQL query that returns the ten most recent orders per customer.",
    "How would you make that query fast on a large table?",
]

# The child: apply the setting (the CLI takes no memory settings: it runs under the module default, replaced
# here for this process only), record (target cache length, RSS MB) after every target run, run the CLI.
CHILD = r"""
import json, sys
import edgespec.io.onnx_model as om
om.DEFAULT_MEMORY = om.SessionMemory(**json.loads(sys.argv[1]))
log = open(sys.argv[2], "w")
forward = om.OnnxLM.forward
page_mb = __import__("os").sysconf("SC_PAGE_SIZE") / 2**20
def recorded(self, ids, cache, *a, **k):
    out = forward(self, ids, cache, *a, **k)
    if self.spec.path.startswith("target"):
        with open("/proc/self/statm") as f:
            rss, shared = (int(x) * page_mb for x in f.read().split()[1:3])
        log.write(f"{cache.length} {rss:.1f} {shared:.1f}\n")
    return out
om.OnnxLM.forward = recorded
from edgespec.cli import main
code = main(sys.argv[3:])
log.close()
sys.exit(code)
"""


# The soak child: the target alone, a 20-token prefill, then N one-token steps (no tokenizer involved, so it
# also runs on random-weight exports); same trace format as CHILD.
SOAK = r"""
import json, sys
import edgespec.io.onnx_model as om
from edgespec.io.manifest import load_manifest
setting = json.loads(sys.argv[1])  # {}: a source checkout's own defaults (it may predate OnnxLM's memory=)
memory = {"memory": om.SessionMemory(**setting)} if setting else {}
export, steps = sys.argv[3], int(sys.argv[4])
page_mb = __import__("os").sysconf("SC_PAGE_SIZE") / 2**20
om.use_shared_thread_pool()
lm = om.OnnxLM(load_manifest(export).target, export, **memory)
cache = lm.new_cache()
lm.forward(list(range(100, 120)), cache, keep=1)
t0 = __import__("time").perf_counter()
with open(sys.argv[2], "w") as log:
    for i in range(steps):
        lm.forward([100 + i % 300], cache)
        if i % 50 == 0 or i == steps - 1:
            with open("/proc/self/statm") as f:
                rss, shared = (int(x) * page_mb for x in f.read().split()[1:3])
            log.write(f"{cache.length} {rss:.1f} {shared:.1f}\n")
print(json.dumps({"stats": {"tokens_per_s": steps / (__import__("time").perf_counter() - t0)}}))
"""


# The breakdown child: RSS by kind (anonymous: packed weights, arena, KV, Python; file-backed: each graph's
# .data file, the rest) after each loading stage and after a prefill of one chunk (the decoder's
# PREFILL_CHUNK tokens, as a chat's first turn) + 16 one-token steps of each graph.
BREAKDOWN = r"""
import json, sys
from pathlib import Path
import edgespec.io.onnx_model as om
from edgespec.io.manifest import load_manifest
from edgespec.io.pages import mapped_rss
from edgespec.engine.decoder import PREFILL_CHUNK
memory = om.SessionMemory(**json.loads(sys.argv[1]))
export = Path(sys.argv[2])
m = load_manifest(export)
data = {r: export / (getattr(m, r).path + ".data") for r in ("target", "draft")}
stages = []
def stage(name):
    st = {k: int(v.split()[0]) / 1024 for k, v in (l.split(":", 1) for l in open("/proc/self/status"))
          if k in ("VmRSS", "RssAnon", "RssFile")}
    stages.append({"stage": name, "rss_mb": st["VmRSS"], "anon_mb": st["RssAnon"], "file_mb": st["RssFile"],
                   **{f"{r}_data_mb": mapped_rss([p]) / 2**20 for r, p in data.items()}})
stage("imports")
from tokenizers import Tokenizer
tok = Tokenizer.from_file(str(export / m.tokenizer))
stage("tokenizer")
om.use_shared_thread_pool()
lms = {}
for role in ("target", "draft"):
    lms[role] = om.OnnxLM(getattr(m, role), export, role=role, memory=memory)
    stage(f"{role} loaded")
for role, lm in lms.items():
    cache, v = lm.new_cache(), lm.spec.vocab_size
    n = min(PREFILL_CHUNK, lm.spec.context_length - 17)
    lm.forward([(1000 + i) % v for i in range(n)], cache, keep=1)
    for i in range(16):
        lm.forward([(2000 + i) % v], cache)
stage("prefill + 16 steps each")
print(json.dumps(stages))
"""


def run_breakdown(memory: SessionMemory, export: str) -> list[dict]:
    """RSS by kind (MB) after each loading stage of ``export``'s pair, in a fresh process."""
    p = subprocess.run([sys.executable, "-c", BREAKDOWN, json.dumps(dataclasses.asdict(memory)), export],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"memory bench: breakdown of {export} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _setting(name: str) -> SessionMemory | Path:
    """A named session setting, or the source checkout of ``checkout=PATH``."""
    if name.startswith("checkout="):
        path = Path(name.partition("=")[2]).expanduser()
        if not (path / "edgespec" / "__init__.py").is_file():
            raise SystemExit(f"memory bench: {path} is not an edgespec source checkout")
        return path
    return SessionMemory.named(name)


def run_one(memory: SessionMemory | Path, argv: list[str], stdin_text: str, tmp: Path, child: str = CHILD) -> dict:
    """One process: peak RSS (MB), RSS after the first target run, growth per context token, decode tok/s.
    ``memory`` a source checkout (Path): that checkout's code with its default settings."""
    trace = tmp / "trace.txt"
    (tmp / "stdin.txt").write_text(stdin_text)
    env = dict(os.environ, PYTHONPATH=str(memory)) if isinstance(memory, Path) else None
    setting = "{}" if isinstance(memory, Path) else json.dumps(dataclasses.asdict(memory))
    with open(tmp / "stdin.txt") as fin, open(tmp / "out.txt", "w") as fout, open(tmp / "err.txt", "w") as ferr:
        p = subprocess.Popen([sys.executable, "-c", child, setting, str(trace), *argv],  # cwd: not on sys.path
                             stdin=fin, stdout=fout, stderr=ferr, env=env, cwd=tmp)
        _, status, usage = os.wait4(p.pid, 0)
    err = (tmp / "err.txt").read_text()
    if status != 0:
        raise SystemExit(f"memory bench: {' '.join(argv)} failed:\n{err[-2000:]}")
    points = [tuple(map(float, line.split())) for line in trace.read_text().splitlines()]
    rates = [float(x) for x in re.findall(r"([\d.]+) tok/s", err)]
    if not rates:  # generate --json prints its stats as JSON
        rates = [json.loads((tmp / "out.txt").read_text())["stats"]["tokens_per_s"]]
    half = [pt for pt in points if pt[0] >= points[-1][0] / 2]
    slope = None
    if len(half) >= 2:
        xs, ys = [pt[0] for pt in half], [pt[1] for pt in half]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        den = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else None
    return {"peak_rss_mb": usage.ru_maxrss / 1024, "rss_first_run_mb": points[0][1],
            "file_backed_first_run_mb": points[0][2],
            "rss_end_mb": points[-1][1], "context_tokens": int(points[-1][0]),
            "growth_mb_per_token": slope, "decode_tok_s": sum(rates) / len(rates)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", default=[str(paths.default_export_dir())])
    ap.add_argument("--settings", default="edgespec", help="comma-separated SessionMemory.named() names")
    ap.add_argument("--commands", default="chat,chat-target-only,plain",
                    help="comma-separated: chat, chat-target-only, plain, breakdown (RSS by kind while loading)")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=120)
    ap.add_argument("--soak", type=int, default=0, metavar="N",
                    help="instead: the target alone, N one-token steps after a 20-token prefill (RSS growth per "
                         "context token; runs on random-weight exports too)")
    ap.add_argument("--out", default=None, help="also write the JSON result here")
    a = ap.parse_args()
    settings = {name: _setting(name) for name in a.settings.split(",")}
    chat_in = "\n".join((TURNS * 4)[:a.turns]) + "\n"
    result = {"command": "python bench/memory.py " + " ".join(sys.argv[1:]), "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for arg in a.dirs:
            d, _, own = arg.partition("@")
            d = str(Path(d).expanduser().resolve())  # the children run in a temporary directory
            dir_settings = {n: _setting(n) for n in own.split(",")} if own else settings
            fmt = load_manifest(d).target.graph_format
            commands = {
                "chat": (["chat", d, "--max-new-tokens", str(a.max_new_tokens)], chat_in),
                "chat-target-only": (["chat", d, "--mode", "plain", "--max-new-tokens", str(a.max_new_tokens)],
                                     chat_in),
                "plain": (["generate", d, "--json", "--mode", "plain", "--max-new-tokens", "256",
                           "--prompt", TURNS[0]], ""),
            }
            for cmd in ["soak"] if a.soak else a.commands.split(","):
                if cmd == "breakdown":
                    for name, mem in dir_settings.items():
                        if isinstance(mem, Path):
                            continue  # another checkout may not have edgespec.io.pages
                        stages = run_breakdown(mem, d)
                        result["runs"].append({"export": d, "graph_format": fmt, "command": cmd, "setting": name,
                                               "stages": stages})
                        for st in stages:
                            print(f"{Path(d).name} (format {fmt}) breakdown {name:13s} {st['stage']:24s} RSS "
                                  f"{st['rss_mb']:6.0f} MB = anonymous {st['anon_mb']:6.0f} + file-backed "
                                  f"{st['file_mb']:5.0f} (target .data {st['target_data_mb']:4.0f}, draft .data "
                                  f"{st['draft_data_mb']:4.0f})", flush=True)
                    continue
                argv, stdin_text = commands[cmd] if cmd != "soak" else ([d, str(a.soak)], "")
                for name, mem in dir_settings.items():
                    r = {"export": d, "graph_format": fmt, "command": cmd, "setting": name,
                         **run_one(mem, argv, stdin_text, Path(tmp), SOAK if cmd == "soak" else CHILD)}
                    result["runs"].append(r)
                    g = r["growth_mb_per_token"]
                    print(f"{Path(d).name} (format {fmt}) {cmd:17s} {Path(name).name:13s} peak {r['peak_rss_mb']:6.0f} MB"
                          f" | after first run "
                          f"{r['rss_first_run_mb']:6.0f} MB ({r['file_backed_first_run_mb']:.0f} file-backed) | end "
                          f"{r['rss_end_mb']:6.0f} MB at {r['context_tokens']} tokens | growth "
                          f"{'—' if g is None else f'{1024 * g:.0f} KB'}/token | decode {r['decode_tok_s']:.1f} tok/s",
                          flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
