"""``fpsim validate-kernels``: the Triton kernels against the emulator, bit for bit.

The command is defined with the kernels (:func:`fpsim.kernels.validate.add_parser`, which
imports neither torch nor triton); this module wires it into ``fpsim``'s parser.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``validate-kernels`` command to an argparse ``subparsers`` object; returns its parser."""
    from ..kernels.validate import add_parser as add_validate_kernels

    return add_validate_kernels(subparsers)
