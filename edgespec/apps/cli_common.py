"""What the ``edgespec`` commands share: the export directory an argument names (or the default pair, exported on
first use), stdin as text, the ``--provider-option`` flags as a dict, and writing a JSON result file."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import EdgespecError
from ..io import paths
from ..io.paths import check_out, write_json  # noqa: F401  (the commands' result files)

NO_EXPORTER = ("the exporter is not installed: pip install -e '.[export]' in the edgespec checkout, or copy an "
               "export directory made elsewhere and name it (README, \"Raspberry Pi\")")


def export_dir(arg: str | None, auto_export: bool) -> Path:
    """The export directory ``arg``, or (None) the default pair's in the user cache, exported first when it is not
    there yet and ``auto_export``. Raises EdgespecError: the exporter is needed but not installed."""
    if arg is not None:
        return Path(arg).expanduser()  # a quoted "~/…" as well
    d = paths.default_export_dir()
    if not (d / "edgespec.json").is_file() and auto_export:
        try:
            from edgespec.export import export_pair
        except ImportError:  # a runtime-only install: say so before promising an export
            raise EdgespecError(f"the default pair {paths.DEFAULT_PAIR} is not exported in {d}, and "
                                + NO_EXPORTER) from None
        print(f"edgespec: the default pair {paths.DEFAULT_PAIR} is not exported yet; exporting it to {d} "
              "(once; takes several minutes)", file=sys.stderr)
        export_pair(None, None, profile="auto")
    return d


def read_stdin() -> str:
    """All of stdin as text; undecodable bytes are an error naming stdin (never a traceback)."""
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EdgespecError(f"stdin is not valid UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r})") from None


def provider_options(a) -> dict:
    """The parsed ``--provider-option KEY=VALUE`` flags of ``a``. Raises EdgespecError: an item without ``=``."""
    from ..io.onnx_model import parse_provider_options

    return parse_provider_options(a.provider_option)


def add_provider_options(p) -> None:
    """``--provider`` and ``--provider-option`` (an argparse parser's)."""
    p.add_argument("--provider", default="cpu",
                   help="execution provider: cpu, xnnpack, qnn, nnapi, coreml, openvino, … (default cpu); "
                        "CPU with a notice when it is missing or rejects a graph")
    p.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the execution provider, e.g. backend_path=libQnnHtp.so (repeatable)")
