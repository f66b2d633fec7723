"""Triton kernels mirroring the emulator, imported as ``fpsim.kernels``.

Every kernel here has an emulator twin with the same signature and is compared with it bit
for bit (the README's "Architecture" and "Triton kernels" sections; the harness is
:mod:`fpsim.kernels.validate`). The emulator never imports this package; torch and
triton are imported lazily by the kernel modules themselves.

Modules:
    cast: portable encode / decode / quantize of torch tensors, integer bit operations
        only: bit-identical to :mod:`fpsim.emulate.element` for every format and rounding mode, in
        Triton's CPU interpreter and on a GPU; stochastic rounding from given random words
        or from an in-kernel Philox stream (``seed=``).
    hwcast: the GPU's own float8 / bfloat16 / float16 conversions (``.to(tl.float8e4nv)``
        and friends), with the emulator's saturation and overflow conventions; GPU only.
    blocks: block quantization (MX, NVFP4, Transformer Engine per-tensor / 1x128 / 128x128,
        block INT8 / FP8, bitsandbytes codebook): codes and scales bit-identical to
        :func:`fpsim.emulate.blocks.encode_blocks`, portable like ``cast``.
    metrics: the counts, sums and maxima of :mod:`fpsim.analysis.metrics` for a chunk (counts and
        maxima exact; float64 sums within a stated bound).
    accumulate: :func:`fpsim.matmul` / :func:`fpsim.dot` with limited-precision accumulation, bit for bit.
    philox: numpy Philox4x32-10, the words of ``tl.randint`` for the emulator.
    optim: the fused Adam / AdamW step with 8-bit or FP8 block states, bit-identical to one
        tensor-step of :func:`fpsim.replay.replay` (numpy twin ``adamw_step_reference``).
    arguments: the host side's kernel arguments shared by ``cast``, ``blocks`` and ``optim``
        (stochastic-rounding words, the grid).
    format_args: an element format as the kernels take it, one runtime and one constexpr
        tuple (:class:`~fpsim.formats.params.FormatParams`, ``FormatPaths``), and a block
        recipe's scale numbers (``ScaleArgs``).
    block_args: the block kernel's arguments as typed tuples (the tiling, the recipe's formats
        and scale numbers, its code paths).
    optim_args: the fused optimizer kernel's arguments as typed tuples (tensors, numbers and
        code paths of the master copy and of each state, the step's scalars).
    validate: the bit-exact validation harness (a package): ``validate``, ``validate_all``
        and the ``fpsim validate-kernels`` command (``main``, ``add_parser``).

The integer codes of the kernels' constexpr arguments (rounding mode, encoding, scale rule,
...) are the enums of ``_codes``, mapped from fpsim's enums there.

Tensors on the CPU run in Triton's interpreter and tensors on a GPU run compiled kernels,
whatever ``TRITON_INTERPRET`` says (``_loader``).
"""
