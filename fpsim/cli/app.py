"""The ``fpsim`` command line: the top-level parser and :func:`main`.

Each command is a module of this package with an ``add_parser(subparsers)`` that adds it
(its parser's ``run`` default runs it and returns the exit status): :mod:`.formats`,
:mod:`.analyze`, :mod:`.replay`, :mod:`.memory`, :mod:`.ab`, :mod:`.accumulate`,
:mod:`.validate` (``validate-kernels``), :mod:`.figures` and :mod:`.exhaustive`. Bad input
(ValueError, TypeError, OSError) is reported on stderr as ``fpsim COMMAND: error: ...`` with exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from . import ab, accumulate, analyze, exhaustive, figures, formats, memory, replay, validate
from .formats import format_rows

__all__ = ["build_parser", "format_rows", "main"]

_COMMANDS = (formats, analyze, replay, memory, ab, accumulate, validate, figures, exhaustive)
"""The command modules, in the order ``fpsim --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The ``fpsim`` parser with every command."""
    p = argparse.ArgumentParser(
        prog="fpsim", description="See what low-precision number formats do to your tensors."
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in _COMMANDS:
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, TypeError, OSError) as err:  # bad input: say what and where, exit 2
        print(f"fpsim {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
