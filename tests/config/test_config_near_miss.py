"""Near misses of a setting's name, from every source: what made them near (case, a separator,
a typo, another app's prefix, no prefix, look-alike or invisible characters) is said, once per
process, in mixprec's words; the text and JSON outputs carry it."""

from __future__ import annotations

import json
import logging

import pytest
from typer.testing import CliRunner

import mixprec
from mixprec.cli import app
from mixprec.config import ConfigError, resolve
from mixprec.config.names import closest, forget_said

runner = CliRunner()

_M = "FLOAT32_MATMUL_PRECISION"

#: (name as given, what the reason must say)
_NEAR = [
    (f"mixprec_{_M.lower()}", f"names are matched in upper case: write MIXPREC_{_M}"),
    (f"MIXPREC-{_M.replace('_', '-')}", f"'-' where the name has '_'; write MIXPREC_{_M}"),
    (f"MIXPREC__{_M}", f"'__' where the name has '_'; write MIXPREC_{_M}"),
    (f"MIXPREC_{_M}\u200b", f"invisible characters \\u200b (ZERO WIDTH SPACE); write MIXPREC_{_M}"),
    ("MIXPREC_FLOAT32_MATMUL_PREC\u0406SION", "look-alike letters \\u0406 (CYRILLIC CAPITAL LETTER BYELORUSSIAN-UKRAINIAN I) for 'I'"),
    (f"\u041cIXPREC_{_M}", "look-alike letters \\u041c (CYRILLIC CAPITAL LETTER EM) for 'M'"),
    (f"ＭＩＸＰＲＥＣ_{_M}", "other forms of letters \\uff2d (FULLWIDTH LATIN CAPITAL LETTER M) for 'M'"),
    ("MIXPREC_FLOAT32_MATMUL_PRECISON", f"not a setting; did you mean MIXPREC_{_M}?"),
    ("MIXPRC_CONV_TF32", "not a setting; did you mean MIXPREC_CONV_TF32?"),
    (_M, f"a setting's name without a prefix is not read (read: MIXPREC_*); write MIXPREC_{_M}"),
    (f"ACE_STEP_{_M}", "prefix ACE_STEP_ is not this app's (read: MIXPREC_*); pass --app ACE_STEP"),
]


@pytest.mark.parametrize(("name", "reason"), _NEAR)
@pytest.mark.parametrize("layer", ["env", "dotenv"])
def test_a_near_miss_of_a_name_is_not_read_and_is_said_with_what_made_it_near(name, reason, layer, tmp_path, clean_env):
    if layer == "dotenv":
        (tmp_path / ".env").write_text(f"{name}=medium\n", encoding="utf-8")
        r = resolve(search_dir=tmp_path, environ={"PATH": "/bin"})
    else:
        r = resolve(search_dir=tmp_path, environ={name: "medium", "PATH": "/bin", "HOME": "/root"})
    assert r.numeric == mixprec.NumericSettings()  # a near miss is not read: the user is told instead
    (item,) = r.unused
    assert item.name == name and item.warns and reason in item.reason, item.reason
    assert str(item).isascii() and r.warnings == ()  # said once, in one place, every character visible


@pytest.mark.parametrize("name", ["PATH", "HOME", "PRESET", "POLICY", "CUDA_VISIBLE_DEVICES", "HF_TOKEN", "TF32",
                                  "MY_MATMUL", "OMP_NUM_THREADS", "PYTHONPATH"])
def test_names_of_other_programs_are_not_near_misses(name, tmp_path, clean_env):
    r = resolve(search_dir=tmp_path, environ={name: "medium"})
    assert r.unused == () and r.warnings == ()


def test_the_detector_finds_the_name_meant_or_none():
    names = [f"MIXPREC_{_M}", "MIXPREC_PRESET", "MIXPREC_POLICY"]
    assert closest(f"MIXPREC_{_M}", names) is None
    assert closest("mixprec.preset", names) == ("MIXPREC_PRESET", True)
    assert closest("MIXPREC_PRESTE", names) == ("MIXPREC_PRESET", False)
    assert closest("MIXPREC_POLICE", names) == ("MIXPREC_POLICY", False)
    assert closest("SOMETHING_ELSE", names) is None


@pytest.mark.parametrize(("key", "hint"), [
    ("float32-matmul-precision", "did you mean 'float32_matmul_precision'? it has '-' where the name has '_'"),
    ("Float32_Matmul_Precision", "did you mean 'float32_matmul_precision'? it has upper or mixed case"),
    ("conv_tf32\u200b", "did you mean 'conv_tf32'? it has invisible characters \\u200b (ZERO WIDTH SPACE)"),
    ("pres\u0435t", "did you mean 'preset'? it has look-alike letters \\u0435 (CYRILLIC SMALL LETTER IE) for 'e'"),
    ("conv_tf23", "did you mean 'conv_tf32'?"),
])
def test_a_toml_key_near_a_settings_is_an_error_naming_the_key_meant(key, hint, tmp_path, clean_env):
    (tmp_path / "mixprec.toml").write_text(f'"{key}" = "high"\n', encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        resolve(search_dir=tmp_path, environ={})
    message = str(info.value)
    assert "mixprec.toml: unknown key" in message and hint in message and message.isascii()


@pytest.mark.parametrize("layer", ["code", "cli"])
def test_a_keyword_near_a_settings_from_code_or_flags_names_the_key_meant(layer, tmp_path, clean_env):
    with pytest.raises(ConfigError, match=r"unknown setting 'float32-matmul-precision' \(" + layer
                       + r"\) \(did you mean 'float32_matmul_precision'\? it has '-' where the name has '_'\)"):
        resolve(search_dir=tmp_path, environ={}, **{layer: {"float32-matmul-precision": "high"}})


def test_init_warns_once_per_process_however_often_it_runs(tmp_path, clean_env, caplog):
    forget_said()
    caplog.set_level(logging.INFO, logger="mixprec")
    environ = {f"mixprec_{_M.lower()}": "medium", "MIXPREC_PRESET": "fast\u00a0"}
    before = mixprec.snapshot()
    try:
        for _ in range(3):
            mixprec.init(search_dir=tmp_path, environ=environ)
    finally:
        mixprec.restore(before)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2, warned
    assert any(f"'mixprec_{_M.lower()}' (env): names are matched in upper case" in w for w in warned)
    assert any("'preset' (env MIXPREC_PRESET): value 'fast\\xa0' read as 'fast': \\xa0 (NO-BREAK SPACE) removed" in w
               for w in warned)
    assert all("Traceback" not in w and ".py" not in w for w in warned)


@pytest.mark.parametrize("command", [["config", "show"], ["env", "--device", "cpu"]])
def test_the_cli_says_it_in_text_and_json(command, tmp_path, clean_env):
    forget_said()  # a command is a process of its own; here earlier tests ran in this one
    clean_env.chdir(tmp_path)
    environ = {f"mixprec_{_M.lower()}": "medium", "MIXPREC_PRESET": "fast\u00a0"}
    shown = runner.invoke(app, command, env=environ)
    assert shown.exit_code == 0, shown.output
    assert shown.output.count(f"'mixprec_{_M.lower()}' (env): names are matched in upper case") == 1
    assert shown.output.count("read as 'fast'") == 1
    data = json.loads(runner.invoke(app, [*command, "--json"], env=environ).stdout)
    names = {u["name"]: u for u in data["unused"]}
    assert names[f"mixprec_{_M.lower()}"]["kind"] == "near miss" and names["preset"]["kind"] == "read as"
    assert data["warnings"] == []


@pytest.mark.parametrize(("flag", "how"), [
    ("--float32_matmul_precision", "flags are lower case, their words joined by '-'"),
    ("--Float32-Matmul-Precision", "flags are lower case"),
    ("--float32-matmul-prec\u0456sion", "look-alike letters \\u0456 (CYRILLIC SMALL LETTER BYELORUSSIAN-UKRAINIAN I) for 'i'"),
    ("--conv-tf32\u200b", "invisible characters \\u200b (ZERO WIDTH SPACE)"),
    ("--float32-matmul-precison", "a typo?"),
])
@pytest.mark.parametrize("command", [["config", "show"], ["env"]])
def test_a_flag_near_a_commands_option_names_the_option_meant(flag, how, command, tmp_path, clean_env):
    clean_env.chdir(tmp_path)
    before = mixprec.snapshot()
    result = runner.invoke(app, [*command, flag, "medium"], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "Traceback" not in result.output
    meant = "--conv-tf32" if "conv" in flag else "--float32-matmul-precision"
    text = " ".join(result.output.replace("│", " ").split())
    assert f"did you mean {meant}?" in text and how in text, text
    assert mixprec.snapshot() == before


def test_a_near_miss_of_the_apps_prefix_is_said(tmp_path, clean_env):
    r = resolve("ACE_STEP", search_dir=tmp_path, environ={f"ACESTEP_{_M}": "medium"})
    (item,) = r.unused
    assert r.numeric.matmul == "highest" and f"did you mean ACE_STEP_{_M}?" in item.reason


@pytest.mark.parametrize(("given", "name"), [(" FAST\u00a0", "fast"), ("Naive-BF16\u200b", "naive-bf16"),
                                             ("ＭＥＭＯＲＹ+compile", "memory+compile")])
def test_bench_configuration_names_are_read_as_words(given, name):
    from mixprec.bench.configs import _parse_names

    assert [s.name for s in _parse_names(given)[0]] == ["fp32", name]


def test_a_look_alike_configuration_name_is_refused_naming_the_letter():
    from mixprec.bench.configs import UnknownConfigError, _parse_names

    with pytest.raises(UnknownConfigError, match=r"'fa\\u0455t' \(did you mean 'fast'\? \\u0455 \(CYRILLIC SMALL LETTER DZE\) "
                                                 r"looks like 's'\)"):
        _parse_names("fa\u0455t")
