"""``edgespec complete``: fill in the middle from the command line (code before and after the cursor from files
or flags, other files of the repository as context), for scripts; the same prompt as ``edgespec serve``'s
``/infill`` (:mod:`.fim`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import EdgespecError
from .fim import DEFAULT_FILENAME, DEFAULT_REPO, DRAFT_WINDOW, FimPrompt, MiddleCutter, build_ids, draft_prompt_for, \
    fim_tokens
from ..core.stats import format_stats


def add_draft_window(p) -> None:
    """``--draft-window``: the tokens of the draft's FIM prompt (:func:`~edgespec.apps.fim.build_draft_ids`)."""
    from ..engine import flags

    p.add_argument("--draft-window", type=flags.nonneg_int, default=DRAFT_WINDOW, metavar="TOKENS",
                   help="fill-in-the-middle: the draft model reads about this many tokens around the cursor "
                        "instead of the whole prompt (a shorter catch-up; the output is the same); 0: the whole "
                        "prompt (default %(default)s)")


def add_arguments(p) -> None:
    """The flags of ``complete`` besides the generation options."""
    p.add_argument("--prefix-text", help="the code before the cursor")
    p.add_argument("--prefix-file", help="file holding the code before the cursor ('-': stdin)")
    p.add_argument("--suffix-text", help="the code after the cursor (--suffix is the suffix-tree proposer)")
    p.add_argument("--suffix-file", help="file holding the code after the cursor ('-': stdin)")
    p.add_argument("--extra-file", action="append", default=[], metavar="PATH",
                   help="another file of the repository as context (repeatable; named by PATH)")
    p.add_argument("--file-name", default=DEFAULT_FILENAME, help="path of the file being completed")
    p.add_argument("--repo-name", default=DEFAULT_REPO, help="repository name in the repo-level prompt")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--n-indent", type=int, default=0,
                   help="stop at a line (after the first) indented by fewer characters (0: off)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the middle and stats")
    add_draft_window(p)


def _read(path: str, what: str, stdin) -> str:
    if path == "-":
        return stdin()
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise EdgespecError(f"{path}: not valid UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise EdgespecError(f"{what} {path}: {e.strerror or e}") from None


def _text(a, name: str, stdin) -> str:
    text, path = getattr(a, f"{name}_text"), getattr(a, f"{name}_file")
    if text is not None and path is not None:
        raise EdgespecError(f"give --{name}-text or --{name}-file, not both")
    if path is not None:
        return _read(path, f"--{name}-file", stdin)
    from ..io.text import check_text

    return check_text(text, f"--{name}-text") if text is not None else ""


def run_complete(a, load, gen_kwargs, stdin) -> int:
    """Run ``edgespec complete``: prints the middle (nothing added after it) and the stats line on stderr.

    Raises:
        EdgespecError: no prefix and no suffix, unreadable files, stdin used twice, or an export without FIM
            tokens.
    """
    if [a.prefix_file, a.suffix_file, *a.extra_file].count("-") > 1:  # stdin can be read once
        raise EdgespecError("only one of --prefix-file, --suffix-file and --extra-file can be stdin ('-')")
    if a.n_indent < 0:
        raise EdgespecError("--n-indent must be ≥ 0")
    prefix, suffix = _text(a, "prefix", stdin), _text(a, "suffix", stdin)
    if not prefix and not suffix:
        raise EdgespecError("nothing to complete: give --prefix-file/--prefix-text and/or --suffix-file/--suffix-text")
    for name in (a.file_name, a.repo_name):
        if "\n" in name:
            raise EdgespecError("--file-name and --repo-name must be one line")
    extra = tuple((p, _read(p, "--extra-file", stdin)) for p in a.extra_file)
    dec = load(a)
    tokens = fim_tokens(dec.tokenizer)
    if tokens is None:
        raise EdgespecError("this export has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, "
                            "<|fim_middle|>) in its tokenizer; use a FIM model such as Qwen2.5-Coder")
    fp = FimPrompt(prefix, suffix, extra, repo=a.repo_name, filename=a.file_name)
    ids = build_ids(dec.tokenizer, lambda: dec.plain_tokenizer, tokens, fp)
    if len(ids) >= dec.context_length:
        raise EdgespecError(f"the FIM prompt is {len(ids)} tokens; the context holds {dec.context_length}")
    dec.stop_ids = dec.stop_ids | tokens.stop_ids  # the middle ends at <|fim_pad|> and <|file_sep|> too
    kw = gen_kwargs(a, dec)
    room = dec.context_length - len(ids)
    from ..engine.generation import GenerationOptions

    if kw["options"].max_new_tokens > room:
        kw["options"] = GenerationOptions.with_fields(kw["options"], {"max_new_tokens": room})
    draft_ids = draft_prompt_for(dec, tokens, fp, a.draft_window, len(ids))
    if draft_ids is not None:
        kw["options"] = GenerationOptions.with_fields(kw["options"], {"draft_prompt": draft_ids})
    g = dec.generate(input_ids=ids, **kw)
    cutter = MiddleCutter(tuple(s for s in a.stop if s), a.n_indent)
    out = []
    chunks = g.chunks()
    try:
        for piece, _ in chunks:
            text = cutter.push(piece)
            if text and not a.json:
                sys.stdout.write(text)
                sys.stdout.flush()
            out.append(text)
            if cutter.hit:
                break
    finally:
        chunks.close()
    tail = cutter.flush()
    out.append(tail)
    if a.json:
        print(json.dumps({"text": "".join(out), "prompt_tokens": len(ids), "stop_type": cutter.stop_type or (
            "eos" if g.stats.stop_reason == "stop_token" else "limit"), "stats": g.stats.to_dict()}))
        return 0
    sys.stdout.write(tail)
    sys.stdout.flush()
    print(format_stats(g.stats), file=sys.stderr)
    return 0
