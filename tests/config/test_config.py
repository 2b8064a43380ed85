from __future__ import annotations

import logging
import textwrap

import pytest
import torch

import mixprec
from mixprec.device import backends
from mixprec.config import ConfigError, resolve


def _write(path, text):
    path.write_text(textwrap.dedent(text).lstrip())
    return path


@pytest.fixture
def layers(tmp_path, clean_env):
    """A directory with every file layer present; returns a helper to resolve in it."""

    def run(*, pyproject=None, toml=None, dotenv=None, environ=None, cli=None, code=None, app="MYAPP"):
        if pyproject is not None:
            _write(tmp_path / "pyproject.toml", f'[project]\nname = "x"\n\n[tool.mixprec]\nfloat32_matmul_precision = "{pyproject}"\n')
        if toml is not None:
            _write(tmp_path / "mixprec.toml", f'float32_matmul_precision = "{toml}"\n')
        if dotenv is not None:
            _write(tmp_path / ".env", f"OTHER=1\n{dotenv}\n")
        return resolve(app, search_dir=tmp_path, environ=environ or {}, cli=cli,
                       code={"float32_matmul_precision": code} if code else None)

    return run


# Each row adds one layer above the previous ones; the new layer must win.
PRECEDENCE = [
    ({}, "highest", "default"),
    ({"pyproject": "medium"}, "medium", "pyproject.toml [tool.mixprec] key float32_matmul_precision"),
    ({"pyproject": "medium", "toml": "high"}, "high", "mixprec.toml key float32_matmul_precision"),
    ({"pyproject": "medium", "toml": "high", "dotenv": "MYAPP_FLOAT32_MATMUL_PRECISION=medium"}, "medium", ".env line 2 MYAPP_FLOAT32_MATMUL_PRECISION"),
    ({"toml": "high", "dotenv": "MYAPP_FLOAT32_MATMUL_PRECISION=medium", "environ": {"MIXPREC_FLOAT32_MATMUL_PRECISION": "high"}}, "high", "env MIXPREC_FLOAT32_MATMUL_PRECISION"),
    ({"environ": {"MIXPREC_FLOAT32_MATMUL_PRECISION": "high", "MYAPP_FLOAT32_MATMUL_PRECISION": "medium"}}, "medium", "env MYAPP_FLOAT32_MATMUL_PRECISION"),
    ({"environ": {"MYAPP_FLOAT32_MATMUL_PRECISION": "medium"}, "dotenv": "MYAPP_FLOAT32_MATMUL_PRECISION=high", "cli": {"float32_matmul_precision": "high"}}, "high", "flag --float32-matmul-precision"),
    ({"environ": {"MYAPP_FLOAT32_MATMUL_PRECISION": "medium"}, "cli": {"float32_matmul_precision": "high"}, "code": "highest"}, "highest", "argument float32_matmul_precision="),
]


@pytest.mark.parametrize(("given", "value", "where"), PRECEDENCE, ids=[w.split()[0] for _, _, w in PRECEDENCE])
def test_precedence(layers, given, value, where):
    resolved = layers(**given)
    assert resolved.numeric.matmul == value
    assert resolved.source_of("float32_matmul_precision").where.endswith(where)


@pytest.mark.parametrize("raw", ["HIGH", " high ", "High\t", "hIgH"])
def test_values_are_case_and_whitespace_insensitive(layers, raw):
    assert layers(environ={"MIXPREC_FLOAT32_MATMUL_PRECISION": raw}).numeric.matmul == "high"
    assert layers(cli={"float32_matmul_precision": raw}).numeric.matmul == "high"
    assert layers(dotenv=f"MYAPP_FLOAT32_MATMUL_PRECISION='{raw}'").numeric.matmul == "high"
    assert mixprec.NumericSettings(matmul=raw).matmul == "high"


@pytest.mark.parametrize(("raw", "value"), [("on", True), ("TRUE", True), (" yes ", True), ("1", True),
                                            ("off", False), ("False", False), (" NO", False), ("0", False)])
def test_booleans(clean_env, tmp_path, raw, value):
    assert resolve(search_dir=tmp_path, environ={"MIXPREC_CONV_TF32": raw}).numeric.conv_tf32 is value


# -- bad input: every source names itself, the bad value and the valid values --------


def _problem(excinfo):
    return str(excinfo.value)


def test_bad_env_var(layers):
    with pytest.raises(ConfigError) as excinfo:
        layers(environ={"MYAPP_FLOAT32_MATMUL_PRECISION": "fast"})
    msg = _problem(excinfo)
    assert "env MYAPP_FLOAT32_MATMUL_PRECISION" in msg and "'fast'" in msg and "highest, high, medium" in msg


def test_bad_toml_value_and_type(tmp_path, clean_env):
    _write(tmp_path / "mixprec.toml", "float32_matmul_precision = 3\nconv_tf32 = \"maybe\"\n")
    with pytest.raises(ConfigError) as excinfo:
        resolve(search_dir=tmp_path, environ={})
    msg = _problem(excinfo)
    assert f"{tmp_path / 'mixprec.toml'} key float32_matmul_precision" in msg and "expected a string" in msg
    assert "key conv_tf32" in msg and "'maybe'" in msg and "true/false" in msg
    assert len(excinfo.value.problems) == 2  # every problem reported at once


def test_bad_pyproject_value(tmp_path, clean_env):
    _write(tmp_path / "pyproject.toml", "[tool.mixprec]\nfloat32_matmul_precision = 'hihg'\n")
    with pytest.raises(ConfigError, match=r"pyproject.toml \[tool.mixprec\] key float32_matmul_precision.*'hihg' \(did you mean 'high'\?\)"):
        resolve(search_dir=tmp_path, environ={})


def test_unknown_toml_key_suggests(tmp_path, clean_env):
    _write(tmp_path / "mixprec.toml", "float32_matmul_precison = 'high'\n")
    with pytest.raises(ConfigError, match=r"unknown key 'float32_matmul_precison' \(did you mean 'float32_matmul_precision'\?\)"):
        resolve(search_dir=tmp_path, environ={})


def test_malformed_toml_names_file_and_line(tmp_path, clean_env):
    _write(tmp_path / "mixprec.toml", "conv_tf32 = true\nfloat32_matmul_precision = \n")
    with pytest.raises(ConfigError, match=r"mixprec.toml: malformed TOML: .*line 2"):
        resolve(search_dir=tmp_path, environ={})


def test_malformed_dotenv_names_file_and_line(tmp_path, clean_env):
    _write(tmp_path / ".env", "A=1\nMYAPP_FLOAT32_MATMUL_PRECISION='high\n")
    with pytest.raises(ConfigError, match=r"\.env line 2: malformed \.env line"):
        resolve("MYAPP", search_dir=tmp_path, environ={})


def test_bad_dotenv_value_names_line_and_key(layers):
    with pytest.raises(ConfigError, match=r"\.env line 2 MYAPP_CONV_TF32: invalid value 'perhaps'"):
        layers(dotenv="MYAPP_CONV_TF32=perhaps")


def test_bad_cli_and_code_values(layers):
    with pytest.raises(ConfigError, match=r"flag --float32-matmul-precision: invalid value 'max'"):
        layers(cli={"float32_matmul_precision": "max"})
    with pytest.raises(ConfigError, match=r"argument float32_matmul_precision=: invalid value 'max'"):
        layers(code="max")


def test_unknown_mixprec_env_var_warns_with_suggestion(layers):
    resolved = layers(environ={"MIXPREC_FLOAT32_MATMUL_PRECISON": "high", "MIXPREC_NO_SUCH_THING": "1"})
    (typo,) = resolved.unused  # a near miss of a setting: said once, as not used, with the name meant
    assert typo.name == "MIXPREC_FLOAT32_MATMUL_PRECISON" and typo.warns
    assert "did you mean MIXPREC_FLOAT32_MATMUL_PRECISION?" in typo.reason
    (unknown,) = resolved.warnings  # near no setting: an unknown setting
    assert "unknown setting MIXPREC_NO_SUCH_THING from env; ignored" in unknown


def test_bad_app_prefix():
    with pytest.raises(ValueError, match="invalid app prefix"):
        resolve("9 lives", environ={})


# -- init: all or nothing, logged with sources -----------------------------------------


def test_init_applies_and_logs_sources(tmp_path, clean_env, caplog):
    caplog.set_level(logging.INFO, logger="mixprec")
    env = {"ACE_STEP_FLOAT32_MATMUL_PRECISION": "high", "MIXPREC_CONV_TF32": "off"}
    resolved = mixprec.init(app="ACE_STEP", search_dir=tmp_path, environ=env)
    assert torch.get_float32_matmul_precision() == "high"
    assert torch.backends.cudnn.allow_tf32 is False
    assert "float32 matmul precision = high (from env ACE_STEP_FLOAT32_MATMUL_PRECISION)" in caplog.messages
    assert "cuDNN conv TF32 = false (from env MIXPREC_CONV_TF32)" in caplog.messages
    assert resolved.previous is not None
    mixprec.restore(resolved.previous)
    assert torch.get_float32_matmul_precision() == "highest"


def test_init_with_any_bad_value_applies_nothing(tmp_path, clean_env):
    before = backends.snapshot()
    env = {"MIXPREC_FLOAT32_MATMUL_PRECISION": "medium", "MIXPREC_BF16_REDUCED_PRECISION_REDUCTION": "sometimes"}
    with pytest.raises(ConfigError, match="MIXPREC_BF16_REDUCED_PRECISION_REDUCTION"):
        mixprec.init(search_dir=tmp_path, environ=env)
    assert backends.snapshot() == before


def test_init_reads_dotenv_like_the_app_documents(tmp_path, clean_env):
    _write(tmp_path / ".env", "ACE_STEP_FLOAT32_MATMUL_PRECISION=medium\n")
    resolved = mixprec.init(app="ACE_STEP", search_dir=tmp_path, environ={})
    assert resolved.numeric.matmul == "medium"
    assert torch.get_float32_matmul_precision() == "medium"


def test_explicit_config_file(tmp_path, clean_env):
    cfg = _write(tmp_path / "custom.toml", "[mixprec]\nfloat32_matmul_precision = 'medium'\n")
    assert resolve(config_file=cfg, environ={}).numeric.matmul == "medium"
    with pytest.raises(ConfigError, match="does not exist"):
        resolve(config_file=tmp_path / "missing.toml", environ={})
