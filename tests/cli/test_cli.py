from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import mixprec
from mixprec.cli import app

runner = CliRunner()

#: A pipeline whose tune worker loads in no time beyond torch's import (tests/small_factory.py): for
#: what the tune command writes, says and reuses, not for a model's numbers.
SMALL = f"{Path(__file__).parents[1] / 'small_factory.py'}:build"


@pytest.fixture
def in_tmp(tmp_path, clean_env):
    clean_env.chdir(tmp_path)
    return tmp_path


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"mixprec {mixprec.__version__}"


def test_the_console_script_says_the_same_version_without_importing_torch():
    """``mixprec --version`` alone is answered by the entry module (src/_mixprec_command.py) before
    the package and torch load; any other command line starts the package as before."""
    import subprocess
    import sys

    script = ("import sys; sys.argv = ['mixprec', '--version']; import _mixprec_command; _mixprec_command.main(); "
              "print('torch' in sys.modules, 'mixprec' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"mixprec {mixprec.__version__}", "False False"]


def test_env_json_is_machine_readable(in_tmp):
    result = runner.invoke(app, ["env", "--json", "--device", "cpu"], env={"MIXPREC_FLOAT32_MATMUL_PRECISION": "medium"})
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["hardware"]["device_type"] == "cpu"
    assert set(data["hardware"]["dtypes"]) == {"fp32", "tf32", "bf16", "fp16"}
    assert data["numerics"]["float32_matmul_precision"] == "medium"  # read back from torch
    row = next(r for r in data["settings"] if r["key"] == "float32_matmul_precision")
    assert row["source"] == "env MIXPREC_FLOAT32_MATMUL_PRECISION"
    assert data["versions"]["torch"]


def test_env_tables(in_tmp):
    result = runner.invoke(app, ["env", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    for title in ("Hardware", "Precisions (measured)", "Effective numerics", "Settings", "Versions"):
        assert title in result.output


def test_config_show_names_sources(in_tmp):
    (in_tmp / "mixprec.toml").write_text("conv_tf32 = false\n")
    result = runner.invoke(
        app, ["config", "show", "--app", "ace_step", "--json", "--float32-matmul-precision", " High "],
        env={"ACE_STEP_FLOAT32_MATMUL_PRECISION": "medium"},
    )
    assert result.exit_code == 0, result.output
    rows = {r["key"]: r for r in json.loads(result.output)["settings"]}
    assert rows["float32_matmul_precision"]["value"] == "high"
    assert rows["float32_matmul_precision"]["source"] == "flag --float32-matmul-precision"
    assert rows["conv_tf32"]["value"] is False
    assert rows["conv_tf32"]["source"].endswith("mixprec.toml key conv_tf32")


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["config", "show", "--app", "ACE_STEP"], {"ACE_STEP_FLOAT32_MATMUL_PRECISION": "turbo"}, "env ACE_STEP_FLOAT32_MATMUL_PRECISION"),
        (["config", "show", "--conv-tf32", "sure"], {}, "flag --conv-tf32"),
        (["env", "--float32-matmul-precision", "low"], {}, "flag --float32-matmul-precision"),
    ],
)
def test_bad_values_exit_2_naming_the_source(in_tmp, args, env, needle):
    before = mixprec.snapshot()
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 2
    assert needle in result.output
    assert "valid values" in result.output
    assert mixprec.snapshot() == before


def test_unknown_key_in_file_exits_2(in_tmp):
    (in_tmp / "mixprec.toml").write_text("conv_tf23 = true\n")
    result = runner.invoke(app, ["config", "show"])
    assert result.exit_code == 2
    assert "did you mean 'conv_tf32'" in result.output


def test_pipelines_lists_components(in_tmp):
    result = runner.invoke(app, ["pipelines", "--size", "test", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.stdout)["pipelines"]}
    assert {"tts", "diffusion", "minilm"} <= set(rows)
    assert list(rows["tts"]["components"]) == ["ve", "t3_cond", "t3", "s3gen", "vocoder"]
    assert rows["tts"]["total"] == sum(rows["tts"]["components"].values())


def test_pipelines_says_what_each_size_is_for_and_needs(in_tmp):
    result = runner.invoke(app, ["pipelines", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.stdout)["pipelines"]}
    large = rows["diffusion"]["sizes"]["large"]  # counted on the meta device: nothing allocated
    assert "GPU" in large["purpose"] and large["parameters"] > 1e9
    assert large["fp32_weight_bytes"] == 4 * large["parameters"]
    assert list(rows["tts"]["sizes"]) == ["default", "test", "large"]
    assert list(rows["minilm"]["sizes"]) == ["default", "test"]
    text = runner.invoke(app, ["pipelines"])
    assert text.exit_code == 0, text.output
    flat = " ".join(text.output.split())
    assert "Sizes (--size)" in flat and "large" in flat and "GiB" in flat


def test_run_writes_a_wav(in_tmp):
    import soundfile

    result = runner.invoke(app, ["run", "--pipeline", "tts", "--size", "test", "--seed", "1", "--out", "speech.wav"])
    assert result.exit_code == 0, result.output
    data, rate = soundfile.read(in_tmp / "speech.wav")
    assert rate == 24000 and len(data) > 1000 and data.std() > 0


@pytest.mark.parametrize(("args", "needle"), [
    (["--pipeline", "ttx", "--out", "a.wav"], "did you mean 'tts'"),
    (["--pipeline", "tts", "--out", "a.png"], ".wav"),
    (["--pipeline", "tts", "--out", "a.wav", "--seed", "x"], "--seed 'x': expected an integer"),
    (["--pipeline", "tts", "--out", "a.wav", "--batch", "0"], "batch must be an int >= 1"),
])
def test_run_bad_input_exits_2(in_tmp, args, needle):
    result = runner.invoke(app, ["run", "--size", "test", *args])
    assert result.exit_code == 2
    assert needle.lower() in result.output.lower()


def test_tune_command_writes_a_loadable_policy_and_reuses_the_store(tmp_path):
    db, out = tmp_path / "bench.sqlite", tmp_path / "tuned.toml"
    args = ["tune", "--pipeline", SMALL, "--size", "test", "--bound", "cosine>=0.999", "--budget", "20",
            "--repeat", "1", "--db", str(db)]
    first = runner.invoke(app, [*args, "--out", str(out)])
    assert first.exit_code == 0, first.output
    # Which policy wins depends on this machine's timings (a busy machine rightly keeps fp32);
    # either way the chosen line says how it compares with fp32.
    assert "chosen: #" in first.output
    assert "the speed of fp32" in first.output or "(baseline fp32): fp32 itself" in first.output
    assert "validation: On seeds 2, 3, 4, never used by the search, the chosen policy meets cosine>=0.999" in first.output
    assert "how sure" in first.output and "spread" in first.output
    assert first.output.count("chosen") >= 2  # the chosen row is in the table even when re-timing picked it
    policy = mixprec.Policy.load(out)
    assert policy.name == "tuned" and policy.rules
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "0 measured evaluations" in again.output
    unmet = runner.invoke(app, ["tune", "--pipeline", SMALL, "--size", "test", "--bound", "cosine>1.5", "--budget", "20",
                                "--repeat", "1", "--db", str(db)])
    assert unmet.exit_code == 1 and "misses it by 0.5" in unmet.output


@pytest.mark.parametrize("args, message", [
    (["--bound", "snr=>30"], "'<metric> <op> <number>'"),
    (["--bound", "snr>=30", "--objective", "speed"], "--objective 'speed'"),
    (["--bound", "snr>=30", "--budget", "0"], "--budget '0'"),
    (["--bound", "snr>=30", "--seeds", "x"], "--seeds 'x'"),
    (["--bound", "snr>=30", "--pipeline", "ttts"], "did you mean 'tts'"),
    (["--bound", "snr>=30", "--seeds", "0,1", "--validation-seeds", "1,5"],
     "overlap the search seeds [0, 1] (both hold 1)"),
    (["--bound", "snr>=30", "--validation-seeds", "-1"], "--validation-seeds '-1'"),
    (["--bound", "snr>=30", "--validation-seeds", "5-x"], "'5-x' is not a seed or a range"),
    (["--bound", "snr>=30", "--margin", "-2"], "--margin '-2': expected a number of db >= 0"),
    (["--bound", "snr>=30", "--margin", "lots"], "--margin 'lots': expected a number"),
])
def test_tune_command_rejects_bad_input(args, message):
    result = runner.invoke(app, ["tune", *args])
    assert result.exit_code == 2 and message.lower() in " ".join(result.output.lower().split()), result.output


def test_validation_seeds_flag_forms():
    from mixprec.cli.tune import _validation_seeds

    assert _validation_seeds("3", [0, 1]) == 3 and _validation_seeds("0", [0, 1]) == 0
    assert _validation_seeds("7,", [0, 1]) == [7]
    assert _validation_seeds("10-12,20", [0, 1]) == [10, 11, 12, 20]
