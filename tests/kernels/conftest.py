"""Run the kernel tests in Triton's CPU interpreter.

``TRITON_INTERPRET=1`` must be set before triton is imported: triton's own library
functions (``tl.randint``, ``tl.sum``, ...) are decorated with ``@triton.jit`` at that
import, and the interpreter cannot call compiled ones. fpsim's kernels pick the
interpreter for CPU tensors by themselves (``fpsim.kernels._loader``); the test kernels
written here (``tl.randint`` against ``philox_bits``) need the variable.
"""

from __future__ import annotations

import os
import sys

if "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"
