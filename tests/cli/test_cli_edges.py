"""The command line's edges: --version, flags checked and named, missing optional dependencies
in one line, help texts, validate-kernels' incremental output, ``fpsim diff``."""

from __future__ import annotations

import json
import signal
import sys
from importlib.metadata import version

import pytest

from fpsim.cli.app import build_parser, main


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"fpsim {version('fpsim')}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["accumulate", "--outputs", "0"], "argument --outputs: expected a positive integer, got '0'"),
        (["accumulate", "--block", "0"], "argument --block: expected a positive integer"),
        (["accumulate", "--promote-every", "-1"], "argument --promote-every: expected an integer >= 0"),
        (["accumulate", "--seed", "-1"], "argument --seed: expected an integer >= 0"),
        (["accumulate", "--accumulator", "float7"], "argument --accumulator: unknown format 'float7'"),
        (["accumulate", "--accumulator", "99"], "argument --accumulator: accumulator: p must be in [2, 24]"),
        (["accumulate", "--input-format", "fp9"], "argument --input-format: unknown format 'fp9'"),
        (["accumulate", "--product-format", "fp9"], "argument --product-format: unknown format 'fp9'"),
        (["replay", "--master", "fp9"], "argument --master: unknown format 'fp9'"),
        (["replay", "--grad", "fp9"], "argument --grad: unknown format 'fp9'"),
        (["replay", "--steps", "5:3"], "argument --steps: takes A:B with 0 <= A <= B, got '5:3'"),
        (["replay", "--steps", "abc"], "argument --steps: takes A:B or A with integer steps"),
        (["replay", "--lr", "-1"], "argument --lr: must be a finite number >= 0"),
        (["exhaustive", "float16", "--start", "x"], "argument --start: takes an integer such as 0x3f800000"),
        (["exhaustive", "float16", "--stop", "0x100000001"], "argument --stop: must lie in 0..2**32"),
        (["analyze", "--workers", "0"], "argument --workers: expected a positive integer"),
    ],
)
def test_bad_flag_values_are_usage_errors_naming_the_flag(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and message in err.splitlines()[-1]  # (after argparse's usage)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["replay", "--state", "m=fp9"], "--state m=fp9: unknown format 'fp9'"),
        (["replay", "--state-override", "emb*=fp9"], "--state-override emb*=fp9: unknown format 'fp9'"),
        (["replay", "--master-override", "emb*=fp9"], "--master-override emb*=fp9: unknown format 'fp9'"),
        (["exhaustive", "float16", "--start", "5", "--stop", "3"], "--start 0x5 must be below --stop 0x3"),
    ],
)
def test_bad_values_found_after_parsing_name_the_flag(capsys, tmp_path, argv, message):
    assert main([*argv, "--quiet"] if argv[0] == "exhaustive" else [*argv, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_every_flag_of_every_command_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in sub.choices.items():
        for action in command._actions:
            assert action.help, f"fpsim {name} {'/'.join(action.option_strings) or action.dest}: no help"
        text = command.format_help()
        assert "``" not in text and ":mod:" not in text, f"fpsim {name} --help shows rst markup"


def test_replay_help_says_what_each_preset_is(capsys):
    from fpsim.replay import PRESETS

    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    out = capsys.readouterr().out
    lines = {
        ln.split()[0]: ln for ln in out.split("presets (--config NAME")[1].splitlines()[1:] if ln.strip()
    }
    assert set(PRESETS) <= set(lines)
    assert lines["bf16-master"].split()[1:] == ["master=bfloat16"]
    assert "master_rounding=stochastic" in lines["bf16-master-sr"]
    assert (
        "min_quantized_size=4096" in lines["bnb-8bit"] and "min_quantized_size" not in lines["bnb-8bit-all"]
    )
    assert "element.lut_bins=65536" in lines["bnb-8bit-cpu"]  # what tells it from bnb-8bit


def _without(monkeypatch, *modules):
    """Make ``import MODULE`` fail as when it is not installed."""
    for m in modules:
        for name in [k for k in sys.modules if k == m or k.startswith(m + ".")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setitem(sys.modules, m, None)


def test_a_pt_trace_without_torch_is_one_line_with_the_install_command(capsys, tmp_path, monkeypatch):
    (tmp_path / "step_0.pt").write_bytes(b"not read")
    _without(monkeypatch, "torch")
    assert main(["analyze", str(tmp_path / "step_0.pt"), "--quiet", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("fpsim analyze: error: needs torch") and "pip install 'fpsim[capture]'" in err


def test_validate_kernels_without_torch_is_one_line(capsys, tmp_path, monkeypatch):
    _without(monkeypatch, "torch", "triton")
    argv = ["validate-kernels", "--quick", "--quiet", "--kernel", "cast.decode", "--format", "bfloat16"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'fpsim[kernels]'" in err


def test_dask_without_dask_is_one_line(capsys, tmp_path, monkeypatch):
    _without(monkeypatch, "distributed", "dask")
    assert main(["analyze", "--dask", "local", "--quiet", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'fpsim[dask]'" in err


def test_compiled_backend_without_numba_is_one_line(capsys, tmp_path, monkeypatch):
    import fpsim._compiled as compiled

    monkeypatch.setattr(compiled, "available", lambda: False)
    assert main(["analyze", "--backend", "compiled", "--quiet", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'fpsim[fast]'" in err


def test_validate_kernels_writes_each_row_and_keeps_them_on_ctrl_c(capsys, tmp_path, monkeypatch):
    """Rows are printed and the JSON rewritten as each case completes; Ctrl-C (here on the third
    case) leaves a whole JSON file with the two rows done, ``complete: false``, exit 130."""
    import fpsim.kernels.validate.cli as vcli

    seen = []

    def fake_row(spec, fmt, mode, quick, device):
        if len(seen) == 2:
            raise KeyboardInterrupt
        if seen:  # the first row is already on stdout and in the file when the second runs
            assert "cast.encode" in capsys.readouterr().out
            assert json.loads(out.read_text())["cases"] == seen
        seen.append({"kernel": spec.name, "format": fmt.name, "rounding": mode.value, "compared": 7})
        seen[-1].update(mismatches=0, variants=1, skipped=None, errors=[], first=[])
        return dict(seen[-1])

    monkeypatch.setattr(vcli, "run_row", fake_row)
    out = tmp_path / "report.json"
    argv = ["validate-kernels", "--quick", "--quiet", "--kernel", "cast.encode", "--json", str(out)]
    assert main([*argv, "--format", "float8_e4m3fn", "--format", "float16"]) == 130
    report = json.loads(out.read_text())
    assert report["complete"] is False and report["cases"] == seen and report["compared"] == 14
    assert report["planned"] > 2
    captured = capsys.readouterr()
    assert "interrupted after 2 of" in captured.err


def test_exhaustive_keeps_the_slices_done_on_ctrl_c(capsys, monkeypatch):
    import fpsim.analysis.exhaustive as ex
    import fpsim.cli.exhaustive as cli

    real, calls = ex.exhaustive_check, []

    def third_interrupted(*args, **kwargs):
        calls.append(kwargs["start"])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(cli, "_SLICE", 1 << 12)
    monkeypatch.setattr(ex, "exhaustive_check", third_interrupted)
    argv = ["exhaustive", "float8_e4m3fn", "--start", "0x3f800000", "--stop", "0x3f806000", "--quiet"]
    assert main(argv) == 130
    assert calls == [0x3F800000, 0x3F801000, 0x3F802000]
    captured = capsys.readouterr()
    assert "interrupted: 8192 of 24576 inputs done" in captured.err
    assert "8192 float32 inputs compared with ml_dtypes, 0 mismatches" in captured.out


def test_analyze_keeps_the_tensors_done_on_ctrl_c(capsys, tmp_path, monkeypatch):
    """Ctrl-C during `fpsim analyze` writes the report of the tensors measured in full (none in
    part), says so, and exits 130; the Python API raises unless asked to keep them."""
    from fpsim.analysis import run as analysis_run

    real, calls = analysis_run._measure_entry, []

    def stop_at_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(analysis_run, "_measure_entry", stop_at_third)
    out = tmp_path / "r"
    argv = ["analyze", "--format", "float16", "--no-swamping", "--quiet", "--out", str(out), "--json"]
    assert main(argv) == 130
    captured = capsys.readouterr()
    assert "interrupted after 2 of" in captured.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tensors"] == 2 and summary["interrupted"].startswith("interrupted after 2 of")
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        analysis_run.analyze(None, ["float16"], swamping=False, progress=False)
    calls.clear()
    kept = analysis_run.analyze(None, ["float16"], swamping=False, progress=False, keep_on_interrupt=True)
    step = next(iter(kept.results))[0]
    full = analysis_run.analyze(None, ["float16"], swamping=False, progress=False, steps=[step])
    assert len(kept.results) == 2  # each tensor measured in full, as the uninterrupted run does
    assert all(p.totals() == full.results[k].totals() for k, p in kept.results.items())


@pytest.fixture
def sigint():
    """Sets SIGINT's handler for the test (``sigint(handler)``) and puts the one the process had
    back after it: a test must not depend on the handler pytest started with (SIG_IGN in a
    background job of a non-interactive shell)."""
    before = signal.getsignal(signal.SIGINT)
    yield lambda handler: signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGINT, before)


def test_replay_ends_at_a_step_boundary_on_ctrl_c(capsys, tmp_path, monkeypatch, sigint):
    """Ctrl-C during `fpsim replay` ends it after the step in progress: the report holds the
    steps done, whole, their values equal a replay of just those steps, and the exit is 130."""
    from fpsim.replay import engine, replay

    sigint(signal.default_int_handler)  # Python's own (an interactive shell's foreground job)
    real, calls = engine._replay_step, []

    def ctrl_c_in_second_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C: its handler has run when this returns
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "_replay_step", ctrl_c_in_second_step)
    out = tmp_path / "r"
    argv = ["replay", "--steps", "190:195", "--config", "bf16-master", "--quiet", "--out", str(out)]
    assert main([*argv, "--json"]) == 130
    assert "interrupted after 2 of 6 steps" in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"].startswith("interrupted after 2 of 6 steps")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    monkeypatch.setattr(engine, "_replay_step", real)
    whole = replay(None, ["bf16-master"], steps=[190, 191], progress=False)
    rows = {r["config"]: r for r in summary["results"]}
    assert rows["bf16-master"]["steps"] == 2
    assert (
        rows["bf16-master"]["final_param_rel_error"] == whole.summary()["results"][1]["final_param_rel_error"]
    )


def _replay_with_ctrl_c(monkeypatch, seen: list) -> None:
    """Makes the replay's second step send SIGINT to the process (with ``raise_signal``, so
    that its handler runs before the step goes on); ``seen`` gets SIGINT's handler in each step."""
    from fpsim.replay import engine

    real = engine._replay_step

    def step(*args, **kwargs):
        seen.append(signal.getsignal(signal.SIGINT))
        if len(seen) == 2:
            signal.raise_signal(signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "_replay_step", step)


def test_ignored_sigint_stays_ignored_through_replay(capsys, tmp_path, monkeypatch, sigint):
    """`nohup fpsim replay ... &` asked not to be interrupted: SIGINT stays SIG_IGN during and
    after the replay, a SIGINT sent in its second step is ignored and every step is replayed."""
    sigint(signal.SIG_IGN)
    seen: list = []
    _replay_with_ctrl_c(monkeypatch, seen)
    argv = ["replay", "--steps", "190:192", "--config", "bf16-master", "--quiet", "--out", str(tmp_path)]
    assert main([*argv, "--json"]) == 0
    assert "interrupted" not in capsys.readouterr().err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "interrupted" not in summary and len(seen) == 3
    assert all(h is signal.SIG_IGN for h in seen)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


@pytest.mark.parametrize("kind", ["callable", "SIG_DFL"])
def test_replay_puts_back_the_sigint_handler_it_found(tmp_path, monkeypatch, sigint, kind):
    """Another handler (someone else's callable, or SIG_DFL) is replaced during the replay, so
    that Ctrl-C still ends it at a step boundary, and put back after it: the same object."""
    from fpsim.replay import replay

    def theirs(signum, frame):  # pragma: no cover (replaced while the replay runs)
        raise AssertionError("the replay's handler should have been in place")

    before = theirs if kind == "callable" else signal.SIG_DFL
    sigint(before)
    seen: list = []
    _replay_with_ctrl_c(monkeypatch, seen)
    result = replay(None, ["bf16-master"], steps=range(190, 193), progress=False, keep_on_interrupt=True)
    assert result.interrupted.startswith("interrupted after 2 of 3 steps")
    assert all(h is not before and callable(h) for h in seen)
    assert signal.getsignal(signal.SIGINT) is before


def test_ignored_sigint_stays_ignored_through_analyze(capsys, tmp_path, monkeypatch, sigint):
    """`fpsim analyze` and ``analyze(keep_on_interrupt=True)`` install no SIGINT handler: an
    ignored SIGINT stays ignored during and after them, and a SIGINT sent meanwhile is ignored."""
    from fpsim.analysis import run as analysis_run

    sigint(signal.SIG_IGN)
    real, seen = analysis_run._measure_entry, []

    def measure(*args, **kwargs):
        seen.append(signal.getsignal(signal.SIGINT))
        if len(seen) == 2:
            signal.raise_signal(signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(analysis_run, "_measure_entry", measure)
    argv = ["analyze", "--format", "float16", "--no-swamping", "--quiet", "--out", str(tmp_path), "--json"]
    assert main(argv) == 0
    assert "interrupted" not in capsys.readouterr().err
    assert "interrupted" not in json.loads((tmp_path / "summary.json").read_text())
    kept = analysis_run.analyze(None, ["float16"], swamping=False, progress=False, keep_on_interrupt=True)
    assert kept.interrupted is None and len(seen) == 2 * len(kept.shapes) > 2
    assert all(h is signal.SIG_IGN for h in seen)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
