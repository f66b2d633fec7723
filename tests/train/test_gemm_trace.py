"""An emulated-GEMM training run recorded as a trace: ``TorchCapture(operands=True)`` on a model
that :func:`fpsim.train.torch.convert` converted records each linear's high-precision operands
(roles ``input`` and ``grad_output``, the weights as ``param``), and ``fpsim analyze`` of them
under the recipe's per-tensor formats gives the in-loop GEMM statistics again: the same
underflow counts and amaxes, so the open-loop and the in-loop measurement are one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fpsim.analysis import analyze  # noqa: E402
from fpsim.trace import TorchCapture, open_trace  # noqa: E402
from fpsim.train.ab import MODELS  # noqa: E402
from fpsim.train.torch import convert, gemm_stats  # noqa: E402

STEPS = 3


def test_the_operands_of_an_emulated_run_analyze_to_its_in_loop_statistics(tmp_path):
    m = MODELS["tiny-transformer"]
    torch.manual_seed(0)
    model = convert(m.build(), "fp8-current", stats=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with TorchCapture(model, tmp_path / "t", operands=True, params=True, first_step=1) as cap:
        for step, (x, y) in enumerate(m.batches(0, STEPS), start=1):  # gemm_stats counts from 1
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            cap.step(step)
            opt.step()
    trace = open_trace(tmp_path / "t")
    assert {"input", "grad_output", "param"} <= set(trace.roles)
    # fp8-current: E4M3 per tensor for inputs and weights, E5M2 per tensor for gradients
    checks = {
        ("fprop", "input"): ("input", "e4m3_tensor", ""),
        ("fprop", "weight"): ("param", "e4m3_tensor", ".weight"),
    }
    checks[("dgrad", "grad_output")] = ("grad_output", "e5m2_tensor", "")
    got = {}
    for (gemm, role), (trace_role, fmt, suffix) in checks.items():
        a = analyze(trace, [fmt], roles=(trace_role,), swamping=False, progress=False, backend="numpy")
        for (step, _, tensor, _, _), part in a.results.items():
            got[(step, tensor.removesuffix(suffix), gemm, role)] = (
                part.underflow,
                part.max_abs_in,
                part.elements,
            )
    rows = [r for r in gemm_stats(model) if (r["gemm"], r["role"]) in checks]
    assert len(rows) == STEPS * 5 * 3  # five linears
    for r in rows:
        under, amax, n = got[(r["step"], r["module"], r["gemm"], r["role"])]
        assert n == r["numel"] and amax == r["amax"], r
        assert under == round(r["underflow_pct"] * n / 100), r
    assert any(r["underflow_pct"] > 0 for r in rows)  # something to compare
