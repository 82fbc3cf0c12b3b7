"""Drive a llama.cpp ``llama-server`` on loopback for the peers benchmark: start it, send one greedy completion
from token ids, and read its own timings (imported by ``bench/peers.py``, ``fim_bench.py``, ``json_output.py``).

Prompts go to ``POST /completion`` as token ids (the ids edgespec's tokenizer and chat template made), so both
runtimes prefill exactly the same tokens; ``cache_prompt`` is off so every request prefills from scratch.

llama-server's timings (tools/server/server-common.cpp of b11434): ``prompt_n`` tokens prefilled in
``prompt_ms`` (request start to the first sampled token); ``predicted_n`` new tokens, the first of which comes
from the prefill's logits, and ``predicted_ms`` from that first token to the last, so its decode rate is
``(predicted_n - 1) / predicted_ms`` — the same definition as edgespec's ``decode_tokens_per_s``. ``draft_n``
and ``draft_n_accepted`` are present only when it speculated.

Also the common end of the benchmark scripts that run against llama.cpp (:func:`finish`): run, write
``OUT.json`` atomically, print the markdown table, with errors as one line and exit status 1.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from edgespec.errors import EdgespecError


class PeerError(RuntimeError):
    """The peer server failed to start, answered an error, or its answer lacks a timings field (one line)."""


@dataclass(frozen=True)
class PeerMode:
    """One llama.cpp configuration: ``plain``, ``draft`` (the draft GGUF, up to ``draft_n_max`` tokens per
    round, llama.cpp's ``draft-simple``) or ``ngram`` (llama.cpp's ``ngram-simple`` prompt lookup)."""

    name: str
    draft_n_max: int = 3

    @staticmethod
    def parse(name: str) -> "PeerMode":
        """``plain``, ``ngram``, ``draft`` or ``draft<N>`` (N = ``--spec-draft-n-max``); ValueError otherwise."""
        if name in ("plain", "ngram", "draft"):
            return PeerMode(name)
        if name.startswith("draft") and name[5:].isdigit() and int(name[5:]) > 0:
            return PeerMode(name, draft_n_max=int(name[5:]))
        raise ValueError(f"unknown llama.cpp mode {name!r} (plain, draft, draft<N>, ngram)")

    def server_args(self, target: Path, draft: Path, threads: int, ctx: int) -> list[str]:
        """Command-line flags after the binary (flag names checked against common/arg.cpp of b11434)."""
        args = ["-m", str(target), "-c", str(ctx), "-t", str(threads), "-tb", str(threads), "-np", "1",
                "--no-webui", "--cache-ram", "0"]
        if self.name.startswith("draft"):
            args += ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(self.draft_n_max),
                     "-td", str(threads), "-tbd", str(threads)]
        elif self.name == "ngram":
            args += ["--spec-type", "ngram-simple"]
        return args


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_json(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise PeerError(f"{url}: HTTP {e.code}: {e.read()[:200]!r}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise PeerError(f"{url}: {e}") from None


def parse_completion(body: dict, prompt_tokens: int) -> dict:
    """One ``/completion`` answer → a bench record (rates in tok/s, times in ms).

    ``e2e_tok_s`` is new tokens over prefill + decode time (the server's clock, HTTP excluded);
    ``decode_tok_s`` excludes the first token, which prefill produced; ``prefill_tok_s`` is prompt tokens over
    the time to the first token. ``alpha`` is accepted / drafted tokens, None without speculation.

    Raises:
        PeerError: a timings field is missing, or the server prefilled another number of tokens than sent
        (a cached prefix, or a changed prompt).
    """
    t = body.get("timings")
    try:
        prompt_n, prompt_ms = int(t["prompt_n"]), float(t["prompt_ms"])
        n, gen_ms = int(t["predicted_n"]), float(t["predicted_ms"])
    except (KeyError, TypeError, ValueError):
        raise PeerError(f"llama-server answer has no usable timings: {str(t)[:200]}") from None
    if prompt_n != prompt_tokens:
        raise PeerError(f"llama-server prefilled {prompt_n} tokens of a {prompt_tokens}-token prompt "
                        f"(cache_n {t.get('cache_n')})")
    drafted, accepted = int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0))
    total_ms = prompt_ms + gen_ms
    return {
        "prompt_tokens": prompt_n, "new_tokens": n, "ttft_ms": prompt_ms, "wall_ms": total_ms,
        "prefill_tok_s": prompt_n / (prompt_ms / 1e3) if prompt_ms > 0 else 0.0,
        "e2e_tok_s": n / (total_ms / 1e3) if total_ms > 0 else 0.0,
        "decode_tok_s": (n - 1) / (gen_ms / 1e3) if n > 1 and gen_ms > 0 else 0.0,
        "drafted": drafted, "accepted": accepted, "alpha": accepted / drafted if drafted else None,
        "tokens": [int(x) for x in body.get("tokens") or []],
        "stop_type": body.get("stop_type"),
    }


class LlamaServer:
    """A ``llama-server`` process on 127.0.0.1 (a context manager: started on enter, stopped on exit).

    Raises PeerError when it exits or does not answer ``/health`` within ``start_timeout_s``."""

    def __init__(self, binary: str | Path, args: list[str], log_path: str | Path, start_timeout_s: float = 300):
        self.binary, self.args, self.log_path = Path(binary), list(args), Path(log_path)
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    @property
    def command(self) -> list[str]:
        return [str(self.binary), *self.args, "--host", "127.0.0.1", "--port", str(self.port)]

    def __enter__(self) -> "LlamaServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT)
        except OSError as e:
            self._log.close()
            raise PeerError(f"cannot start {self.binary}: {e.strerror}") from None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.__exit__()
                raise PeerError(f"{self.binary.name} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        self.__exit__()
        raise PeerError(f"{self.binary.name} did not become healthy in {self.start_timeout_s:.0f} s; see {self.log_path}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def complete(self, prompt_ids: list[int], n_predict: int, timeout_s: float = 600) -> dict:
        """Greedy completion of ``prompt_ids`` (int token ids) for up to ``n_predict`` tokens; returns
        ``parse_completion``'s record plus ``client_wall_ms`` (HTTP included). Raises PeerError."""
        body = {"prompt": list(map(int, prompt_ids)), "n_predict": int(n_predict), "temperature": 0.0,
                "top_k": 1, "cache_prompt": False, "return_tokens": True, "stream": False}
        t0 = time.perf_counter()
        res = post_json(self.url + "/completion", body, timeout_s)
        rec = parse_completion(res, len(prompt_ids))
        rec["client_wall_ms"] = (time.perf_counter() - t0) * 1e3
        return rec


def write_result(out: Path, result: dict) -> Path:
    """Write ``result`` to ``<out>.json`` through a temporary file (never a half-written result); returns the path."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.with_name(out.name + ".json")
    tmp = out.with_name(out.name + ".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)
    return path


def finish(args, run: Callable[[object], dict], table: Callable[[dict], str],
           after: Callable[[dict], None] | None = None) -> int:
    """``run(args)``, write it to ``args.out``, print ``table(result)`` then ``after(result)``. Returns the exit
    status: 1 (message on stderr, nothing written) on an ``EdgespecError``, ``PeerError`` or ``ValueError``."""
    try:
        result = run(args)
    except (EdgespecError, PeerError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_result(args.out, result)
    print(table(result))
    if after is not None:
        after(result)
    if "headline" in result:
        print(json.dumps(result["headline"], indent=1))
    return 0
