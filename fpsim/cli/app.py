"""The ``fpsim`` command line: the top-level parser and :func:`main`.

Each command is a module of this package with an ``add_parser(subparsers)`` that adds it
(its parser's ``run`` default runs it and returns the exit status): :mod:`.formats`,
:mod:`.analyze`, :mod:`.replay`, :mod:`.memory`, :mod:`.ab`, :mod:`.accumulate`,
:mod:`.validate` (``validate-kernels``), :mod:`.figures`, :mod:`.exhaustive` and :mod:`.diff`.
Bad input (ValueError, TypeError, OSError) and a missing optional dependency (one line with its
``pip install`` command) are reported on stderr as ``fpsim COMMAND: error: ...`` with exit
status 2; Ctrl-C ends a command with status 130 and no traceback (the long commands have
written what they finished). A bad trace (:class:`~fpsim.trace.TraceError`, a ValueError) is
such input.
"""

from __future__ import annotations

import argparse
import sys

from . import ab, accumulate, analyze, diff, exhaustive, figures, formats, memory, replay, validate
from .formats import format_rows
from .output import missing_dependency

__all__ = ["build_parser", "format_rows", "main"]

_COMMANDS = {
    "formats": formats,
    "analyze": analyze,
    "replay": replay,
    "memory": memory,
    "ab": ab,
    "accumulate": accumulate,
    "validate-kernels": validate,
    "figures": figures,
    "exhaustive": exhaustive,
    "diff": diff,
}
"""The command modules by command name, in the order ``fpsim --help`` lists them."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``fpsim`` parser with every command, or with ``command`` only (what :func:`main`
    parses with when the command line names one: the other commands' options list what they
    must import, the replay's presets, the kernels)."""
    p = argparse.ArgumentParser(
        prog="fpsim", description="See what low-precision number formats do to your tensors."
    )
    p.add_argument("--version", action="version", version=f"fpsim {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in _COMMANDS.items():
        if command is None or name == command:
            module.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv[0] if argv and argv[0] in _COMMANDS else None).parse_args(argv)
    try:
        return args.run(args)
    except ImportError as err:  # an optional dependency: say which and how to install it
        if (err.name or "").startswith("fpsim"):
            raise  # fpsim's own module: a bug, not a missing dependency
        print(f"fpsim {args.command}: error: {missing_dependency(err, args.command)}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError) as err:  # bad input: say what and where, exit 2
        print(f"fpsim {args.command}: error: {str(err).replace(chr(10), ' ')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fpsim {args.command}: interrupted", file=sys.stderr)
        return 130


def _version() -> str:
    """The installed distribution's version (pyproject.toml's)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fpsim")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
