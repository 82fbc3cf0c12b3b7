"""JSON-schema output speed: edgespec plain vs its default mode vs llama.cpp with the same schema, in one run.

Each task is a chat prompt and a JSON Schema; every configuration decodes it greedily under the schema:
edgespec ``plain`` and ``adaptive+lookup`` (what ``chat``/``generate``/``serve`` run by default; under a schema
the decoder puts the ``grammar`` proposer first, which proposes the schema's forced tokens: edgespec/forced.py)
with the grammar mask (llguidance) on the target's p and the draft's q, and llama.cpp's ``llama-server`` (plain) with the schema
as its ``json_schema`` field (llama.cpp turns it into its own grammar). The prompt token ids are the same for
both (edgespec's tokenizer and chat template); the order of the configurations rotates per task and repeats
are interleaved, so a slow stretch of a shared machine hits all alike. Rates are decode tok/s (the first token,
from prefill, excluded; bench/llama_server.py has the definitions). Every output is checked to parse and
validate against its schema. The goal (issue 26): default ≥ 1.2× edgespec plain.

Usage (the real pair exported; llama.cpp built by ``python bench/peers_build.py``; a quiet machine):
    python bench/json_output.py --repeats 3 --out bench/results/json-output
    python bench/json_output.py --no-llama ...        # edgespec only
writes ``<out>.json`` and prints the markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from llama_server import LlamaServer, PeerMode, finish, parse_completion, post_json  # noqa: E402

from edgespec.io import paths  # noqa: E402
from edgespec.errors import EdgespecError  # noqa: E402

PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
    "languages": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age", "email", "languages"], "additionalProperties": False}
FUNCTION = {"type": "object", "properties": {
    "name": {"type": "string"}, "description": {"type": "string"},
    "parameters": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}, "type": {"enum": ["int", "str", "float", "bool", "list", "dict"]},
        "default": {"type": ["string", "null"]}}, "required": ["name", "type", "default"],
        "additionalProperties": False}},
    "returns": {"type": "string"}}, "required": ["name", "description", "parameters", "returns"],
    "additionalProperties": False}
ITEMS = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {
    "id": {"type": "integer"}, "title": {"type": "string"}, "done": {"type": "boolean"}},
    "required": ["id", "title", "done"], "additionalProperties": False}}}, "required": ["items"],
    "additionalProperties": False}
TASKS = [
    ("Describe a fictional Python developer as JSON with name, age, email and languages.", PERSON),
    ("Describe the Python function `def merge(a: dict, b: dict, overwrite: bool = True) -> dict` as JSON: its "
     "name, a description, its parameters (name, type, default) and what it returns.", FUNCTION),
    ("Give a to-do list of 6 items for setting up a Python project, as JSON: items with id, title and done.", ITEMS),
    ("Describe the function `def parse_args(argv: list, strict: bool = False, prog: str = 'tool') -> dict` as "
     "JSON: name, description, parameters (name, type, default) and returns.", FUNCTION),
]
EDGESPEC, LLAMA = "edgespec", "llama.cpp"


def _valid(text: str, schema: dict) -> bool:
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    try:
        import jsonschema
    except ImportError:
        return isinstance(obj, dict)
    try:
        jsonschema.validate(obj, schema)
        return True
    except jsonschema.ValidationError:
        return False


class EdgespecRunner:
    """One edgespec bench mode under the task's schema (a new adaptive controller per task)."""

    runtime = EDGESPEC

    def __init__(self, dec, mode_name: str):
        from edgespec.bench.runner import Mode

        self.dec, self.mode, self.mode_name = dec, Mode.parse(mode_name), mode_name

    def run(self, ids: list[int], schema: dict, max_new_tokens: int) -> dict:
        from edgespec.core.constrain import Constraint
        from edgespec.core.processors import Processing

        options = dataclasses.replace(self.mode.options(max_new_tokens, 0.0, 0),
                                      processing=Processing(constraint=Constraint.json_schema(schema)))
        policy = self.mode.controller(self.dec) if self.mode.k is None and options.proposers else None
        self.dec.reset()
        g = self.dec.generate(input_ids=ids, options=options, policy=policy).run()
        s = g.stats
        return {"new_tokens": s.new_tokens, "decode_tok_s": s.decode_tokens_per_s, "e2e_tok_s": s.tokens_per_s,
                "alpha": s.alpha if options.proposers else None, "stop": s.stop_reason, "text": g.text,
                "tokens": g.token_ids, "plain_steps": s.plain_steps,
                "proposers": {name: dataclasses.asdict(ps) for name, ps in s.proposers.items()}}


class LlamaRunner:
    """llama.cpp plain with the schema as ``json_schema`` on ``POST /completion``."""

    runtime, mode_name = LLAMA, "plain"

    def __init__(self, server: LlamaServer, tokenizer):
        self.server, self.tok = server, tokenizer

    def run(self, ids: list[int], schema: dict, max_new_tokens: int) -> dict:
        body = {"prompt": list(map(int, ids)), "n_predict": int(max_new_tokens), "temperature": 0.0, "top_k": 1,
                "cache_prompt": False, "return_tokens": True, "stream": False, "json_schema": schema}
        res = post_json(self.server.url + "/completion", body, 600)
        rec = parse_completion(res, len(ids))
        rec["text"] = res.get("content", "")
        rec["stop"] = res.get("stop_type")
        return rec


def interleave(tasks, encoded, runners, max_new_tokens: int, repeats: int) -> list[dict]:
    """Every runner on every task, the order rotated per task, repeats interleaved; the median-rate repeat is
    kept, with ``valid`` (its output parses and matches the schema)."""
    runs = []
    for i, ((_, schema), ids) in enumerate(zip(tasks, encoded)):
        order = runners[i % len(runners):] + runners[:i % len(runners)]
        reps = {id(r): [] for r in order}
        for _ in range(repeats):
            for r in order:
                reps[id(r)].append(r.run(ids, schema, max_new_tokens))
        for r in order:
            rs = sorted(reps[id(r)], key=lambda x: x["decode_tok_s"])
            rec = dict(rs[(len(rs) - 1) // 2])
            rec.update(task=i, runtime=r.runtime, mode=r.mode_name, label=f"{r.runtime} {r.mode_name}",
                       prompt_tokens=len(ids), valid=all(_valid(x["text"], schema) for x in rs),
                       decode_tok_s_repeats=[x["decode_tok_s"] for x in rs])
            runs.append(rec)
    return runs


def summarize(runs: list[dict]) -> dict:
    """Per configuration: median decode tok/s, median per-task ratio to edgespec plain, all outputs valid."""
    plain = {r["task"]: r for r in runs if r["label"] == f"{EDGESPEC} plain"}
    out = {}
    for lab in dict.fromkeys(r["label"] for r in runs):
        sel = [r for r in runs if r["label"] == lab]
        ratios = [r["decode_tok_s"] / plain[r["task"]]["decode_tok_s"] for r in sel
                  if r["task"] in plain and plain[r["task"]]["decode_tok_s"] > 0]
        alphas = [r["alpha"] for r in sel if r.get("alpha") is not None]
        out[lab] = {"decode_tok_s": float(np.median([r["decode_tok_s"] for r in sel])),
                    "vs_edgespec_plain": float(np.median(ratios)) if ratios else None,
                    "alpha": float(np.mean(alphas)) if alphas else None,
                    "all_valid": all(r["valid"] for r in sel), "tasks": len(sel)}
    return out


def table(result: dict) -> str:
    lines = ["| runtime | mode | decode tok/s | vs edgespec plain | alpha | outputs valid |",
             "|---|---|---|---|---|---|"]
    for lab, s in result["summary"].items():
        rt, mode = lab.split(" ", 1)
        ratio = f"{s['vs_edgespec_plain']:.2f}×" if s["vs_edgespec_plain"] is not None else "—"
        alpha = f"{s['alpha']:.2f}" if s["alpha"] is not None else "—"
        lines.append(f"| {rt} | {mode} | {s['decode_tok_s']:.2f} | {ratio} | {alpha} | "
                     f"{'all' if s['all_valid'] else 'NOT all'} ({s['tasks']}) |")
    return "\n".join(lines)


def run(args) -> dict:
    import os
    from contextlib import ExitStack

    from edgespec.control.calibrate import calibrate
    from edgespec.engine.decoder import SpecDecoder

    export = Path(args.export).expanduser() if args.export else paths.default_export_dir()
    dec = SpecDecoder.load(export, threads=args.threads)
    runners: list = [EdgespecRunner(dec, m) for m in args.modes.split(",")]
    if "plain" not in [r.mode_name for r in runners]:
        raise EdgespecError("--modes must include plain (the ratios are against it)")
    tasks = TASKS[:args.tasks] if args.tasks else TASKS
    encoded = [dec.encode(messages=[{"role": "user", "content": t}]) for t, _ in tasks]
    if max(map(len, encoded)) + args.max_new_tokens > dec.context_length:
        raise EdgespecError(f"the tasks do not fit the export's {dec.context_length}-token context with "
                            f"--max-new-tokens {args.max_new_tokens}")
    dec.generate("Hello", max_new_tokens=4, k=2).run()  # warm-up: first runs allocate
    if any(r.mode.k is None for r in runners):
        calibrate(dec)
    load_start = os.getloadavg()
    with ExitStack() as stack:
        command = None
        if not args.no_llama:
            from peers import find_ggufs
            from peers_build import binaries, cache_dir

            target, draft = find_ggufs(export, args.target_gguf, args.target_gguf)  # plain: no draft used
            server_bin = binaries(args.llama_build or cache_dir() / "build").get("llama-server")
            if server_bin is None:
                raise EdgespecError("llama-server is not built: run `python bench/peers_build.py` first")
            srv = LlamaServer(server_bin, PeerMode("plain").server_args(target, draft, args.threads, 4096),
                              Path(str(args.out) + "-llama.log"))
            stack.enter_context(srv)
            command = " ".join(srv.command)
            runners.append(LlamaRunner(srv, dec.tokenizer))
        runs = interleave(tasks, encoded, runners, args.max_new_tokens, args.repeats)
    return {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": args.threads,
                        "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
            "export": str(export), "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
            "llama_server_command": command, "runs": runs, "summary": summarize(runs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export", nargs="?", help="export directory (default: the default pair in the user cache)")
    ap.add_argument("--modes", default="plain,adaptive+lookup", help="edgespec modes (default: %(default)s)")
    ap.add_argument("--tasks", type=int, default=0, help="first N tasks only (default: all)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repeats per task; the median is kept")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llama", action="store_true", help="edgespec only")
    ap.add_argument("--target-gguf", type=Path, help="target GGUF for llama.cpp (default: the export's source)")
    ap.add_argument("--llama-build", type=Path, help="llama.cpp cmake build dir (default: <cache>/peers/build)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/json-output"), help="writes OUT.json")
    return finish(ap.parse_args(argv), run, table)

if __name__ == "__main__":
    sys.exit(main())
