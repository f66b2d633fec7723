"""Bit-exact validation of the Triton kernels against the emulator.

:func:`validate` runs any encode-like callable (yours or one of fpsim's) on the inputs where
a rounding can go wrong (:func:`input_sets`) and compares its codes with
:func:`fpsim.emulate.element.encode`, zero tolerance; :func:`validate_decode` does the same
for decode kernels. :func:`validate_all` does that for every registered kernel x format x
rounding mode (:data:`KERNELS`; more kernels register themselves with
:func:`register_kernel`), and :func:`main` is the ``fpsim validate-kernels`` command
(:func:`add_parser` wires it into a parent parser).

Modules, each imported by the ones after it and never the other way round:

* ``common``: the results (:class:`Case`, :class:`Mismatch`) and the helpers every
  validation shares (codes field by field, random words, the sample trace's tensors);
* ``inputs``: the input sets of the cast validations (:func:`input_sets`);
* ``cast``: :func:`validate` and :func:`validate_decode`;
* ``blocks``: block recipes (``blocks.encode_blocks``) against
  :func:`fpsim.emulate.blocks.encode_blocks`, codes and scale codes;
* ``accumulate``: ``accumulate.matmul`` against :func:`fpsim.accumulate.matmul` for each
  accumulator format;
* ``optim``: the fused optimizer step ``optim.adamw_step`` against its numpy twin;
* ``registry``: :class:`KernelSpec`, :data:`KERNELS` and :func:`validate_all`;
* ``cli``: the command line (:func:`add_parser`, :func:`run_args`, :func:`main`,
  :func:`print_report`); ``python -m fpsim.kernels.validate`` runs :func:`main`.

Importing this package imports neither torch nor triton; the kernels run in Triton's
interpreter on CPU tensors and compiled on GPU tensors (:mod:`fpsim.kernels._loader`).
"""

from __future__ import annotations

from .cast import validate, validate_decode
from .cli import add_parser, main, print_report, run_args
from .common import Case, Mismatch
from .inputs import InputSet, input_sets
from .registry import KERNELS, KernelSpec, register_kernel, validate_all

__all__ = [
    "Case",
    "Mismatch",
    "InputSet",
    "KernelSpec",
    "KERNELS",
    "register_kernel",
    "input_sets",
    "validate",
    "validate_decode",
    "validate_all",
    "add_parser",
    "run_args",
    "print_report",
    "main",
]
