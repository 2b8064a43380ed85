"""Config, .env and policy files are checked before they are read: kind, size, encoding mark, nesting; env names summarised."""

from __future__ import annotations

import os
import re

import pytest
from typer.testing import CliRunner

from mixprec.cli import app
from mixprec.config import ConfigError, resolve
from mixprec.policy import Policy, PolicyError
from mixprec.policy.inputs import MAX_INPUT_BYTES

runner = CliRunner()


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.toml"
    os.mkfifo(path)  # opening it to read would block until a writer came
    return path


def _kinds(tmp_path, fifo):
    return [(fifo, "is a named pipe (FIFO), not a regular file"), (tmp_path, "is a directory, not a file"),
            ("/dev/zero", "is a device, not a regular file"), (tmp_path / "none.toml", "does not exist")]


def test_config_file_kinds(tmp_path, fifo, clean_env):
    for path, needle in _kinds(tmp_path, fifo):
        with pytest.raises(ConfigError, match=re.escape(f"config file {path} {needle}")):
            resolve(config_file=path, search_dir=tmp_path, environ={})


def test_env_file_kinds(tmp_path, fifo, clean_env):
    for path, needle in _kinds(tmp_path, fifo):
        with pytest.raises(ConfigError, match=re.escape(f".env file {path} {needle}")):
            resolve(env_file=path, search_dir=tmp_path, environ={})


def test_policy_file_kinds(tmp_path, fifo):
    for path, needle in _kinds(tmp_path, fifo):
        with pytest.raises(PolicyError, match=re.escape(f"policy file {path} {needle}")):
            Policy.load(path)


def test_found_config_that_is_a_fifo_is_refused(tmp_path, clean_env):
    os.mkfifo(tmp_path / "mixprec.toml")
    with pytest.raises(ConfigError, match="mixprec.toml is a named pipe"):
        resolve(search_dir=tmp_path, environ={})


@pytest.mark.parametrize("args", [["config", "show", "--config", "/dev/zero"], ["env", "--env-file", "/dev/zero"],
                                  ["explain", "--pipeline", "tts", "--size", "test", "--policy", "/dev/zero"]])
def test_cli_names_a_device(args, tmp_path, clean_env):
    clean_env.chdir(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "/dev/zero is a device, not a regular file" in result.output


def test_byte_order_marks_are_read(tmp_path, clean_env):
    bom = b"\xef\xbb\xbf"
    (tmp_path / "mixprec.toml").write_bytes(bom + b'float32_matmul_precision = "high"\n')
    (tmp_path / ".env").write_bytes(bom + b"MIXPREC_CONV_TF32=false\n")
    resolved = resolve(search_dir=tmp_path, environ={})
    assert resolved.settings["float32_matmul_precision"].value == "high"
    assert resolved.settings["conv_tf32"].value is False
    policy = tmp_path / "p.toml"
    policy.write_bytes(bom + b'name = "bom"\n[[rules]]\nmatch = "*"\nstorage = "bf16"\n')
    assert Policy.load(policy).name == "bom"
    policy_json = tmp_path / "p.json"
    policy_json.write_bytes(bom + b'{"name": "bomj", "rules": []}')
    assert Policy.load(policy_json).name == "bomj"


def test_deep_nesting_is_a_clear_error(tmp_path, clean_env):
    depth = 100_000
    (tmp_path / "mixprec.toml").write_text("a = " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        resolve(search_dir=tmp_path, environ={})
    (tmp_path / "p.json").write_text("[" * depth + "]" * depth)
    with pytest.raises(PolicyError, match="p.json: nested too deeply"):
        Policy.load(tmp_path / "p.json")
    (tmp_path / "p.toml").write_text("rules = " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(PolicyError, match="p.toml: nested too deeply"):
        Policy.load(tmp_path / "p.toml")
    (tmp_path / "deep.toml").write_text("x = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        resolve(config_file=tmp_path / "deep.toml", environ={})


def test_oversized_files_are_refused_unread(tmp_path, clean_env):
    big = tmp_path / "big.toml"
    with open(big, "wb") as handle:
        handle.truncate(MAX_INPUT_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(ConfigError, match=f"config file {big} is {MAX_INPUT_BYTES + 1:,} bytes"):
        resolve(config_file=big, environ={})
    with pytest.raises(PolicyError, match="is read only up to"):
        Policy.load(big)


def test_pyproject_with_a_non_table_tool(tmp_path, clean_env):
    (tmp_path / "pyproject.toml").write_text('tool = "x"\n')
    with pytest.raises(ConfigError, match=r"pyproject.toml key tool: expected a table \(\[tool\.\*\] sections\), got str"):
        resolve(search_dir=tmp_path, environ={})
    (tmp_path / "pyproject.toml").write_text('[tool]\nmixprec = 3\n')
    with pytest.raises(ConfigError, match="expected a table of settings, got int"):
        resolve(search_dir=tmp_path, environ={})


def test_a_huge_unknown_env_name_is_clipped(tmp_path, clean_env):
    name = "MIXPREC_" + "X" * 120_000
    resolved = resolve(search_dir=tmp_path, environ={name: "1"})
    (warning,) = resolved.warnings
    assert len(warning) < 300 and "(120008 characters)" in warning


def test_thousands_of_unknown_env_names_are_summarised(tmp_path, clean_env):
    environ = {f"MIXPREC_UNKNOWN_{i}": "1" for i in range(3000)}
    resolved = resolve(search_dir=tmp_path, environ=environ)
    assert len(resolved.warnings) == 21
    assert resolved.warnings[-1].startswith("... and 2980 more unknown MIXPREC_* settings from env; ignored")
    result = runner.invoke(app, ["config", "show"], env=environ)
    assert result.exit_code == 0 and result.output.count("warning:") == 21
