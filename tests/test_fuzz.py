"""Fuzzing the two things an export directory feeds the runtime as data and code: ``edgespec.json`` and the
chat template (issue 18). Seeded, a few hundred cases each; every case ends in a load (and a short
generation) that works, or an EdgespecError/ValueError with a one-line message, never another exception,
and a path leading outside the export is refused, never read."""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest

from edgespec.engine.decoder import SpecDecoder
from edgespec.errors import EdgespecError
from edgespec.io.text import ChatTemplate
from tinymodels import CHATML

N_MANIFESTS = 240
N_TEMPLATES = 300
PATH_FIELDS = [("target", "path"), ("draft", "path"), ("tokenizer",), ("chat_template",), ("draft", "kept_token_ids"),
               ("target", "kept_token_ids")]
ODD_VALUES = [None, "", "x", -1, 0, 1, 2, 3, 10 ** 30, -(10 ** 30), 1.5, float("inf"), [], {}, True, [1, "a"],
              {"a": 1}, "\udcff", "../../outside/model.onnx", "/etc/hostname", "..\\x", "target", "a" * 5000]


@pytest.fixture(scope="module")
def fuzz_dir(tiny_export, tmp_path_factory):
    """A copy of the tiny export, and next to it an 'outside' directory holding valid copies of its files:
    a manifest that reaches outside would load successfully from there, so refusal is observable."""
    root = tmp_path_factory.mktemp("fuzz")
    d = root / "export"
    shutil.copytree(tiny_export, d)
    outside = root / "outside"
    shutil.copytree(tiny_export, outside)
    for f in ("model.onnx", "model.onnx.data"):
        shutil.copy(tiny_export / "target" / f, outside / f)
    return d


def _leaves(d, prefix=()):
    """Every (path of keys) in a nested dict/list."""
    out = []
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else []
    for k, v in items:
        out.append(prefix + (k,))
        out += _leaves(v, prefix + (k,))
    return out


def _set(m, path, value):
    for k in path[:-1]:
        m = m[k]
    m[path[-1]] = value


def _delete(m, path):
    for k in path[:-1]:
        m = m[k]
    del m[path[-1]]


def _mutate(base: dict, rng: np.random.Generator) -> tuple[dict, bool]:
    """A mutated manifest, and whether a path in it leads outside the export directory."""
    m = copy.deepcopy(base)
    outside = False
    for _ in range(int(rng.integers(1, 4))):
        kind = rng.integers(0, 5)
        leaves = _leaves(m)
        if kind == 0 and leaves:  # delete a field
            path = leaves[rng.integers(len(leaves))]
            try:
                _delete(m, path)
            except (KeyError, IndexError, TypeError):
                pass
        elif kind == 1 and leaves:  # change a value's type or range
            path = leaves[rng.integers(len(leaves))]
            try:
                _set(m, path, copy.deepcopy(ODD_VALUES[rng.integers(len(ODD_VALUES))]))
            except (KeyError, IndexError, TypeError):
                pass
        elif kind == 2:  # out-of-range token ids
            st = m.get("special_tokens")
            if isinstance(st, dict):
                key = ["bos", "eos", "pad", "stop"][rng.integers(4)]
                big = int(rng.choice([400, 511, 512, 10 ** 6, 2 ** 63, -1]))
                st[key] = [2, big] if key == "stop" else big
        elif kind == 3:  # a path leading outside
            field = PATH_FIELDS[rng.integers(len(PATH_FIELDS))]
            target = ["../outside/model.onnx", "../outside/tokenizer.json", "../outside/chat_template.jinja",
                      "../../x", "/etc/hostname", "target/../../outside/tokenizer.json"][rng.integers(6)]
            try:
                _set(m, field, target)
                outside = True
            except (KeyError, TypeError):
                pass
        else:  # shape numbers off by one
            block = m.get(["target", "draft"][rng.integers(2)])
            if isinstance(block, dict):
                key = ["num_layers", "num_kv_heads", "head_dim", "vocab_size", "context_length"][rng.integers(5)]
                if isinstance(block.get(key), int):
                    block[key] += int(rng.choice([-1, 1]))
    return m, outside


def test_fuzz_manifest(fuzz_dir):
    base = json.loads((fuzz_dir / "edgespec.json").read_text())
    rng = np.random.default_rng(18)
    outcomes = {"loaded": 0, "refused": 0}
    for case in range(N_MANIFESTS):
        m, outside = _mutate(base, rng)
        (fuzz_dir / "edgespec.json").write_text(json.dumps(m))
        try:
            dec = SpecDecoder.load(fuzz_dir)
            g = dec.generate(messages=[{"role": "user", "content": "def add"}], max_new_tokens=3, k=2).run()
            assert len(g.token_ids) <= 3
            outcomes["loaded"] += 1
            assert not outside, (case, m)  # a manifest reaching outside must never load
        except (EdgespecError, ValueError) as e:
            msg = str(e)
            assert msg and "\n" not in msg and "Traceback" not in msg, (case, msg)
            if outside:
                assert ("inside the export directory" in msg or "leads outside" in msg or "is missing" in msg
                        or "must be" in msg or "field is missing" in msg or "not an edgespec manifest" in msg), (case, msg)
            outcomes["refused"] += 1
    (fuzz_dir / "edgespec.json").write_text(json.dumps(base))
    assert outcomes["loaded"] >= 5 and outcomes["refused"] >= N_MANIFESTS // 2, outcomes


SNIPPETS = [
    "{{ raise_exception('no') }}", "{{ messages.__class__.__mro__ }}", "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}", "{{ self.__init__.__globals__ }}", "{{ lipsum.__globals__ }}",
    "{% set x = messages.append(1) %}", "{{ messages.pop() }}", "{{ undefined_name.attr }}", "{{ 1 / 0 }}",
    "{{ 'a' * 100000000 }}", "{{ [0] * 100000000 }}", "{{ 9 ** 99999999 }}", "{% for i in range(10**9) %}{% endfor %}",
    "{{ range(10**8) | list }}", "{{ message['content'].__class__ }}", "{% if %}", "{% for %}", "{{ }}", "{% endfor %}",
    "{{ messages[0]['content'] | int }}", "{{ messages | length }}", "{{ add_generation_prompt.__class__ }}",
    "{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}", "{{ '%s' % messages }}", "{{ messages[999] }}",
    "{{ bos_token ~ eos_token }}", "{{ {}.update(a=1) }}", "{{ ''.format.__globals__ }}", "{{ config }}",
    "{{ request }}", "{{ namespace(a=1).a }}", "{{ joiner() }}",
]
SLOW = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def _template_case(rng: np.random.Generator) -> str:
    base = CHATML
    kind = rng.integers(0, 3)
    if kind == 0:  # insert one or two snippets somewhere
        for _ in range(int(rng.integers(1, 3))):
            at = int(rng.integers(len(base) + 1))
            base = base[:at] + SNIPPETS[rng.integers(len(SNIPPETS))] + base[at:]
        return base
    if kind == 1:  # truncate
        return base[: int(rng.integers(len(base)))]
    chars = list(base)  # delete or duplicate a few characters
    for _ in range(int(rng.integers(1, 4))):
        i = int(rng.integers(len(chars)))
        if rng.random() < 0.5:
            del chars[i]
        else:
            chars.insert(i, chars[i])
    return "".join(chars)


def test_fuzz_chat_template():
    rng = np.random.default_rng(1818)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi <|im_end|>"}]
    cases = [_template_case(rng) for _ in range(N_TEMPLATES)] + [SLOW, CHATML + SLOW]
    seen = {"ok": 0, "syntax": 0, "render": 0}
    for source in cases:
        try:
            t = ChatTemplate(source, name="fuzz.jinja")
        except EdgespecError as e:
            assert str(e).startswith("fuzz.jinja: chat template"), str(e)
            seen["syntax"] += 1
            continue
        try:
            out = t.render(copy.deepcopy(msgs))
        except ValueError as e:
            assert str(e).startswith("fuzz.jinja:") and "\n" not in str(e), str(e)
            seen["render"] += 1
            continue
        assert isinstance(out, str) and len(out) < 10 ** 6
        for leak in ("<class '", "<built-in", "<function ", "'__builtins__'", "<module '"):  # the sandbox held
            assert leak not in out, (source, out[:200])
        seen["ok"] += 1
    assert min(seen.values()) >= 10, seen
