"""The decoder as a facade (issue 23): loading in io/loading.py with memory settings as a parameter, encoding in
io/encoding.py, a mode's options in engine/presets.py, the flag types shared by the CLI and ``edgespec voice``,
and the renamed in-place KV cache under its old name too."""

import pytest

from edgespec.cli import main
from edgespec.engine import presets
from edgespec.engine.decoder import SpecDecoder
from edgespec.io.loading import check_export, open_export
from edgespec.io.onnx_model import InPlaceKVCache, SessionMemory, SharedKVCache


def test_the_former_cache_name_is_the_in_place_cache():
    assert SharedKVCache is InPlaceKVCache


def test_load_passes_the_memory_settings_to_both_sessions(tiny_export):
    dec = SpecDecoder.load(tiny_export, memory=SessionMemory(cpu_arena=False, mem_pattern=False))
    for lm in (dec.target, dec.draft):
        so = lm.session.get_session_options()
        assert not so.enable_cpu_mem_arena and not so.enable_mem_pattern
    default = SpecDecoder.load(tiny_export, load_draft=False).target.session.get_session_options()
    assert default.enable_cpu_mem_arena and default.enable_mem_pattern


def test_open_export_gives_what_load_builds_the_decoder_from(tiny_export):
    m = check_export(tiny_export)
    e = open_export(tiny_export, m, load_draft=False, context_length=64)
    assert e.manifest == m and e.draft is None and e.template is not None
    assert e.context_length == min(64, m.target.context_length, m.draft.context_length)
    dec = SpecDecoder.load(tiny_export, load_draft=False, context_length=64)
    assert dec.context_length == e.context_length and dec.n_tokens == dec.encoder.n_tokens
    msgs = [{"role": "user", "content": "hello"}]
    assert dec.encode(messages=msgs) == dec.encoder.encode(messages=msgs)
    with pytest.raises(ValueError, match=r"input_ids\[1\] must be an integer token id"):
        dec.check_ids([1, 2.0])


def test_a_mode_maps_to_its_proposers_and_fixed_k():
    plain = presets.generation_options("plain", max_new_tokens=5)
    assert plain.proposers == () and plain.k == presets.DEFAULT_K and plain.max_new_tokens == 5
    fixed_tree = presets.generation_options("spec", tree=True, k=2)
    assert fixed_tree.proposers == ("lookup", "tree") and fixed_tree.k == fixed_tree.n_nodes == 2
    assert presets.mode_proposers("spec", lookup=False, suffix=True, tree=True) == ("suffix", "draft", "tree")
    assert presets.mode_proposers("lookup") == ("lookup",)


def test_voice_takes_provider_options_and_refuses_a_malformed_one(capsys):
    assert main(["voice", "--say", "hello", "--provider-option", "novalue"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["edgespec: error: --provider-option expects KEY=VALUE, got 'novalue'"]
