"""Settings: what was seen and not used is said with the reason (another app's prefix, case,
a shadowed spelling, an overridden value, a .env that is a directory); look-alike values are
refused with their non-ASCII characters escaped; a relative path in a settings file is read
from that file's folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import mixprec
from mixprec.cli import app
from mixprec.config import ConfigError, resolve
from mixprec.policy import Policy, Rule

runner = CliRunner()

_MATMUL = "FLOAT32_MATMUL_PRECISION"


class TestNamesNotUsed:
    @pytest.mark.parametrize(("name", "app", "reason"), [
        (f"ACE_STEP_{_MATMUL}", None, "prefix ACE_STEP_ is not this app's (read: MIXPREC_*); pass --app ACE_STEP"),
        (f"OTHER_APP_{_MATMUL}", "ACE_STEP", "prefix OTHER_APP_ is not this app's (read: ACE_STEP_*, MIXPREC_*)"),
        ("MYAPP_CONV_TF32", None, "prefix MYAPP_ is not this app's"),
        (f"mixprec_{_MATMUL.lower()}", None, f"names are matched in upper case: write MIXPREC_{_MATMUL}"),
        (f"Mixprec_{_MATMUL}", None, f"write MIXPREC_{_MATMUL}"),
        (f"MIXPREC_{_MATMUL.lower()}", None, f"write MIXPREC_{_MATMUL}"),
        (f"ace_step_{_MATMUL.lower()}", "ACE_STEP", f"write ACE_STEP_{_MATMUL}"),
        (f"ace_step_{_MATMUL.lower()}", None, f"pass --app ACE_STEP (mixprec.init(app='ACE_STEP')) and write the name as ACE_STEP_{_MATMUL}"),
        ("mixprec_no_such_setting", None, "names are matched in upper case, and MIXPREC_NO_SUCH_SETTING is not a setting either"),
    ])
    @pytest.mark.parametrize("layer", ["dotenv", "env"])
    def test_a_name_not_read_is_listed_with_the_reason(self, name, app, reason, layer, tmp_path, clean_env):
        value = "true" if name.upper().endswith("TF32") else "medium"
        if layer == "dotenv":
            (tmp_path / ".env").write_text(f"HF_TOKEN=x\n{name}={value}\n")
            r = resolve(app, search_dir=tmp_path, environ={"PATH": "/bin"})
            where = f"{tmp_path / '.env'} line 2"
        else:
            r = resolve(app, search_dir=tmp_path, environ={name: value, "PATH": "/bin", "HOME": "/root"})
            where = "env"
        assert r.numeric == mixprec.NumericSettings()  # not read
        (item,) = r.unused  # nothing else of the source is listed (HF_TOKEN, PATH are the app's own)
        assert (item.name, item.where) == (name, where) and reason in item.reason

    @pytest.mark.parametrize("name", ["OMP_WAIT_POLICY", "KMP_AFFINITY_POLICY", "TORCHINDUCTOR_CONV_TF32", "HF_HUB_PRESET"])
    def test_another_librarys_variable_that_ends_like_a_setting_is_not_listed(self, name, tmp_path, clean_env):
        """OpenMP's OMP_WAIT_POLICY ends like mixprec's POLICY setting: it is OpenMP's, not an app prefix."""
        value = "true" if name.endswith("TF32") else "PASSIVE"
        r = resolve(None, search_dir=tmp_path, environ={name: value, "PATH": "/bin"})
        assert tuple(r.unused) == () and r.numeric == mixprec.NumericSettings()

    @pytest.mark.parametrize("layer", ["dotenv", "env"])
    def test_a_spelling_the_apps_own_shadows_is_listed(self, layer, tmp_path, clean_env):
        names = {f"ACE_STEP_{_MATMUL}": "high", f"MIXPREC_{_MATMUL}": "medium"}
        if layer == "dotenv":
            (tmp_path / ".env").write_text("".join(f"{k}={v}\n" for k, v in names.items()))
            r = resolve("ACE_STEP", search_dir=tmp_path, environ={})
        else:
            r = resolve("ACE_STEP", search_dir=tmp_path, environ=names)
        assert r.numeric.matmul == "high"
        (item,) = r.unused
        assert item.name == f"MIXPREC_{_MATMUL}" and f"ACE_STEP_{_MATMUL} is read instead" in item.reason

    def test_an_overridden_value_is_listed(self, tmp_path, clean_env):
        (tmp_path / "mixprec.toml").write_text('float32_matmul_precision = "high"\n')
        r = resolve(search_dir=tmp_path, environ={f"MIXPREC_{_MATMUL}": "medium"})
        assert r.numeric.matmul == "medium"
        (item,) = r.unused
        assert item.where.endswith("mixprec.toml key float32_matmul_precision")
        assert item.reason == f"overridden by env MIXPREC_{_MATMUL}"

    def test_config_show_says_what_was_not_used(self, tmp_path, clean_env):
        clean_env.chdir(tmp_path)
        (tmp_path / ".env").write_text(f"ACE_STEP_{_MATMUL}=high\n")
        shown = runner.invoke(app, ["config", "show"])
        assert shown.exit_code == 0, shown.output
        assert "highest" in shown.stdout and "not used: 'ACE_STEP_FLOAT32_MATMUL_PRECISION'" in shown.stdout
        assert "pass --app ACE_STEP" in shown.stdout
        data = json.loads(runner.invoke(app, ["config", "show", "--json"]).stdout)
        assert [u["name"] for u in data["unused"]] == [f"ACE_STEP_{_MATMUL}"]
        used = json.loads(runner.invoke(app, ["config", "show", "--json", "--app", "ACE_STEP"]).stdout)
        assert used["unused"] == [] and used["settings"][0]["value"] == "high"


class TestDotenvDirectory:
    @pytest.mark.parametrize("venv", [True, False])
    @pytest.mark.parametrize("name", [".env", "mixprec.toml", "pyproject.toml"])
    def test_a_settings_name_that_is_a_directory_is_skipped_with_a_note(self, name, venv, tmp_path, clean_env):
        (tmp_path / name).mkdir()
        if venv:
            (tmp_path / name / "pyvenv.cfg").write_text("home = /usr/bin\n")
        r = resolve(search_dir=tmp_path, environ={f"MIXPREC_{_MATMUL}": "medium"})
        assert r.numeric.matmul == "medium" and r.files == ()
        (item,) = r.unused
        assert item.name == name and "is a directory, not a file" in item.reason and "skipped" in item.reason
        assert ("virtual environment" in item.reason) == venv

    def test_a_directory_named_explicitly_is_still_an_error(self, tmp_path, clean_env):
        (tmp_path / "venv").mkdir()
        with pytest.raises(ConfigError, match="is a directory, not a file"):
            resolve(env_file=tmp_path / "venv", environ={})


# Look-alikes of valid words: letters of another script (Cyrillic, Greek), which are other words.
_LOOK_ALIKES = ["h\u0456gh", "m\u0435dium", "hig\u04bb", "\u043eff", "tru\u0435", "\u0397IGH", "fa\u0455t"]
# The same word with what nobody sees or another form of its letters: read as that word, with a note.
_SAME_WORD = {"FLOAT32_MATMUL_PRECISION": ("medium", ["ｍｅｄｉｕｍ", "medium\u00a0", "me\u200bdium", "\u2003MEDIUM\ufeff"]),
              "CONV_TF32": (False, ["ｏｆｆ", "off\u00a0", "o\u200dff", "\u3000False"]),
              "PRESET": ("fast", ["ｆａｓｔ", "fast\u00a0", "fa\u200bst", "faſt", " FAST\u202f"])}


class TestLookAlikeValues:
    @pytest.mark.parametrize("value", _LOOK_ALIKES)
    @pytest.mark.parametrize("key", ["FLOAT32_MATMUL_PRECISION", "CONV_TF32", "PRESET"])
    def test_non_ascii_values_are_refused_with_the_characters_escaped(self, value, key, tmp_path, clean_env):
        with pytest.raises(ConfigError) as info:
            resolve(search_dir=tmp_path, environ={f"MIXPREC_{key}": value})
        message = str(info.value)
        assert message.isascii() and ascii(value) in message and "non-ASCII" in message
        assert f"env MIXPREC_{key}" in message and "valid values:" in message
        assert "looks like '" in message  # which letter it passes for

    @pytest.mark.parametrize("key", list(_SAME_WORD))
    @pytest.mark.parametrize("layer", ["env", "dotenv", "toml", "code"])
    def test_invisible_characters_and_other_forms_read_as_the_word_with_a_note(self, key, layer, tmp_path, clean_env):
        expected, values = _SAME_WORD[key]
        for value in values:
            environ, code = {}, None
            if layer == "env":
                environ = {f"MIXPREC_{key}": value}
            elif layer == "dotenv":
                (tmp_path / ".env").write_text(f"MIXPREC_{key}='{value}'\n", encoding="utf-8")
            elif layer == "toml":
                (tmp_path / "mixprec.toml").write_text(f'{key.lower()} = "{value}"\n', encoding="utf-8")
            else:
                code = {key.lower(): value}
            r = resolve(search_dir=tmp_path, environ=environ, code=code)
            assert r.settings[key.lower()].value == expected, value
            notes = [u for u in r.unused if u.kind == "read as"]
            if value.strip(" ").isascii():
                assert notes == []
            else:
                (note,) = notes
                assert note.warns and str(note).isascii() and ascii(value) in str(note) and "read as" in note.reason
                assert ("removed" in note.reason) or ("read as '" in note.reason)

    @pytest.mark.parametrize("value", _LOOK_ALIKES[:4])
    def test_in_a_toml_file_too(self, value, tmp_path, clean_env):
        (tmp_path / "mixprec.toml").write_text(f'float32_matmul_precision = "{value}"\n', encoding="utf-8")
        with pytest.raises(ConfigError, match="mixprec.toml key float32_matmul_precision") as info:
            resolve(search_dir=tmp_path, environ={})
        assert ascii(value) in str(info.value)


class TestRelativePaths:
    @pytest.mark.parametrize("layout", ["dotenv", "mixprec.toml", "pyproject.toml"])
    @pytest.mark.parametrize("relative", ["p.toml", "./p.toml", "policies/p.toml", "../up/p.toml"])
    def test_a_relative_path_in_a_file_is_read_from_its_folder(self, layout, relative, tmp_path, clean_env):
        folder = tmp_path / "app" / "conf"
        folder.mkdir(parents=True)
        clean_env.chdir(tmp_path)  # the working directory is elsewhere: a path read from it would miss
        policy = Policy((Rule("*", storage="bf16"),), name="mine")
        target = (folder / relative).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        if layout == "dotenv":
            (folder / ".env").write_text(f"MIXPREC_POLICY={relative}\n")
        elif layout == "mixprec.toml":
            (folder / "mixprec.toml").write_text(f'policy = "{relative}"\n')
        else:
            (folder / "pyproject.toml").write_text(f'[tool.mixprec]\npolicy = "{relative}"\n')
        with pytest.raises(ConfigError) as info:
            resolve(search_dir=folder, environ={})
        (message,) = info.value.problems  # (the error's text clips each problem; these temporary paths are long)
        assert f"relative to the folder of {folder / ('.env' if layout == 'dotenv' else layout)}" in message
        assert f"looked for {folder / relative}" in message and "does not exist" in message
        policy.save(target)
        r = resolve(search_dir=folder, environ={})
        assert r.policy().name == "mine" and Path(r.policy_file).resolve() == target
        applied = mixprec.init(search_dir=folder, environ={}, apply=False)
        assert applied.policy_obj.name == "mine"

    def test_a_relative_path_from_the_environment_is_read_from_the_working_directory(self, tmp_path, clean_env):
        clean_env.chdir(tmp_path)
        with pytest.raises(ConfigError, match=rf"env MIXPREC_POLICY \(relative to the working directory {tmp_path}\)"):
            resolve(search_dir=tmp_path / "x", environ={"MIXPREC_POLICY": "p.toml"})
        Policy((Rule("*", storage="bf16"),), name="cwd").save(tmp_path / "p.toml")
        assert resolve(search_dir=tmp_path / "x", environ={"MIXPREC_POLICY": "p.toml"}).policy().name == "cwd"
