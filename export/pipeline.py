"""``edgespec export``: sources → pair check → per-model graph (cached, :mod:`.build`) → the export directory.

The export directory is assembled under ``.OUT.tmp<pid>`` next to ``out`` (manifest written last, with
every file's size and sha256), then swapped in under a lock (in the user cache); the previous export stays
until the new one is complete (see :func:`edgespec.io.paths.recover_export` for a crash in the swap). A
directory that is not an edgespec export, or an export holding files of its own, is never replaced
without ``force``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import edgespec
from edgespec import paths
from edgespec.errors import EdgespecError
from edgespec.io.integrity import sha256_file
from edgespec.io.manifest import MANIFEST_NAME, FileEntry, Manifest, SpecialTokens, graph_spec

from .build import DEFAULT_GRAPH_FORMAT, GRAPH_FORMATS, GRAPH_REVISIONS  # noqa: F401 (re-exported, public)
from .build import (GRAPH_FILES, ExportOptions, _default_format, _link_or_copy, _log, build_graph,
                    format_problem)
from .load import ModelInfo, check_pair, describe
from .profiles import apply_profile, not_applicable, resolve_profile
from .sources import Source, resolve_model, resolve_recipe_model


def _resolve(target: str | None, draft: str | None) -> tuple[str, Source, Source]:
    """(pair name, target source, draft source); a recipe name on either side fills the missing side."""
    from edgespec import models

    recipes = models.available()
    if target is None and draft is None:
        target = paths.DEFAULT_PAIR
    name_parts, out = [], {}
    for role, src in (("target", target), ("draft", draft)):
        if src is None:
            continue
        if src in recipes:
            recipe = models.load(src)
            out[role] = ("recipe", recipe, src)
        else:
            out[role] = ("src", src, src)
    for role in ("target", "draft"):
        if role not in out:
            other = out["draft" if role == "target" else "target"]
            if other[0] != "recipe":
                raise EdgespecError(f"--{role} is missing (give both --target and --draft, or a pair recipe: "
                                    f"{', '.join(recipes)})")
            out[role] = other
    sources = {}
    for role, (kind, val, label) in out.items():
        sources[role] = resolve_recipe_model(val[role], role) if kind == "recipe" else resolve_model(val)
        name_parts.append(label if kind != "recipe" else val["name"])
    name = name_parts[0] if name_parts[0] == name_parts[1] else "+".join(
        Path(p.rstrip("/")).name for p in name_parts)
    return name, sources["target"], sources["draft"]


def _resolve_graph_format(t_opts: ExportOptions, d_opts: ExportOptions, t_info: ModelInfo,
                          d_info: ModelInfo) -> tuple[ExportOptions, ExportOptions]:
    """Options with the graph format decided: an unset one becomes :data:`DEFAULT_GRAPH_FORMAT` when both models
    can be written as format 3, else 2 for both (one notice line); an explicit format is kept.

    Raises:
        EdgespecError: a format asked for a model it cannot express (before any graph is built).
    """
    for role, o, info in (("target", t_opts, t_info), ("draft", d_opts, d_info)):
        why = format_problem(info, o.graph_format) if o.graph_format is not None else None
        if why:  # before any graph is built
            raise EdgespecError(f"{role}: {why}" + (" (export with --graph-format 2)" if o.graph_format != 2 else ""))
    if t_opts.graph_format is not None and d_opts.graph_format is not None:
        return t_opts, d_opts
    fmt, why = _default_format((t_info, d_info))
    if why:
        _log(f"graph format 2: {why}")
    fill = lambda o: o if o.graph_format is not None else replace(o, graph_format=fmt)  # noqa: E731
    return fill(t_opts), fill(d_opts)


EXPORT_FILES = {MANIFEST_NAME, "tokenizer.json", "chat_template.jinja", "target", "draft"}


def _foreign(out: Path) -> list[str]:
    """Entries of an existing export directory that an export does not write (the user's own files)."""
    extra = [p.name for p in out.iterdir() if p.name not in EXPORT_FILES]
    for role in ("target", "draft"):
        if (out / role).is_dir():
            extra += [f"{role}/{p.name}" for p in (out / role).iterdir() if p.name not in GRAPH_FILES]
        elif (out / role).exists():
            extra.append(role)
    return sorted(extra)


def _check_out(out: Path, force: bool = False) -> None:
    """Refuse to replace anything but an edgespec export holding only its own files (unless ``force``)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise EdgespecError(f"{out}: exists and is not a directory")
    if out.is_dir() and not force:
        if any(out.iterdir()) and not (out / MANIFEST_NAME).is_file():
            raise EdgespecError(f"{out}: exists, is not empty and is not an edgespec export; refusing to replace "
                                "it (--force replaces it)")
        extra = _foreign(out) if (out / MANIFEST_NAME).is_file() else []
        if extra:
            shown = ", ".join(extra[:3]) + (", …" if len(extra) > 3 else "")
            raise EdgespecError(f"{out}: holds files that are not part of an edgespec export ({shown}); refusing "
                                "to replace it (move them, or --force deletes them)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        probe = out.parent / f".edgespec-probe{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise EdgespecError(f"{out}: output directory is not writable ({e.strerror})") from None


def export_pair(target: str | None, draft: str | None, out: str | Path | None = None,
                target_opts: ExportOptions = ExportOptions(), draft_opts: ExportOptions = ExportOptions(),
                force: bool = False, tune: bool = False, min_agreement: float | None = None,
                profile: str | None = None) -> Path:
    """Export a draft/target pair into ``out`` (default: the user cache, by pair name); returns ``out``.

    ``target``/``draft`` are GGUF files, Hugging Face directories, hub ids or pair recipe names (a recipe on
    one side supplies the other). An existing ``out`` is replaced only if it is an edgespec export holding
    nothing else, or with ``force``; it stays in place until the new export is complete. ``tune`` chooses each
    model's int4 layout by measurement on this machine (:func:`export.tune.tune`: the target's, the fastest at
    the default layout's accuracy or at ``min_agreement``; the draft's, by the speculative decoding speed its
    acceptance against the chosen target and its step time give). ``profile`` (``"auto"``, ``"small"`` or
    ``"full"``; :mod:`.profiles`) decides the optional graphs an option leaves unset (``prefill_int8``,
    ``kv_int8`` None) and is recorded in the manifest; None (the default): those pieces are off. Raises
    EdgespecError for any bad input, before heavy work where possible.
    """
    t0 = time.perf_counter()
    profile_name, profile_why = resolve_profile(profile) if profile is not None else ("small", None)
    if out is not None:
        paths.recover_export(Path(out))
        _check_out(Path(out), force)
    name, t_src, d_src = _resolve(target, draft)
    out = Path(out) if out is not None else paths.exports_dir() / name
    paths.recover_export(out)
    _check_out(out, force)
    _log(f"reading tokenizers and configs ({name})")
    t_info, d_info = describe(t_src, "target"), describe(d_src, "draft")
    check_pair(t_info, d_info)
    target_opts, draft_opts = _resolve_graph_format(target_opts, draft_opts, t_info, d_info)
    if profile_name == "full" and not tune:
        unused = [(r, not_applicable(o)) for r, o in (("target", target_opts), ("draft", draft_opts))]
        if all(why for _, why in unused):
            reasons = "; ".join(f"{r}: {why}" for r, why in unused)
            if profile == "full":  # asked for, and it would write nothing: say so before any work
                raise EdgespecError(f"--profile full adds nothing to this pair ({reasons}); drop it or use int4 "
                                    "weights")
            profile_name, profile_why = "small", f"{profile_why}, but full adds nothing here ({reasons})"
    cache = paths.cache_dir("graphs")
    scratch = None
    if cache is None:  # no user cache: build the graphs next to the output and drop them afterwards
        scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.graphs", dir=out.parent))
    try:
        graphs, why, bare = {}, {}, {}
        for role, info, opts in (("target", t_info, target_opts), ("draft", d_info, draft_opts)):
            wanted = apply_profile(profile_name, opts)
            if profile is not None:
                _log(f"{role}: profile {profile_name} ({profile_why}): {_pieces(wanted)}")
            if tune:
                opts, graphs[role], bare[role] = _tuned(info, opts, wanted, role, cache or scratch, min_agreement,
                                                        bare.get("target"))
            else:
                opts = wanted
                graphs[role] = build_graph(info, opts, role, cache or scratch)
            why[role] = opts.chosen_by or ("the default layout" if opts.layout == ExportOptions().layout
                                           else f"given ({opts.layout})")
        with paths.file_lock(_out_lock(out), f"writing {out}"):
            paths.recover_export(out)
            _check_out(out, force)
            _assemble(out, name, graphs, t_info, d_info, t0, why,
                      None if profile is None else (profile_name, profile_why))
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    _log(f"export complete: {out} ({time.perf_counter() - t0:.0f} s)")
    return out


def _out_lock(out: Path) -> Path:
    """The lock of an export directory: a file in the user cache (the output's own directory stays clean);
    without a writable cache, the output's parent directory itself."""
    key = hashlib.sha256(str(out.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:24]
    locks = paths.cache_dir("locks")
    return (locks / f"export-{key}.lock") if locks is not None else out.parent


def _tuned(info: ModelInfo, opts: ExportOptions, wanted: ExportOptions, role: str, cache: Path,
           min_agreement: float | None, target: tuple[Path, dict] | None) -> tuple[ExportOptions, tuple, tuple]:
    """``--tune`` for one model: the layout is chosen on its int4 graph alone (a draft against the ``target``'s);
    then the pieces ``wanted`` (the options with the profile applied) asks for are built on the chosen layout.
    Returns (options, (graph directory, metadata) to export, the int4 graph alone)."""
    from .tune import tune as tune_layout

    chosen, gdir, meta = tune_layout(info, replace(opts, prefill_int8=False, kv_int8=False), role, cache,
                                     min_agreement=min_agreement, target=target)
    opts = replace(chosen, prefill_int8=wanted.prefill_int8, kv_int8=wanted.kv_int8)
    if not (opts.prefill_int8 or opts.kv_int8):
        return opts, (gdir, meta), (gdir, meta)
    full_dir, full_meta = build_graph(info, opts, role, cache)
    full_meta = {**full_meta, "validation": {**full_meta["validation"], "tune": meta["validation"]["tune"]}}
    return opts, (full_dir, full_meta), (gdir, meta)


def _pieces(opts: ExportOptions) -> str:
    """The optional graphs of ``opts`` in words (the profile's log line)."""
    parts = [f"{opts.precision} graph"] + (["int8 prefill graph"] if opts.prefill_int8 else [])
    return " + ".join(parts + (["int8 KV cache"] if opts.kv_int8 else []))


def _assemble(out: Path, name: str, graphs: dict, t_info: ModelInfo, d_info: ModelInfo, t0: float,
              why: dict[str, str], profile: tuple[str, str] | None = None) -> None:
    """Write the export under ``.OUT.tmp<pid>`` (manifest last), then swap it in for ``out``; ``why`` is each
    role's ``Quantization.chosen_by``; ``profile``: (name, why) of the export profile, if one was applied."""
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        specs, files = {}, {}
        for role, (gdir, meta) in graphs.items():
            (tmp / role).mkdir()
            for f, entry in meta["files"].items():
                _link_or_copy(gdir / f, tmp / role / f)
                files[f"{role}/{f}"] = FileEntry(entry["size"], entry["sha256"])
            spec = graph_spec({"path": "model.onnx", **meta}, role)
            specs[role] = replace(spec, path=f"{role}/{spec.path}", kept_token_ids=spec.kept_token_ids and
                                  f"{role}/{spec.kept_token_ids}",
                                  prefill_path=spec.prefill_path and f"{role}/{spec.prefill_path}",
                                  kv_scales=spec.kv_scales and f"{role}/{spec.kv_scales}",
                                  quantization=replace(spec.quantization, chosen_by=why[role]))
        t_info.tokenizer.backend_tokenizer.save(str(tmp / "tokenizer.json"))
        template = None
        if t_info.chat_template:
            template = "chat_template.jinja"
            (tmp / template).write_text(t_info.chat_template, encoding="utf-8")
        for f in ("tokenizer.json", template):
            if f:
                files[f] = FileEntry((tmp / f).stat().st_size, sha256_file(tmp / f))
        manifest = Manifest(
            name=name, target=specs["target"], draft=specs["draft"], tokenizer="tokenizer.json",
            chat_template=template,
            special_tokens=SpecialTokens(bos=t_info.bos, eos=t_info.eos, pad=t_info.pad,
                                         stop=tuple(sorted(set(t_info.stop) | set(d_info.stop)))),
            tokenizer_sha256=t_info.tokenizer_sha256, edgespec_version=edgespec.__version__,
            export_seconds=round(time.perf_counter() - t0, 1), files=dict(sorted(files.items())),
            profile=profile and profile[0], profile_chosen_by=profile and profile[1],
        )
        (tmp / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")
        old = None
        if out.exists():  # from here until the next rename, recover_export() can finish the swap
            old = out.with_name(f".{out.name}.old{os.getpid()}")
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
