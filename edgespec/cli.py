"""The ``edgespec`` command's entry point (``edgespec.cli:main``, ``python -m edgespec.cli``): the CLI itself is
:mod:`edgespec.apps.cli`."""

import sys

from .apps.cli import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
