"""The validation harness (fpsim.kernels.validate): it passes the real kernels, counts a
deliberately wrong kernel's mismatches exactly, reports them with bits, and its command
line writes the table and the JSON report."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

import fpsim
from fpsim import RoundMode

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from fpsim.kernels import cast, validate  # noqa: E402  (after the skips)
from fpsim.kernels.validate import KernelSpec, input_sets  # noqa: E402


def truncate_bf16(x, fmt, *, rounding, saturate, subnormals, **_):
    """A wrong bfloat16 cast: drops the low 16 bits (truncation, and NaN payloads kept)."""
    return ((x.view(torch.int32) >> 16) & 0xFFFF).to(torch.int32)


def test_real_kernel_passes_every_variant():
    cases = validate.validate(cast.encode, "float8_e4m3fn", "nearest_even", cases="quick")
    assert [(c.options["saturate"], c.options["subnormals"]) for c in cases] == [
        (False, True),
        (False, False),
        (True, True),
        (True, False),
    ]
    for c in cases:
        assert c.ok and c.mismatches == 0 and c.first == [] and c.error is None
        assert c.kernel == "encode" and c.format == "float8_e4m3fn" and c.rounding == "nearest_even"
        assert c.compared == cases[0].compared > 10_000
    sr = validate.validate(cast.encode, "int4", "stochastic", cases="quick", saturate=True)
    assert [c.options["stochastic_bits"] for c in sr] == [32, 3] and all(c.ok for c in sr)


def test_truncating_kernel_mismatch_count_is_exact():
    cases = validate.validate(truncate_bf16, "bfloat16", cases="quick", saturate=False, subnormals=True)
    assert len(cases) == 1
    (case,) = cases
    # the same inputs, counted directly: nearest-even codes vs the top 16 bits
    want_bad = compared = 0
    for s in input_sets("bfloat16", "quick"):
        x = np.ascontiguousarray(s.values.T if s.transpose else s.values).astype(np.float32).reshape(-1)
        want = fpsim.encode(x, "bfloat16").astype(np.int64)
        want_bad += int((want != (x.view(np.uint32) >> 16)).sum())
        compared += x.size
    assert case.compared == compared
    assert case.mismatches == want_bad > 1000
    assert not case.ok and len(case.first) == 8
    m = case.first[0]
    assert m.expected != m.got and m.input_bits.startswith("0x")
    assert "s=" in m.expected_fields and "e=" in m.expected_fields and "m=" in m.got_fields
    assert int(m.input_bits, 16) >> 16 == m.got  # the truncated input bits are what it returned
    text = m.describe()
    assert "want" in text and "got" in text and m.inputs in text


def test_nan_by_class_ignores_nan_payloads_only():
    def nan_payload_kept(x, fmt, **kw):  # correct rounding, but NaNs keep the input's top bits
        codes = cast.encode(x, fmt, **kw).to(torch.int32)
        payload = ((x.view(torch.int32) >> 16) & 0xFFFF) | 0x7FC1  # a NaN, never the canonical one
        return torch.where(torch.isnan(x), payload, codes)

    strict = validate.validate(nan_payload_kept, "bfloat16", cases="quick", saturate=False, subnormals=True)
    loose = validate.validate(
        nan_payload_kept, "bfloat16", cases="quick", saturate=False, subnormals=True, nan_by_class=True
    )
    assert strict[0].mismatches > 0 and loose[0].mismatches == 0


def test_kernel_errors_are_reported():
    def broken(x, fmt, **kw):
        raise RuntimeError("no such kernel")

    (case, *_) = validate.validate(broken, "float8_e5m2", cases="quick")
    assert case.error == "[codes] RuntimeError: no such kernel" and not case.ok

    def wrong_shape(x, fmt, **kw):
        return cast.encode(x, fmt, **kw).reshape(-1)[:1]

    cases = validate.validate(wrong_shape, "float8_e5m2", cases="quick", saturate=False, subnormals=True)
    assert "shape" in cases[0].error and cases[0].error.startswith("[codes]")


def test_quantize_seed_and_16_bit_input_kinds():
    q = validate.validate(cast.quantize, "int4", "odd", cases="quick", kind="quantize")
    assert all(c.ok for c in q)
    s = validate.validate(
        cast.encode, "float4_e2m1fn", "stochastic", cases="quick", random="seed", saturate=False
    )
    assert all(c.ok for c in s) and s[0].options["random"] == "seed"
    h = validate.validate(cast.encode, "float8_e5m2", "toward_zero", cases="quick", input_dtype="float16")
    assert all(c.ok for c in h) and h[0].options["input_dtype"] == "float16"


def test_validate_decode_catches_a_wrong_decode():
    (ok,) = validate.validate_decode(cast.decode, "float6_e2m3fn")
    assert ok.ok and ok.compared == 64

    def plus_one_ulp(codes, fmt):
        v = cast.decode(codes, fmt)
        return (v.view(torch.int32) + (codes.to(torch.int32) == 5).to(torch.int32)).view(torch.float32)

    (bad,) = validate.validate_decode(plus_one_ulp, "float6_e2m3fn")
    assert bad.mismatches == 1 and bad.first[0].expected + 1 == bad.first[0].got


def test_input_sets_cover_the_edges():
    sets = {s.name: s for s in input_sets("float8_e4m3fn", "full")}
    for name in ["codes", "midpoints", "boundaries", "specials", "random", "shape (1,)", "shape (1023,)"]:
        assert name in sets
    assert any(n.startswith("trace step") for n in sets) and any(s.transpose for s in sets.values())
    codes = sets["codes"].values
    table = fpsim.emulate.element.decode_table(fpsim.get_format("float8_e4m3fn"))
    assert (
        np.isin(table[np.isfinite(table)], codes).all() and np.isin(-table[np.isfinite(table)], codes).all()
    )
    mids = sets["midpoints"].values
    assert np.float32(432.0) in mids and np.nextafter(np.float32(-432.0), np.float32(0)) in mids
    edges = sets["boundaries"].values  # 464: half-way between max and the next step (NaN)
    assert np.float32(464.0) in edges and np.nextafter(np.float32(464.0), np.float32(1e9)) in edges
    spec = sets["specials"].values
    assert np.isnan(spec).any() and np.isinf(spec).sum() == 2
    assert all(math.prod(s.values.shape) % 2048 for s in sets.values() if s.name.startswith("shape"))
    h = input_sets("float8_e4m3fn", "full", input_dtype="bfloat16")[0]
    assert h.name == "inputs" and h.values.size == 1 << 16


def test_binade_spread_is_the_float32_built_from_its_integer_draws():
    """binade_spread (the random inputs of the validations): 2**e times a 24-bit significand,
    e uniform in [lo, hi]: against the float32 bits assembled from the same integer draws
    (exponent field e + 127, the significand's low 23 bits), exact and on every CPU alike;
    every binade is drawn, and below 2**-126 the float32 cast rounds it to a subnormal."""
    from fpsim.kernels.validate.common import binade_spread

    lo, hi, n = -126, 127, 20_000
    got = binade_spread(np.random.default_rng(5), n, lo, hi)
    rng = np.random.default_rng(5)
    e, significand = rng.integers(lo, hi, n, endpoint=True), rng.integers(1 << 23, 1 << 24, n)
    want = (((e + 127) << 23) | (significand & 0x7FFFFF)).astype(np.uint32)
    assert got.dtype == np.float64 and np.array_equal(got.astype(np.float32).view(np.uint32), want)
    assert np.array_equal(got.astype(np.float32).astype(np.float64), got)  # float32 values, no rounding
    assert set(np.unique(e)) == set(range(lo, hi + 1))
    tiny = binade_spread(np.random.default_rng(6), 1000, -149, -127).astype(np.float32)
    assert (tiny > 0).all() and (tiny < np.float32(2.0**-126)).all()  # subnormals, none flushed
    sets = {s.name: s.values for s in input_sets("float8_e4m3fn", "quick")}
    mag = np.abs(sets["random"][sets["random"].size // 2 :])  # the random values after the bit patterns
    assert mag.min() >= 2.0**-12 and mag.max() < 2.0**11  # min_subnormal / 8 to 4 max, whole binades


def test_validate_all_report_structure():
    report = validate.validate_all("cpu", True, formats=["float8_e4m3fn", "int4"], roundings=["nearest_even"])
    assert report["mismatches"] == 0 and report["errors"] == 0
    rows = {(r["kernel"], r["format"], r["rounding"]): r for r in report["cases"]}
    assert ("cast.encode[bfloat16 in]", "int4", "nearest_even") in rows
    assert ("cast.encode[seed]", "int4", "nearest_even") not in rows  # stochastic only
    assert len(rows) == 2 * 5 + 1
    assert rows[("cast.decode", "int4", "-")]["compared"] == 16
    hw = rows[("hwcast.encode", "float8_e4m3fn", "nearest_even")]
    assert "interpreter" in hw["skipped"] and hw["compared"] == 0
    assert report["skipped"] == 1
    for r in report["cases"]:
        assert {"kernel", "format", "rounding", "compared", "mismatches"} <= set(r)
        assert r["skipped"] or r["compared"] > 0
    json.dumps(report)


def test_cli_quick_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    argv = ["--quick", "--json", str(out), "--format", "float4_e2m1fn", "--rounding", "stochastic", "--quiet"]
    assert validate.main(argv) == 0
    text = capsys.readouterr().out
    header = text.splitlines()[0].split()
    assert header == ["kernel", "format", "rounding", "compared", "mismatches"]
    assert "0 mismatches" in text
    report = json.loads(out.read_text())
    assert report["mismatches"] == 0 and report["quick"] is True and report["device"] == "cpu"
    assert {r["kernel"] for r in report["cases"]} == {
        "cast.encode",
        "cast.encode[float16 in]",
        "cast.encode[bfloat16 in]",
        "cast.encode[seed]",
        "cast.quantize",
    }


def test_cli_fails_on_a_wrong_kernel(monkeypatch, capsys):
    def run(fmt, rounding, *, cases, device, name):
        return validate.validate(
            truncate_bf16, fmt, rounding, cases=cases, device=device, name=name, saturate=False
        )

    spec = KernelSpec(
        "truncate", run, applies=lambda f, m: f.name == "bfloat16" and m is RoundMode.NEAREST_EVEN
    )
    monkeypatch.setitem(validate.KERNELS, "truncate", spec)
    assert validate.main(["--quick", "--kernel", "truncate", "--format", "bfloat16", "--quiet"]) == 1
    text = capsys.readouterr().out
    assert "truncate  bfloat16  nearest_even" in text
    assert "want 0x" in text and "got  0x" in text and "s=" in text


def test_cli_errors_and_add_parser(capsys):
    assert validate.main(["--quick", "--format", "float99", "--quiet"]) == 2
    assert "unknown format 'float99'" in capsys.readouterr().err
    parent = argparse.ArgumentParser(prog="fpsim")
    sub = parent.add_subparsers(dest="command")
    validate.add_parser(sub)
    args = parent.parse_args(["validate-kernels", "--quick", "--device", "cpu", "--format", "int8"])
    assert args.run is validate.run_args and args.quick and args.format == ["int8"]
