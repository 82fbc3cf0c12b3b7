"""The draft's KV cache holds its view of the committed tokens (:meth:`edgespec.draft.model.DraftModel.view`)
through random sequences of what a server does to a decoder: generations with and without a draft prompt (draft
chain, tree, lookup or suffix beside the draft, plain), stopped part-way (a cancelled request) or left open while
a newer one starts (a replaced request), rewinds, and cached prefixes (``n_predict`` 0), greedy and sampled.

After each step every cached row is compared with a fresh run of the draft over its view: on the fp32 pair (rows
agree to float rounding), and on an int8-cache export with float32 prefill graphs (its float32 copy path,
:mod:`edgespec.io.kv_int8_copy`; rows there come from int8 and int4 graphs, so only a row of another token or
position, which differs by about the rows' own size, is told apart).
"""

import numpy as np
import pytest

from edgespec import SpecDecoder
from edgespec.engine.generation import GenerationOptions

PROPOSERS = [("draft",), ("tree",), ("lookup", "draft"), ("suffix", "tree"), ()]


@pytest.fixture(scope="module")
def int8_export(home, tiny_dirs, tmp_path_factory):
    """The tiny pair, int4, an int8 cache with float32 prefill graphs: exported under a home of its own, as its
    graph cache would change how tests/test_kv_int8_prefill.py's exports are derived (hard links)."""
    from conftest import edgespec_home
    from edgespec.export import ExportOptions, export_pair

    root = tmp_path_factory.mktemp("dp_ops")
    o = ExportOptions(precision="int4", graph_format=3, prefill_int8=True, kv_int8=True)
    with edgespec_home(str(root / "home")):
        return export_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), root / "kv8", o, o)


@pytest.fixture(scope="module", params=["fp32", "kv-int8"])
def case(request, tiny_export, int8_export):
    """(decoder, the largest per-position mean row difference allowed, as a fraction of the rows' mean size)."""
    if request.param == "fp32":
        return SpecDecoder.load(tiny_export), 1e-3
    return SpecDecoder.load(int8_export), 0.35


def _rows(cache) -> list[np.ndarray]:
    if hasattr(cache, "buffers"):  # in-place caches (formats 3, 4)
        return [np.asarray(b[:, :, :cache.length], np.float32) for b in cache.buffers]
    return [np.asarray(t, np.float32) for t in cache.tensors]


def _check(dec, tol: float, where: str) -> None:
    dm = dec.draft_model
    view = list(dm.view(dec.tokens))
    n = dm.cache.length
    assert n < len(view) or n == len(view) == 0, where  # `last` is never cached
    if dm.prompts is not None:
        assert dec.tokens[:len(dm.prompts[1])] == dm.prompts[1], where  # the view's target prompt is committed
    if n == 0:
        return
    fresh = dm.lm.new_cache()
    dm.lm.forward(view[:n], fresh)
    for a, b in zip(_rows(dm.cache), _rows(fresh)):
        diff = np.abs(a - b).mean(axis=(0, 1, 3))  # per position
        assert diff.max() <= tol * np.abs(b).mean(), (where, int(np.argmax(diff)), n)


@pytest.mark.parametrize("seed", range(4))
def test_the_draft_cache_holds_its_view_through_random_requests(case, seed):
    dec, tol = case
    rng = np.random.default_rng(seed)
    vocab = 300
    base = [int(t) for t in rng.integers(3, vocab, 200)]
    dec.reset()
    open_ = []  # generations left unfinished, replaced by newer ones
    for step in range(25):
        op = rng.choice(["generate", "generate", "generate", "rewind", "cache_prefix", "replace"])
        if rng.random() < 0.5 and dec.tokens:  # a follow-up: part of what is committed, then new tokens
            ids = dec.tokens[:int(rng.integers(1, len(dec.tokens) + 1))] + [
                int(t) for t in rng.integers(3, vocab, int(rng.integers(1, 8)))]
        else:
            ids = base[:int(rng.integers(5, 200))]
        ids = ids[:200]
        r = rng.random()
        if r < 0.3:
            dp = None
        elif r < 0.6:  # the prompt's end, as a FIM window
            dp = tuple(ids[-int(rng.integers(1, len(ids) + 1)):])
        else:  # any ids
            dp = tuple(int(t) for t in rng.integers(3, vocab, int(rng.integers(1, len(ids) + 1))))
        props = PROPOSERS[int(rng.integers(0, len(PROPOSERS)))]
        where = f"seed {seed} step {step} {op} prompt {len(ids)} draft prompt {dp and len(dp)} {props}"
        if op in ("generate", "replace"):
            o = GenerationOptions(max_new_tokens=int(rng.integers(1, 30)), k=int(rng.integers(1, 5)),
                                  proposers=props, draft_prompt=dp, temperature=float(rng.choice([0.0, 1.0])),
                                  seed=int(rng.integers(0, 100)) if rng.random() < 0.5 else None)
            chunks = dec.generate(input_ids=ids, options=o).chunks()
            stop_after = int(rng.integers(0, 40))
            for i, _ in enumerate(chunks):
                if i >= stop_after:  # a client that left
                    break
            if op == "replace":
                open_.append(chunks)
            else:
                chunks.close()
        elif op == "rewind" and dec.tokens:
            dec.rewind_to(int(rng.integers(1, len(dec.tokens) + 1)))
        elif op == "cache_prefix":
            dec.cache_prefix(ids, list(dp) if dp is not None else None)
        _check(dec, tol, where)
        if open_ and rng.random() < 0.5:  # a replaced generation ends late: it leaves the newer one's state be
            open_.pop(0).close()
            _check(dec, tol, where + ", then an older generation closed")
