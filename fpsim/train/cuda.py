"""The CUDA path of :mod:`fpsim.train.torch`: one tensor-step by the Triton kernel
:func:`fpsim.kernels.optim.adamw_step`, which is bit-identical to the replay's tensor-step
where it covers the configuration (its module doc; ``fpsim validate-kernels``).

Covered: :class:`fpsim.replay.optim.Adam` / ``AdamW`` with ``sqrt="ieee"``, FP32 gradients,
both states FP32 or 8-bit ABSMAX block recipes of one block size
(:data:`fpsim.kernels.optim.STATE_RECIPES`), master ``bfloat16`` / ``float16`` / ``float32``
rounded nearest-even or stochastically (the replay's random words, so the same bits), no Kahan.
Anything else returns False and the optimizer takes the CPU path. Tested on the CPU through
Triton's interpreter (tests/train); a GPU runs the compiled kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..emulate.random import random_bits_at
from ..formats import BlockFormat, Format, RoundMode
from ..replay import optim as rules
from ..replay.config import ReplayConfig

__all__ = ["kernel_step"]

_MOMENTS = ("exp_avg", "exp_avg_sq")


def _covered(cfg: ReplayConfig, rule: Any, name: str, n: int) -> dict[str, Any] | None:
    """The kernel's arguments for this tensor's formats, or None where it does not cover them."""
    from ..kernels.optim import STATE_RECIPES, state_recipe

    if not isinstance(rule, rules.Adam) or rule.sqrt is not rules.Sqrt.IEEE or cfg.kahan:
        return None
    master = cfg.master_format(name)
    if master.name not in ("bfloat16", "float16", "float32") or cfg.grad.name != "float32":
        return None
    if cfg.master_rounding not in (RoundMode.NEAREST_EVEN, RoundMode.STOCHASTIC):
        return None
    recipes = {}
    for st in _MOMENTS:
        fmt = cfg.state_storage(st, name, n)
        ok = (isinstance(fmt, Format) and fmt.name == "float32") or (
            isinstance(fmt, BlockFormat) and (fmt.name in STATE_RECIPES or _takes(state_recipe, fmt))
        )
        if not ok:
            return None
        recipes[st] = fmt
    blocks = {f.block[0] for f in recipes.values() if isinstance(f, BlockFormat)}
    if len(blocks) > 1:
        return None
    return {"m_recipe": recipes["exp_avg"], "v_recipe": recipes["exp_avg_sq"], "master": master.name}


def _takes(state_recipe, fmt) -> bool:
    try:
        return state_recipe("state", fmt) is not None
    except ValueError:
        return False


def kernel_step(
    cfg: ReplayConfig, rule: Any, name: str, state: dict, p: Any, lr: float, t: int, seed: int
) -> bool:
    """Update ``t`` of parameter ``p`` (a torch tensor) by the kernel, states in ``state`` as
    :mod:`fpsim.train.torch` keeps them; ``seed``: the tensor-step's stochastic rounding seed.
    Returns False (nothing changed) where the kernel does not cover the configuration."""
    import torch

    from ..kernels.optim import adamw_step

    kw = _covered(cfg, rule, name, p.numel())
    if kw is None:
        return False
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[kw["master"]]
    args = []
    for st in _MOMENTS:
        if st in state:
            args += [state[st], None]
        else:
            args += [state[f"{st}.codes"], state[f"{st}.scales"]]
    bits = None
    if cfg.master_rounding is RoundMode.STOCHASTIC:
        words = random_bits_at(seed, 0, p.numel()).reshape(tuple(p.shape)).view(np.int32)
        bits = torch.from_numpy(words).to(p.device)
    out = adamw_step(
        p.detach().to(dtype), p.grad.detach(), *args, lr=lr, step=t, optimizer=rule,
        rounding=cfg.master_rounding, random_bits=bits, **kw,
    )  # fmt: skip
    p.copy_(out.p.to(torch.float32))
    for st, codes, scales in (
        (_MOMENTS[0], out.m_codes, out.m_scales),
        (_MOMENTS[1], out.v_codes, out.v_scales),
    ):
        if scales is None:
            state[st] = codes
        else:
            state[f"{st}.codes"], state[f"{st}.scales"] = codes, scales.view(torch.int32)
    return True
