"""Fused optimizer step: Adam / AdamW with block-quantized states and low-precision master weights.

:func:`adamw_step` runs one update of one tensor in a single Triton kernel (``_optim_kernel.py``):
decode the master parameter and both moments, do the update of :class:`fpsim.replay.optim.AdamW`
(or :class:`fpsim.replay.optim.Adam`, L2 decay) in float32 in its exact order of operations,
re-encode the moments with their block recipe and round the parameter once to the master
format. :func:`adamw_step_reference` is its emulator twin, with the same signature on numpy
arrays, built only from fpsim's public functions (:func:`fpsim.decode`, :func:`fpsim.encode`,
``fpsim.replay.optim.Adam.step``); it is exactly one tensor-step of :func:`fpsim.replay.engine.replay`
(semantics 2 to 4 of that module; the tests replay a trace and compare), and the kernel is
bit-identical to it (tests and ``fpsim validate-kernels --kernel optim.adamw_step``).

Supported:
    * optimizer: :class:`fpsim.replay.optim.AdamW` (decoupled decay) or :class:`fpsim.replay.optim.Adam`
      (L2 decay), any betas / eps / weight decay; ``lr`` and the 1-based update count
      ``step`` per call (the bias corrections are computed on the host in float64 as
      :mod:`fpsim.replay.optim` does and rounded to float32).
    * states (``m_recipe``, ``v_recipe``): ``"float32"`` (FP32 states, as the replay keeps
      for tensors below ``min_quantized_size``) or a flattened block recipe with the ABSMAX
      rule and 8-bit elements: :data:`STATE_RECIPES` (bitsandbytes dynamic maps, block
      INT8, block FP8 E4M3) or any :class:`~fpsim.formats.block.BlockFormat` of that kind
      (blocks of at most 8192 elements).
      When both states are quantized their blocks must have the same size.
    * master (``master``): ``"bfloat16"``, ``"float16"`` or ``"float32"``, rounded
      ``"nearest_even"`` or ``"stochastic"`` (32 random bits per element: ``random_bits``,
      or ``seed`` for Philox in the kernel, the words of
      :func:`fpsim.kernels.philox.philox_bits`).

Data (``n`` elements, ``p``'s shape; the kernel takes torch tensors, the twin numpy arrays):
    * ``p``: the master copy as codes: ``uint16`` (bfloat16 / float16) or ``uint32``
      (float32) arrays as :func:`fpsim.encode` returns them. The kernel also takes the
      matching torch float tensor (``torch.bfloat16`` ...) or ``int16`` / ``int32`` bit
      patterns, and returns the new copy in the dtype it was given.
    * ``g``: the float32 gradient the optimizer sees (unscaled; the kernel also takes
      bfloat16 / float16, widened exactly).
    * states: FP32: float32 values of ``p``'s shape, scales ``None``. Block recipes:
      ``uint8`` codes of ``p``'s shape and one float32 scale per block of the flattened
      tensor as ``uint32`` bit patterns (:class:`fpsim.BlockCodes` ``codes`` / ``scales``;
      the kernel also takes int32 or float32 scale tensors).

Not covered (done by the replay around the step, or not at all): gradient formats, loss
scaling and skipped steps, Kahan-compensated masters, master formats other than the three
above, state recipes with other scale rules (MX, per-tensor), lookup-table codebooks
(``lut_bins``) and SGD.

On the CPU the kernel runs in Triton's interpreter; on a GPU compiled with fma contraction
off (``enable_fp_fusion=False``); see ``_optim_kernel.py`` for the arithmetic and
:mod:`fpsim.kernels.optim_args` for its arguments.

NaNs: in the interpreter the kernel reproduces the twin's NaN bits too; a GPU's arithmetic
gives the canonical NaN 0x7FFFFFFF where numpy keeps sign and payload, so NaN codes are
compared by class (any NaN equals any NaN) by the validation.

Example::

    import torch
    from fpsim.kernels import blocks, cast
    from .optim import adamw_step, adamw_step_reference

    p, g = cast.encode(torch.randn(1000), "bfloat16"), torch.randn(1000)  # uint16 codes
    mc, ms, _ = blocks.encode_blocks(torch.zeros(1000), "bnb_dynamic8_block256")
    vc, vs, _ = blocks.encode_blocks(torch.zeros(1000), "bnb_dynamic8u_block256")
    kw = dict(lr=1e-3, step=1, m_recipe="bnb_dynamic8_block256", v_recipe="bnb_dynamic8u_block256")
    out = adamw_step(p, g, mc, ms, vc, vs, **kw)  # one kernel launch
    ref = adamw_step_reference(*(t.numpy() for t in (p, g, mc, ms, vc, vs)), **kw)  # numpy twin
    assert all((a.numpy() == b).all() for a, b in zip(out, ref))
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from fpsim.emulate import decode, encode
from fpsim.emulate.blocks import BlockCodes
from fpsim.formats import (
    RECIPES,
    BlockFormat,
    Codebook,
    Format,
    IntFormat,
    RoundMode,
    ScaleRule,
    get_format,
)
from fpsim.replay.optim import Adam, AdamW, Sqrt

from ._codes import Random, Source
from ._loader import is_interpreted, kernel_module, require_torch
from ._loader import launch as _launch_kernel
from .arguments import i32, stochastic_source
from .optim_args import MasterTensors, StateTensors, adam_args, master_paths, state_args, state_tables

__all__ = [
    "AdamStep",
    "MASTER_FORMATS",
    "STATE_RECIPES",
    "adamw_step",
    "adamw_step_reference",
    "replay_random_bits",
    "state_recipe",
]

_F32 = np.float32
MASTER_FORMATS = ("bfloat16", "float16", "float32")
"""Master formats of :func:`adamw_step`."""
_ROUNDINGS = (RoundMode.NEAREST_EVEN, RoundMode.STOCHASTIC)
_TILE_GPU = 2048  # elements per program on a GPU
_TILE_CPU = 1 << 14  # the interpreter costs per program: few large tiles
_FP32_BLOCK = 1024  # tile row length when neither state has blocks
_MAX_BLOCK = 8192  # one block is one row of a program's tile


class AdamStep(NamedTuple):
    """The new master codes and states of one step (torch tensors from the kernel, numpy
    arrays from the twin). ``m_scales`` / ``v_scales`` are None for FP32 states."""

    p: Any
    m_codes: Any
    m_scales: Any
    v_codes: Any
    v_scales: Any


# --- arguments -------------------------------------------------------------------------------


def _supported(bf: BlockFormat) -> bool:
    el = bf.element
    if bf.rule is not ScaleRule.ABSMAX or not bf.flatten or bf.block is None or len(bf.block) != 1:
        return False
    if not 1 <= bf.block[0] <= _MAX_BLOCK:
        return False
    if isinstance(el, Codebook):
        return not el.lut_bins and len(el.values) <= 256
    if isinstance(el, IntFormat):
        return el.bits <= 8
    return el.bits <= 8 and el.signed and el.has_zero and el.min_exponent >= -126


STATE_RECIPES = tuple(name for name, bf in RECIPES.items() if _supported(bf))
"""Preset block recipes :func:`adamw_step` takes for the states (besides ``"float32"``)."""


def state_recipe(arg: str, recipe: Any) -> BlockFormat | None:
    """The block recipe of a state argument, None for FP32 states; ValueError naming ``arg``
    and the allowed values for anything else."""
    allowed = "'float32' or one of " + ", ".join(STATE_RECIPES)
    allowed += f" (or a flattened ABSMAX BlockFormat, blocks of at most {_MAX_BLOCK}, 8-bit elements)"
    try:
        fmt = get_format(recipe)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{arg} must be {allowed}; got {recipe!r}") from e
    if isinstance(fmt, Format) and fmt.name == "float32":
        return None
    if not isinstance(fmt, BlockFormat) or not _supported(fmt):
        raise ValueError(f"{arg} must be {allowed}; got {getattr(fmt, 'name', recipe)!r}")
    return fmt


def _master(master: Any) -> Format:
    try:
        fmt = get_format(master)
    except (KeyError, TypeError, ValueError):
        fmt = None
    if not isinstance(fmt, Format) or fmt.name not in MASTER_FORMATS:
        name = getattr(fmt, "name", master)
        raise ValueError(f"master must be one of {', '.join(MASTER_FORMATS)}; got {name!r}")
    return fmt


def _rounding(rounding: Any) -> RoundMode:
    mode = RoundMode.parse(rounding)
    if mode not in _ROUNDINGS:
        raise ValueError(f"rounding must be nearest_even or stochastic; got {mode.value!r}")
    return mode


def _optimizer(optimizer: Any) -> Adam:
    opt = AdamW() if optimizer is None else optimizer
    if not isinstance(opt, Adam):
        raise TypeError(f"optimizer must be fpsim.replay.optim.Adam or AdamW; got {type(opt).__name__}")
    if opt.sqrt is not Sqrt.IEEE:
        raise ValueError(
            f"the kernel takes the correctly rounded square root (sqrt='ieee'); got sqrt={opt.sqrt.value!r}"
        )
    return opt


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
        raise ValueError(f"step must be the 1-based update count (an int >= 1); got {step!r}")
    return int(step)


def _block(mrec: BlockFormat | None, vrec: BlockFormat | None) -> int:
    sizes = {r.block[0] for r in (mrec, vrec) if r is not None}
    if len(sizes) > 1:
        raise ValueError(
            f"m_recipe and v_recipe must have the same block size for the fused step; "
            f"got {mrec.name} ({mrec.block[0]}) and {vrec.name} ({vrec.block[0]})"
        )
    return sizes.pop() if sizes else _FP32_BLOCK


def replay_random_bits(seed: int, step: int, name: str, shape: tuple) -> np.ndarray:
    """The random words :func:`fpsim.replay.replay` draws for the stochastic master rounding of
    tensor ``name`` at recorded step ``step`` (its ``seed``): ``random_bits_at(seed ^
    crc32(f"{step}:{name}"), 0, size)`` (:func:`fpsim.replay.storage.master_seed`), shaped.
    Pass them as ``random_bits`` to reproduce a replay step (checked against the replay in the
    tests)."""
    from fpsim.emulate.random import random_bits_at
    from fpsim.replay.storage import master_seed

    n = math.prod(shape)
    return random_bits_at(master_seed(seed, step, name), 0, n).reshape(shape)


# --- the emulator twin ------------------------------------------------------------------------


def adamw_step_reference(
    p: np.ndarray,
    g: np.ndarray,
    m_codes: np.ndarray,
    m_scales: np.ndarray | None,
    v_codes: np.ndarray,
    v_scales: np.ndarray | None,
    *,
    lr: float,
    step: int,
    optimizer: Adam | None = None,
    m_recipe: Any,
    v_recipe: Any,
    master: Any = "bfloat16",
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    random_bits: np.ndarray | None = None,
    seed: int | None = None,
) -> AdamStep:
    """One step of one tensor as :func:`fpsim.replay.engine.replay` does it, on numpy arrays.

    ``p = decode(p, master)``; states decoded (FP32 states as given); ``optimizer.step(p, g,
    states, lr, step)`` in float32 (:mod:`fpsim.replay.optim`); the new states encoded with their
    recipe (nearest-even); the FP32 parameter encoded once in ``master`` with ``rounding``.
    The arguments are those of :func:`adamw_step` (numpy arrays; see the module docstring),
    without ``inplace``; ``seed`` draws ``random_bits`` as
    :func:`fpsim.kernels.philox.philox_bits` (what the kernel's Philox gives).

    Returns:
        :class:`AdamStep` of numpy arrays: master codes (``master``'s code dtype), then codes
        and scales of each state (uint8 / uint32; FP32 states: float32 values and None).
    """
    opt, t = _optimizer(optimizer), _check_step(step)
    mfmt, mode = _master(master), _rounding(rounding)
    mrec, vrec = state_recipe("m_recipe", m_recipe), state_recipe("v_recipe", v_recipe)
    p = np.asarray(p)
    if p.dtype != np.dtype(mfmt.code_dtype):
        raise TypeError(f"p must hold {mfmt.name} codes ({mfmt.code_dtype}); got {p.dtype}")
    g = np.asarray(g)
    if g.dtype != _F32:
        if g.dtype.kind != "f" or g.dtype.itemsize != 2:
            raise TypeError(f"g must be float32 (or float16 / bfloat16); got {g.dtype}")
        g = g.astype(_F32)
    if g.shape != p.shape:
        raise ValueError(f"g has shape {g.shape}; p has {p.shape}")
    states = {
        "exp_avg": _decode_state("m", m_codes, m_scales, mrec, p.shape),
        "exp_avg_sq": _decode_state("v", v_codes, v_scales, vrec, p.shape),
    }
    kw: dict[str, Any] = {"rounding": mode}
    if mode is RoundMode.STOCHASTIC:
        kw["random_bits"] = _twin_bits(random_bits, seed, p.shape)
    elif random_bits is not None or seed is not None:
        raise ValueError("random_bits / seed are for rounding='stochastic' only")
    with np.errstate(all="ignore"):
        p_f32, new = opt.step(decode(p, mfmt), g, states, lr, t)
        m_new = _encode_state(new["exp_avg"], mrec)
        v_new = _encode_state(new["exp_avg_sq"], vrec)
        p_new = encode(p_f32, mfmt, **kw)
    return AdamStep(p_new, *m_new, *v_new)


def _decode_state(which: str, codes: Any, scales: Any, bf: BlockFormat | None, shape: tuple) -> np.ndarray:
    codes = np.asarray(codes)
    if codes.shape != shape:
        raise ValueError(f"{which}_codes has shape {codes.shape}; p has {shape}")
    if bf is None:
        if codes.dtype != _F32 or scales is not None:
            raise TypeError(
                f"FP32 state {which}: {which}_codes must be float32 values and {which}_scales None"
            )
        return codes
    if codes.dtype != np.uint8 or scales is None:
        raise TypeError(f"{which}_codes must be uint8 codes with {which}_scales for {bf.name}")
    scales = np.asarray(scales)
    nb = -(-codes.size // bf.block[0])
    if scales.size != nb or scales.dtype != np.uint32:
        raise ValueError(
            f"{which}_scales must be {nb} uint32 float32 bit patterns; got {scales.dtype} {scales.shape}"
        )
    return decode(BlockCodes(codes, scales.reshape(nb)), bf)


def _encode_state(x: np.ndarray, bf: BlockFormat | None) -> tuple[np.ndarray, np.ndarray | None]:
    if bf is None:
        return x, None
    enc = encode(x, bf)
    return enc.codes, enc.scales


def _twin_bits(random_bits: Any, seed: int | None, shape: tuple) -> np.ndarray:
    from .philox import philox_bits

    if (random_bits is None) == (seed is None):
        raise ValueError(
            "stochastic rounding takes random_bits= (uint32 words of p's shape) or seed=, one of them"
        )
    if seed is not None:
        return philox_bits(seed, math.prod(shape)).reshape(shape)
    bits = np.asarray(random_bits)
    if bits.dtype != np.uint32 or bits.shape != shape:
        raise ValueError(f"random_bits must be uint32 of shape {shape}; got {bits.dtype} {bits.shape}")
    return bits


# --- the kernel ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _state_tables(bf: BlockFormat | None, device: str) -> tuple[Any, Any]:
    torch = require_torch()
    table, mids = state_tables(bf)
    return torch.from_numpy(table).to(device), torch.from_numpy(mids).to(device)


def _torch_dtype(torch: Any, fmt: Format) -> Any:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[fmt.name]


def _p_view(torch: Any, p: Any, fmt: Format) -> Any:
    """``p`` as int16 / int32 bits; TypeError unless its dtype fits the master format."""
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"p must be a torch tensor; got {type(p).__name__}")
    wide = fmt.bits == 32
    ok = {_torch_dtype(torch, fmt)} | ({torch.uint32, torch.int32} if wide else {torch.uint16, torch.int16})
    if p.dtype not in ok:
        names = ", ".join(sorted(str(d) for d in ok))
        raise TypeError(f"p must hold {fmt.name} codes or values ({names}); got {p.dtype}")
    return p.view(torch.int32 if wide else torch.int16)


def _state_tensors(torch, which, codes, scales, bf, p) -> tuple[Any, Any]:
    """(codes as int32 bits / uint8, scales as int32) of a state, checked."""
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"{which}_codes must be a torch tensor; got {type(codes).__name__}")
    if tuple(codes.shape) != tuple(p.shape) or codes.device != p.device:
        raise ValueError(
            f"{which}_codes must have p's shape {tuple(p.shape)} on {p.device}; "
            f"got {tuple(codes.shape)} on {codes.device}"
        )
    if bf is None:
        if codes.dtype != torch.float32 or scales is not None:
            raise TypeError(
                f"FP32 state {which}: {which}_codes must be float32 values and {which}_scales None"
            )
        return codes.view(torch.int32), None
    if codes.dtype != torch.uint8 or not isinstance(scales, torch.Tensor):
        raise TypeError(f"{which}_codes must be torch.uint8 codes with a {which}_scales tensor for {bf.name}")
    nb = -(-p.numel() // bf.block[0])
    if scales.numel() != nb or scales.dtype not in (torch.uint32, torch.int32, torch.float32):
        raise ValueError(
            f"{which}_scales must hold {nb} float32 scales (uint32 / int32 bits or float32); "
            f"got {scales.dtype} {tuple(scales.shape)}"
        )
    if scales.device != p.device:
        raise ValueError(f"{which}_scales is on {scales.device}; p is on {p.device}")
    return codes, scales.view(torch.int32)


def _gradient(torch: Any, g: Any, p: Any) -> tuple[Any, Source]:
    """``g`` as the kernel reads it (contiguous float32 / 16-bit bit patterns) and its
    :class:`Source`, after refusing a gradient that does not fit ``p`` (named)."""
    if not isinstance(g, torch.Tensor):
        raise TypeError(f"g must be a torch tensor; got {type(g).__name__}")
    g_src = {
        torch.float32: Source.FLOAT32,
        torch.float16: Source.FLOAT16,
        torch.bfloat16: Source.BFLOAT16,
    }.get(g.dtype)
    if g_src is None:
        raise TypeError(f"g must be float32, float16 or bfloat16; got {g.dtype}")
    if tuple(g.shape) != tuple(p.shape) or g.device != p.device:
        raise ValueError(
            f"g must have p's shape {tuple(p.shape)} on {p.device}; got {tuple(g.shape)} on {g.device}"
        )
    return g.contiguous().view(torch.int32 if g_src is Source.FLOAT32 else torch.int16), g_src


def _tiling(bsize: int, nb: int, interp: bool) -> tuple[int, int, tuple[int]]:
    """``(BP, K, grid)``: a block padded to a power of two, blocks per program (a tile of about
    the interpreter's or the GPU's size, no more than the tensor has) and the launch grid."""
    bp = 1 << max(0, (bsize - 1).bit_length())
    k = max(1, (_TILE_CPU if interp else _TILE_GPU) // bp)
    k = min(k, 1 << max(0, (nb - 1).bit_length()))
    return bp, k, (-(-nb // k),)


def adamw_step(
    p: Any,
    g: Any,
    m_codes: Any,
    m_scales: Any,
    v_codes: Any,
    v_scales: Any,
    *,
    lr: float,
    step: int,
    optimizer: Adam | None = None,
    m_recipe: Any,
    v_recipe: Any,
    master: Any = "bfloat16",
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    random_bits: Any = None,
    seed: int | None = None,
    inplace: bool = False,
) -> AdamStep:
    """One fused Adam / AdamW step of one tensor, bit-identical to :func:`adamw_step_reference`.

    Args:
        p: master copy (torch tensor): ``master`` codes (uint16 / int16, or uint32 / int32 for
            float32) or values of ``master``'s torch dtype.
        g: float32 (or bfloat16 / float16) gradient of ``p``'s shape.
        m_codes, m_scales: first moment: uint8 codes of ``p``'s shape and one float32 scale
            per block (uint32 / int32 bits or float32); FP32: float32 values and None.
        v_codes, v_scales: second moment, likewise.
        lr: learning rate of this step.
        step: the 1-based update count (Adam's ``t``).
        optimizer: :class:`fpsim.replay.optim.AdamW` (default ``AdamW()``) or
            :class:`fpsim.replay.optim.Adam`, with betas, eps and weight decay.
        m_recipe, v_recipe: ``"float32"`` or a block recipe of :data:`STATE_RECIPES`.
        master: ``"bfloat16"``, ``"float16"`` or ``"float32"``.
        rounding: of the master copy: ``"nearest_even"`` or ``"stochastic"``.
        random_bits: stochastic rounding: one uint32 word per element (torch.uint32 /
            int32 bit patterns of ``p``'s shape, or a numpy uint32 array).
        seed: stochastic rounding instead of ``random_bits``: element ``i`` uses
            ``tl.randint(seed, i)`` (:func:`fpsim.kernels.philox.philox_bits`).
        inplace: write the results into ``p``, ``m_codes``, ``m_scales``, ``v_codes`` and
            ``v_scales`` (contiguous tensors) and return them.

    Returns:
        :class:`AdamStep` on ``p``'s device: ``p`` in the dtype given, state codes uint8
        (FP32: float32) and scales torch.uint32 of shape ``(blocks,)`` (FP32: None); with
        ``inplace`` the tensors passed in.

    Raises:
        TypeError: tensors of the wrong kind or dtype; an optimizer that is not Adam/AdamW.
        ValueError: unsupported recipes, master format or rounding (the message lists the
            allowed values), mismatched shapes or devices, bad random-bit arguments.
    """
    torch = require_torch()
    opt, t = _optimizer(optimizer), _check_step(step)
    mfmt, mode = _master(master), _rounding(rounding)
    mrec, vrec = state_recipe("m_recipe", m_recipe), state_recipe("v_recipe", v_recipe)
    bsize = _block(mrec, vrec)
    pv = _p_view(torch, p, mfmt)
    g, g_src = _gradient(torch, g, p)
    n = p.numel()
    if n == 0:
        raise ValueError("adamw_step: p is empty")
    mc, ms = _state_tensors(torch, "m", m_codes, m_scales, mrec, p)
    vc, vs = _state_tensors(torch, "v", v_codes, v_scales, vrec, p)
    if inplace:
        given = [("p", p), ("m_codes", m_codes), ("v_codes", v_codes), ("m_scales", m_scales)]
        for name, tns in given + [("v_scales", v_scales)]:
            if tns is not None and not tns.is_contiguous():
                raise ValueError(f"inplace=True needs contiguous tensors; {name} is not")
    else:
        pv, mc, vc = pv.contiguous(), mc.contiguous(), vc.contiguous()
        ms = ms.contiguous() if ms is not None else None
        vs = vs.contiguous() if vs is not None else None

    rand, rand_kind, seed_arg = pv, Random.NONE, 0
    if mode is RoundMode.STOCHASTIC:
        rand, rand_kind, seed_arg = stochastic_source(torch, p, pv, random_bits, seed)
    elif random_bits is not None or seed is not None:
        raise ValueError("random_bits / seed are for rounding='stochastic' only")

    nb = -(-n // bsize)
    dev = p.device
    if inplace:
        p_out, mc_out, ms_out, vc_out, vs_out = pv, mc, ms, vc, vs
    else:
        p_out = torch.empty_like(pv)
        mc_out, vc_out = torch.empty_like(mc), torch.empty_like(vc)
        ms_out = None if ms is None else torch.empty(nb, dtype=torch.int32, device=dev)
        vs_out = None if vs is None else torch.empty(nb, dtype=torch.int32, device=dev)

    interp = is_interpreted(dev)
    m_tab, m_mid = _state_tables(mrec, str(dev))
    v_tab, v_mid = _state_tables(vrec, str(dev))
    bp, k, grid = _tiling(bsize, nb, interp)
    dummy = m_tab.view(torch.int32)  # the scales of FP32 states: never read nor written
    ms_in, vs_in, ms_w, vs_w = (dummy if x is None else x for x in (ms, vs, ms_out, vs_out))
    extra = {} if interp else {"num_warps": 4 if bp * k <= 2048 else 8, "enable_fp_fusion": False}
    (m_args, m_paths), (v_args, v_paths) = state_args(mrec), state_args(vrec)
    p_fmt, p_paths = master_paths(mfmt, mode, rand_kind)
    decay, step_args = adam_args(opt, lr, t)
    args = [
        g,
        MasterTensors(pv, p_out, rand),
        StateTensors(mc, ms_in, mc_out, ms_w, m_tab, m_mid),
        StateTensors(vc, vs_in, vc_out, vs_w, v_tab, v_mid),
        n,
        i32(seed_arg),
        i32(seed_arg >> 32),
        step_args,
        p_fmt,
        m_args,
        v_args,
    ]
    consts = dict(P=p_paths, M=m_paths, V=v_paths, G_SRC=int(g_src), DECAY=int(decay))
    consts.update(B=bsize, BP=bp, K=k, I64=n + bp * k >= 2**31)
    mod = kernel_module("_optim_kernel", interp)
    with np.errstate(all="ignore"):  # the interpreter's numpy float ops (inf - inf and the like)
        _launch_kernel(mod.adam_kernel, grid, interp, *args, **consts, **extra)
    if inplace:
        return AdamStep(p, m_codes, m_scales, v_codes, v_scales)
    p_new = p_out.view(p.dtype) if p.dtype != pv.dtype else p_out
    m_new = mc_out.view(torch.float32) if mrec is None else mc_out
    v_new = vc_out.view(torch.float32) if vrec is None else vc_out
    m_s = None if ms_out is None else ms_out.view(torch.uint32)
    v_s = None if vs_out is None else vs_out.view(torch.uint32)
    return AdamStep(p_new.reshape(p.shape), m_new.reshape(p.shape), m_s, v_new.reshape(p.shape), v_s)
