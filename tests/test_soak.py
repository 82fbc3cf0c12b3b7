"""Soak (issue 18): 200 turns of `edgespec chat` on the tiny export in one session: RSS stays bounded, the
chat prints exactly what an in-process replay of the conversation gives, and greedy turns 1/10/50/100/200
equal a fresh run (caches emptied) on the same messages. The real-pair run (100 turns) is recorded in
docs/benchmarks.md (`python bench/soak.py`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from soak import soak  # noqa: E402


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads RSS from /proc (Linux)")
def test_chat_soak_200_turns(tiny_export, home):
    r = soak(tiny_export, turns=200, max_new_tokens=8, k=2, env=dict(os.environ, EDGESPEC_HOME=str(home)))
    rss = r["rss_mb"]
    print(r)
    assert sorted(rss) == [1, 10, 50, 100, 200]
    assert rss[200] - rss[10] < 40 and rss[200] < 1.3 * rss[10], rss  # no growth with the number of turns
    assert r["output_equals_replay"]
    assert r["fresh_equals_reused"] == {1: True, 10: True, 50: True, 100: True, 200: True}
    assert r["reply_chars"] > 200
