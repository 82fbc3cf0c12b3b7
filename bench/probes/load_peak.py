"""Load-time memory of one graph under session memory settings (issue 17): each (setting, repeat) in a fresh
process, one after the other, printing the load time (s), the peak RSS during the load (VmHWM) and the RSS after
it, in MB (MiB); and, once, the RSS of the tokenizer before and after ``pages.trim_heap``.

    python bench/probes/load_peak.py [EXPORT_DIR] [--role target] [--settings edgespec,ort-defaults] [--repeats 2]

A setting is an :meth:`edgespec.io.onnx_model.SessionMemory.named` name (``ort-defaults``: no page release;
``edgespec``: today's defaults, pages released while and after loading). The processes alternate between the
settings, so a setting that evicts the page cache (``MADV_PAGEOUT``) makes the next process read from disk.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from edgespec.io import paths

CHILD = r"""
import json, sys, time
def status():
    d = {l.split(":")[0]: int(l.split()[1]) / 1024 for l in open("/proc/self/status")
         if l.startswith(("VmRSS", "VmHWM"))}
    return d["VmRSS"], d["VmHWM"]
import edgespec.io.onnx_model as om
from edgespec.io.manifest import load_manifest
export, role, setting = sys.argv[1:4]
if setting == "tokenizer":
    from edgespec.io.pages import trim_heap
    from edgespec.io.text import load_tokenizer
    m, before = load_manifest(export), status()[0]
    tok = load_tokenizer(__import__("pathlib").Path(export) / m.tokenizer)
    loaded = status()[0]
    trim_heap()
    print(json.dumps({"before_mb": before, "loaded_mb": loaded, "trimmed_mb": status()[0]}))
    sys.exit()
memory = om.SessionMemory.named(setting)
m = load_manifest(export)
om.use_shared_thread_pool()
t0 = time.perf_counter()
lm = om.OnnxLM(getattr(m, role), export, role=role, memory=memory)
seconds = time.perf_counter() - t0
rss, hwm = status()
print(json.dumps({"load_s": seconds, "peak_mb": hwm, "after_mb": rss}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?", default=str(paths.default_export_dir()))
    ap.add_argument("--role", choices=("target", "draft"), default="target")
    ap.add_argument("--settings", default="edgespec,ort-defaults")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()

    def child(setting: str) -> dict:
        out = subprocess.run([sys.executable, "-c", CHILD, a.dir, a.role, setting], capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"load peak: the {setting} process failed: {out.stderr.strip().splitlines()[-1:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    t = child("tokenizer")
    print(f"tokenizer: RSS {t['before_mb']:.0f} -> {t['loaded_mb']:.0f} MB loaded -> {t['trimmed_mb']:.0f} MB "
          "after trim_heap")
    for r in range(a.repeats):
        for s in a.settings.split(","):
            d = child(s)
            print(f"{a.role} {s:14} repeat {r + 1}: load {d['load_s']:.1f} s, peak {d['peak_mb']:.0f} MB, "
                  f"after {d['after_mb']:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
