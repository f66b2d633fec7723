"""``fpsim replay``'s optimizer, mode and selection flags, and ``fpsim memory``: values reach the
replay, and a bad value is an error that names its flag."""

from __future__ import annotations

import json

import pytest

from fpsim.cli.app import main


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--lr", "-1", "argument --lr: must be a finite number >= 0"),
        ("--eps", "nan", "argument --eps: must be a finite number >= 0"),
        ("--betas", "1,0.5", "argument --betas: betas must lie in [0, 1)"),
        ("--betas", "0.9", "argument --betas: takes B1,B2"),
        ("--steps", "5:3", "argument --steps: takes A:B with 0 <= A <= B"),
        ("--steps", "abc", "argument --steps: takes A:B or A with integer steps"),
        ("--first-update", "0", "argument --first-update: expected a positive integer"),
        ("--mode", "all", "argument --mode: invalid choice"),
        ("--sqrt", "exact", "argument --sqrt: invalid choice"),
    ],
)
def test_bad_values_name_their_flag(capsys, flag, value, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", flag, value])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_optimizer_flags_of_the_other_optimizer_are_refused(capsys, tmp_path):
    assert main(["replay", "--optimizer", "sgd", "--betas", "0.9,0.99", "--out", str(tmp_path)]) == 2
    assert "--betas is an Adam flag" in capsys.readouterr().err


def _json(capsys, argv):
    assert main([*argv, "--quiet", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_steps_range_takes_the_recorded_steps_and_tensors_take_patterns(capsys, tmp_path):
    """--steps 185:200 replays the recorded 190..200 (185..189 are not recorded, 190 starts the
    consecutive run); --tensors takes fnmatch patterns; --first-update renumbers; with
    --optimizer adam --betas/--eps the replay runs (the sample is an Adam trace)."""
    out = ["--out", str(tmp_path)]
    base = ["replay", "--optimizer", "adam", "--config", "bf16-master", *out]
    full = _json(capsys, [*base, "--steps", "185:200"])
    assert full["results"][1]["steps"] == 11
    part = _json(capsys, [*base, "--steps", "190:200", "--tensors", "attn.*", "--betas", "0.9,0.999"])
    assert part["parameters"] < full["parameters"]
    assert main([*base, "--steps", "190:200", "--tensors", "nope*", "--quiet"]) == 2
    assert "tensors ['nope*'] match no gradient" in capsys.readouterr().err
    assert main([*base, "--steps", "201:300", "--quiet"]) == 2
    assert "--steps 201:300: no recorded step in that range" in capsys.readouterr().err


def test_sample_trace_is_refused_as_a_sequence_and_replays_each(capsys, tmp_path):
    out = ["--out", str(tmp_path)]
    assert main(["replay", "--optimizer", "adam", "--config", "fp32", *out, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "updates 11..19 between steps 10 and 20" in err and "--steps 190:200" in err
    each = _json(capsys, ["replay", "--optimizer", "adam", "--config", "fp32", "--mode", "each", *out])
    assert each["mode"] == "each" and each["results"][1]["steps"] == 29
    assert each["results"][0]["config"] == "reference"


def test_memory_command(capsys):
    assert main(["memory", "--params", "7e9", "--config", "fp32", "--config", "bnb-8bit"]) == 0
    text = capsys.readouterr().out
    assert "7,000,000,000 parameters" in text
    fp32 = next(line for line in text.splitlines() if line.startswith("fp32"))
    assert fp32.split()[-2:] == ["16.000", f"{16 * 7e9 / 2**30:.4g}"]
    with pytest.raises(SystemExit):
        main(["memory", "--params", "-3"])
    assert "argument --params: must be a whole number >= 1" in capsys.readouterr().err


def test_custom_config_flags_build_the_config_they_name(capsys, tmp_path):
    """--state-override/--master-override/--min-quantized-size/--loss-scale deepspeed give the
    replay of the ReplayConfig they spell; a malformed override names its flag."""
    from fpsim.replay import DeepSpeedDynamicLossScaler, ReplayConfig, replay
    from fpsim.replay.optim import AdamW

    flags = ["--state", "m=int8_block256,v=int8_block256", "--state-override", "embed*:exp_avg=float32"]
    flags += ["--master", "bfloat16", "--master-override", "pos=float32", "--min-quantized-size", "100"]
    flags += ["--grad", "float16", "--loss-scale", "deepspeed", "--steps", "190:200"]
    got = _json(capsys, ["replay", *flags, "--out", str(tmp_path)])["results"][1]
    cfg = ReplayConfig(
        "custom",
        m="int8_block256",
        v="int8_block256",
        state_overrides=(("embed*", "exp_avg", "float32"),),
        master="bfloat16",
        master_overrides=(("pos", "float32"),),
        min_quantized_size=100,
        grad="float16",
        loss_scaler=DeepSpeedDynamicLossScaler(),
    )
    want = replay(None, [cfg], optimizer=AdamW(), steps=range(190, 201), progress=False).summary()["results"][
        1
    ]
    assert got == want
    assert main(["replay", "--master-override", "embed*", "--out", str(tmp_path), "--quiet"]) == 2
    assert "--master-override takes PATTERN=FORMAT" in capsys.readouterr().err


def test_start_takes_the_first_values_from_another_trace(capsys, tmp_path):
    """--start with a trace of many steps starts from its step numbered as the first replayed one
    (here the same trace: the same replay); --mode each starts every step from its own values."""
    from fpsim.trace import sample_trace_path

    base = ["replay", "--optimizer", "adam", "--config", "bf16-master", "--steps", "199:200"]
    base += ["--out", str(tmp_path)]
    plain = _json(capsys, base)
    started = _json(capsys, [*base, "--start", str(sample_trace_path())])
    assert started["results"] == plain["results"]
    assert main([*base, "--start", str(sample_trace_path()), "--mode", "each", "--quiet"]) == 2
    assert "mode='each' starts each step from its own" in capsys.readouterr().err
