"""Constrained decoding: grammars (JSON schema, any JSON object, tool calls) as token masks, with llguidance.

llguidance (the grammar engine llama.cpp and onnxruntime-genai use; ``pip install llguidance``, in the
``serve`` extra) compiles a grammar against the export's ``tokenizer.json`` and gives, after any token prefix,
the set of tokens that may come next. :class:`Matcher` follows the generated tokens: each call names the tokens
generated so far (proposal prefix included); it rolls its llguidance matcher back to their common prefix with
what it consumed before and consumes the rest, so it rolls back with the KV cache without being told. Masks are
cached per prefix: the draft's row and the target's row after the same prefix cost one mask.
:meth:`Matcher.forced` gives the run of tokens the grammar forces after a prefix (what :mod:`.forced` proposes).

The runtime imports llguidance only when a constraint is used; without it a constraint is refused with a
ValueError naming the package.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# whitespace the JSON grammars allow between tokens: a space, or a newline and up to 20 spaces/tabs of indent
# (bounded, as llama.cpp's json-schema-to-grammar does, so that a model cannot loop on whitespace)
JSON_WHITESPACE = r"[ ]?|\n[ \t]{0,20}"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
MASK_CACHE = 64  # masks kept (one per token prefix)
FORCED_MAX = 16  # the longest forced run :meth:`Matcher.forced` looks for
LABELS = {"json_schema": "JSON schema", "json_object": "JSON object", "tool_calls": "tool call", "lark": "Lark grammar"}


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise ValueError("constrained decoding needs the llguidance package: pip install -e '.[serve]' in the "
                         "edgespec checkout (or pip install llguidance)") from None
    return llguidance


def _json_options() -> dict:
    return {"whitespace_pattern": JSON_WHITESPACE, "item_separator": ",", "key_separator": ":"}


@dataclass(frozen=True)
class Constraint:
    """A grammar the output must match: ``grammar`` is llguidance's grammar (JSON text), ``kind`` says what it is
    (``json_schema``, ``json_object``, ``tool_calls``, ``lark``). Build one with the class methods; each checks
    the grammar compiles.

    Raises (the class methods):
        ValueError: the schema or grammar is not valid (llguidance's message), or llguidance is not installed.
    """

    grammar: str
    kind: str

    @classmethod
    def json_schema(cls, schema: dict) -> "Constraint":
        """JSON text that validates against ``schema`` (a JSON Schema object; llguidance's supported subset)."""
        if not isinstance(schema, dict):
            raise ValueError(f"a JSON schema must be an object, got {type(schema).__name__}")
        llg = _llguidance()
        try:
            g = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_json_options())
        except ValueError as e:
            raise ValueError(f"invalid JSON schema: {e}") from None
        return cls._checked(g, "json_schema")

    @classmethod
    def json_object(cls) -> "Constraint":
        """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
        return cls.json_schema({"type": "object"})._replace_kind("json_object")

    @classmethod
    def lark(cls, text: str) -> "Constraint":
        """A grammar in llguidance's Lark syntax (``%json {schema}`` embeds a JSON schema)."""
        return cls._checked(_llguidance().LLMatcher.grammar_from_lark(text), "lark")

    @classmethod
    def tool_calls(cls, tools: Sequence[dict], parallel: bool = True, single_tokens: bool = True) -> "Constraint":
        """One tool call (``parallel`` False) or one or more, in the Qwen2.5 / Hermes format the chat template
        asks for: ``<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>``, calls separated by a
        newline; the answer may end after any call, with or without a newline (Qwen2.5-Coder ends its turn
        ``</tool_call>\\n<|im_end|>``: were the newline only the way to a next call, it would be made to call
        again). ``tools``: OpenAI tool objects (``{"type": "function", "function": {"name", "parameters"}}``);
        each call's arguments match that function's ``parameters`` schema. ``single_tokens``: the tokenizer has
        ``<tool_call>`` and ``</tool_call>`` as added tokens (Qwen2.5's do), which the grammar then names as
        tokens; otherwise they are matched as text."""
        options = []
        for t in tools:
            f = t["function"]
            params = f.get("parameters") or {"type": "object"}
            options.append({"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": params},
                            "required": ["name", "arguments"], "additionalProperties": False})
        body = options[0] if len(options) == 1 else {"anyOf": options}
        # one line, as the template renders a call: ", " and ": " between items, no other whitespace
        body = {**body, "x-guidance": {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}}
        o, c = (TOOL_OPEN, TOOL_CLOSE) if single_tokens else (f'"{TOOL_OPEN}"', f'"{TOOL_CLOSE}"')
        call = f'{o} "\\n" body "\\n" {c}'
        more = ' ("\\n" call)*' if parallel else ""
        lark = f'start: call{more} "\\n"?\ncall: {call}\nbody: %json {json.dumps(body)}\n'
        return cls._checked(_llguidance().LLMatcher.grammar_from_lark(lark), "tool_calls")

    @classmethod
    def _checked(cls, grammar: str, kind: str) -> "Constraint":
        err = _llguidance().LLMatcher.validate_grammar(grammar)
        if err:
            raise ValueError(f"invalid {LABELS[kind]}: {err.splitlines()[0]}")
        return cls(grammar, kind)

    def _replace_kind(self, kind: str) -> "Constraint":
        return Constraint(self.grammar, kind)


_TOKENIZERS: dict = {}  # (id(tokenizer), width, stop ids) → (tokenizer, LLTokenizer): ~1 s to build for Qwen's


def ll_tokenizer(tokenizer, width: int, stop_ids: Sequence[int]):
    """llguidance's tokenizer for a ``tokenizers`` tokenizer over ``width`` ids, the stop ids as its EOS
    (built once per tokenizer)."""
    key = (id(tokenizer), width, tuple(sorted(stop_ids)))
    hit = _TOKENIZERS.get(key)
    if hit is None or hit[0] is not tokenizer:
        llg = _llguidance()
        # llguidance wants every id the tokenizer has (a GGUF-converted Qwen's [PAD…] fillers too); masks are
        # cut to ``width`` after
        n_vocab = max(width, tokenizer.get_vocab_size(with_added_tokens=True))
        hit = (tokenizer, llg.LLTokenizer(tokenizer.to_str(), n_vocab=n_vocab, eos_token=sorted(stop_ids)))
        _TOKENIZERS[key] = hit
    return hit[1]


class Matcher:
    """A constraint's matcher for one generation: :meth:`allowed` gives the mask after a token prefix.

    ``stop_ids``: the export's stop tokens, allowed (and only then) once the grammar is complete.
    """

    def __init__(self, constraint: Constraint, tokenizer, width: int, stop_ids: Sequence[int]):
        llg = _llguidance()
        self.width, self.stop_ids = width, np.asarray(sorted(stop_ids), dtype=np.int64)
        self.m = llg.LLMatcher(ll_tokenizer(tokenizer, width, stop_ids), constraint.grammar, log_level=0)
        if self.m.is_error():
            raise ValueError(f"the {LABELS[constraint.kind]} grammar does not compile: "
                             f"{self.m.get_error().splitlines()[0]}")
        self.consumed: list[int] = []
        self.cache: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self.forced_cache: OrderedDict[tuple, tuple[list[int], bool]] = OrderedDict()

    def _follow(self, generated: Sequence[int]) -> bool:
        """Roll back and consume so that the matcher has consumed ``generated``; False if the grammar refuses
        one of its tokens (the matcher then stands at the longest valid prefix)."""
        c, n = self.consumed, 0
        lim = min(len(c), len(generated))
        while n < lim and c[n] == generated[n]:
            n += 1
        if len(c) > n:
            self.m.rollback(len(c) - n)
            del c[n:]
        rest = [int(t) for t in generated[n:]]
        if rest:
            ok = self.m.validate_tokens(rest)  # never consume a refused token: it would end in an error state
            if ok and not self.m.consume_tokens(rest[:ok]):
                raise RuntimeError(f"llguidance refused tokens it validated: {self.m.get_error()}")
            c.extend(rest[:ok])
            return ok == len(rest)
        return True

    def allowed(self, generated: Sequence[int]) -> np.ndarray | None:
        """bool (width,): the tokens allowed after ``generated`` (the tokens generated so far), or None when
        the grammar refuses ``generated`` itself (a row that follows a rejected proposal token)."""
        key = tuple(generated)
        hit = self.cache.get(key)
        if hit is not None:
            self.cache.move_to_end(key)
            return hit
        if not self._follow(generated):
            return None
        bits = np.frombuffer(self.m.compute_bitmask(), dtype=np.uint8)
        mask = np.unpackbits(bits, bitorder="little")[:self.width].astype(bool)
        if mask.shape[0] < self.width:
            mask = np.concatenate([mask, np.zeros(self.width - mask.shape[0], dtype=bool)])
        mask[self.stop_ids[self.stop_ids < self.width]] = self.m.is_accepting()
        if not mask.any():  # the grammar is complete and allows no stop token we know: allow the stops anyway
            mask[self.stop_ids[self.stop_ids < self.width]] = True
        self.cache[key] = mask
        if len(self.cache) > MASK_CACHE:
            self.cache.popitem(last=False)
        return mask

    def forced(self, generated: Sequence[int], limit: int = FORCED_MAX) -> list[int]:
        """The tokens the grammar forces after ``generated``: the longest run (at most ``limit``, ≤
        :data:`FORCED_MAX`) of positions whose mask allows exactly one token, each after ``generated`` and the
        run before it; it ends after a stop token. [] when the next position has a choice (or ``generated``
        left the grammar).

        Under the mask p of each such token is 1, so proposed as a fixed proposal (one-hot q) it is accepted
        with probability 1. The masks it reads are the ones verifying the run needs (cached, :meth:`allowed`),
        so it costs no extra mask. (Stricter than llguidance's ``compute_ff_tokens``, the canonical
        tokenization of the forced bytes, which another tokenization of the same bytes may contradict.)"""
        limit = min(int(limit), FORCED_MAX)
        key = tuple(generated)
        hit = self.forced_cache.get(key)  # (run, whether it ended before its limit)
        if hit is not None and (hit[1] or len(hit[0]) >= limit):
            self.forced_cache.move_to_end(key)
            return hit[0][:limit]
        run, prefix, ended = [], list(key), False
        while len(run) < limit:
            mask = self.allowed(prefix + run)
            one = np.flatnonzero(mask) if mask is not None else ()
            if len(one) != 1:
                ended = True
                break
            run.append(int(one[0]))
            if run[-1] in self.stop_ids:
                ended = True
                break
        self.forced_cache[key] = (run, ended)
        if len(self.forced_cache) > MASK_CACHE:
            self.forced_cache.popitem(last=False)
        return list(run)
