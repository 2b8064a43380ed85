"""Policy documents are checked as a whole before their fields; preset overrides of the wrong
type are PolicyErrors; rules that match nothing are reported, summarised when many; names
are compared in Unicode NFC and a near miss shows its non-ASCII characters escaped."""

from __future__ import annotations

import json
import unicodedata
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from typer.testing import CliRunner

import mixprec
from mixprec.cli import app
from mixprec.policy import Policy, PolicyError, Rule
from mixprec.policy.select import UNMATCHED_LISTED, UnmatchedRuleWarning

runner = CliRunner()

_GOOD = {"version": 1, "name": "p", "rules": [{"match": "enc", "storage": "bf16"}], "numerics": {"matmul": "high"}}


def _json_with_twice(key_path: str) -> str:
    """``_GOOD`` as JSON text with one key written twice at ``key_path`` (``rules``, ``rules[0].storage``...)."""
    if key_path in ("rules", "name", "version", "numerics"):
        body = json.dumps(_GOOD)[1:-1]
        return "{" + body + f', "{key_path}": ' + json.dumps(_GOOD[key_path]) + "}"
    if key_path == "rules[0].storage":
        return json.dumps(_GOOD).replace('"storage": "bf16"', '"storage": "bf16", "storage": "fp32"')
    if key_path == "numerics.matmul":
        return json.dumps(_GOOD).replace('"matmul": "high"', '"matmul": "high", "matmul": "medium"')
    raise AssertionError(key_path)


class TestPolicyDocuments:
    @pytest.mark.parametrize("key_path", ["rules", "name", "version", "numerics", "rules[0].storage", "numerics.matmul"])
    def test_a_json_key_given_twice_is_refused(self, key_path, tmp_path):
        path = tmp_path / "p.json"
        path.write_text(_json_with_twice(key_path))
        key = key_path.rpartition(".")[2].partition("[")[0]
        with pytest.raises(PolicyError, match=rf"{path}: key '{key}' appears twice in one JSON object"):
            Policy.load(path)
        assert Policy.from_json(json.dumps(_GOOD)).rules[0].storage == "bf16"  # the document without the repeat reads

    @pytest.mark.parametrize(("key", "value", "needle"), [
        ("version", True, "key 'version': expected the integer 1, got bool True"),
        ("version", 1.0, "key 'version': expected the integer 1, got float 1.0"),
        ("version", "1", "key 'version': expected the integer 1, got str '1'"),
        ("version", 2, "key 'version': unsupported version 2"),
        ("rules", "x", "key 'rules': expected an array of tables"),
        ("rules", {"match": "enc"}, "key 'rules': expected an array of tables"),
        ("rules", None, "key 'rules': expected an array of tables"),
        ("rules", [5], "rules[0]: expected a table"),
        ("rules", [{"match": "enc", "storage": "bf16"}, "enc"], "rules[1]: expected a table"),
        ("name", 3, "key 'name': expected a string"),
        ("numerics", "high", "key 'numerics': expected a table"),
        ("model_declarations", "yes", "key 'model_declarations': expected true or false"),
        ("compile", "inductor", "key 'compile': expected a table"),
        ("rulez", [], "unknown key 'rulez' (did you mean 'rules'?)"),
    ])
    @pytest.mark.parametrize("fmt", ["json", "dict"])
    def test_document_level_errors_name_the_key_before_any_field(self, key, value, needle, fmt):
        # the rules below are invalid as fields too: the document-level problem is reported first
        doc = {"version": 1, "rules": [{"match": "enc", "storage": "bf17"}], key: value}
        with pytest.raises(PolicyError) as info:
            Policy.from_json(json.dumps(doc), "p.json") if fmt == "json" else Policy.from_dict(doc, "p.json")
        assert needle in str(info.value) and "bf17" not in str(info.value)

    @pytest.mark.parametrize("version", [True, 1.0, 2, "1"])
    def test_policy_objects_refuse_a_version_that_only_equals_one(self, version):
        # a version of another kind than int is refused at the door (mixprec.Policy), still a PolicyError
        with pytest.raises(PolicyError, match=r"unsupported policy version|^mixprec\.Policy: version must be an int, not "):
            Policy(version=version)

    @given(st.lists(st.sampled_from(["rules", "name", "version", "numerics", "compile", "model_declarations"]),
                    min_size=1, max_size=4))
    @settings(max_examples=40, deadline=None)
    def test_any_repeated_top_level_key_is_refused(self, keys):
        values = {"rules": "[]", "name": '"x"', "version": "1", "numerics": "{}", "compile": "false",
                  "model_declarations": "true"}
        members = [f'"{k}": {values[k]}' for k in keys] + [f'"{keys[0]}": {values[keys[0]]}']
        with pytest.raises(PolicyError, match="appears twice"):
            Policy.from_json("{" + ", ".join(members) + "}")


@pytest.fixture(scope="module")
def cpu_hardware():
    """The run's CPU, read once (the overrides are checked whatever the probe found)."""
    from mixprec import hardware

    return hardware.probe("cpu", use_cache=False, layers=False)


class TestPresetOverrides:
    @pytest.mark.parametrize(("overrides", "needle"), [
        ({"rules": "x"}, "overrides rules: expected a list of Rule objects or tables"),
        ({"rules": 5}, "overrides rules: expected a list"),
        ({"rules": {"match": "vae", "keep_fp32": True}}, "overrides rules: expected a list"),
        ({"rules": [5]}, "overrides rules[0]: expected a Rule or a table"),
        ({"rules": [None]}, "overrides rules[0]: expected a Rule or a table"),
        ({"rules": [Rule("a", keep_fp32=True), "vae"]}, "overrides rules[1]: expected a Rule or a table"),
        ({"rules": [{"match": "vae", "storage": "bf17"}]}, "overrides rules[0]: rule 'vae' storage: unknown dtype 'bf17'"),
        ({"rules": [{"storage": "bf16"}]}, "overrides rules[0]: missing key 'match'"),
        ({"matmul": "h\u0456gh"}, "overrides matmul: invalid value 'h\\u0456gh'"),
        ({"matmul": 3}, "overrides matmul: expected a string"),
        ({"storage": "bf17"}, "overrides: rule '*' storage: unknown dtype 'bf17'"),
        ({"keep_fp32": "yes"}, "overrides: rule '*' keep_fp32: expected true or false"),
        ({"rulez": []}, "unknown override 'rulez' (did you mean 'rules'?)"),
    ])
    def test_bad_overrides_are_policy_errors_naming_the_field(self, overrides, needle, cpu_hardware):
        with pytest.raises(PolicyError) as info:
            mixprec.preset("fast", hardware=cpu_hardware, overrides=overrides)
        assert type(info.value) is PolicyError and needle in str(info.value)

    @pytest.mark.parametrize("overrides", [["rules"], "fast"])
    def test_overrides_of_the_wrong_kind_are_refused_at_the_door(self, overrides, cpu_hardware):
        with pytest.raises(TypeError, match=r"^mixprec.preset: overrides must be a mapping of strs to .* or None, not "):
            mixprec.preset("fast", hardware=cpu_hardware, overrides=overrides)


def _named(names: list[str]) -> nn.Module:
    model = nn.Module()
    for name in names:
        model.add_module(name, nn.Linear(4, 4))
    return model


# Module names and a rule for each: the same name in another Unicode normal form must match.
_ACCENTED = ["énc", "déc", "Ångström", "naïve_block", "ñ", "ḱ_proj", "e\u0301\u0323x"]


class TestUnmatchedRules:
    @pytest.mark.parametrize("n", [1, 2, UNMATCHED_LISTED, UNMATCHED_LISTED + 1, 40, 3000])
    def test_unmatched_rules_are_one_warning_each_or_one_summary(self, n):
        model = _named(["enc", "dec"])
        policy = Policy(tuple(Rule(f"model.nett.{i}", keep_fp32=True) for i in range(n)) + (Rule("enc", storage="bf16"),))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            applied = mixprec.apply(model, policy)
        applied.revert()
        ours = [w for w in caught if issubclass(w.category, UnmatchedRuleWarning)]
        assert len(applied.unmatched) == n and [u.index for u in applied.unmatched] == list(range(n))
        if n <= UNMATCHED_LISTED:
            assert len(ours) == n and all("matches no module" in str(w.message) for w in ours)
        else:
            assert len(ours) == 1
            text = str(ours[0].message)
            assert text.startswith(f"{n:,} policy rules match no module") and f"and {n - UNMATCHED_LISTED:,} more" in text
            assert text.count("'model.nett.") == UNMATCHED_LISTED and len(text) < 2000
        with pytest.raises(PolicyError, match="match" if n > 1 else "matches no module"):
            mixprec.apply(model, policy, strict=True)
        assert model.enc.weight.dtype == torch.float32  # strict refused before casting anything

    @pytest.mark.parametrize("name", _ACCENTED)
    @pytest.mark.parametrize(("rule_form", "model_form"), [("NFC", "NFD"), ("NFD", "NFC"), ("NFC", "NFC"), ("NFD", "NFD")])
    def test_names_match_in_any_normal_form(self, name, rule_form, model_form):
        model = _named([unicodedata.normalize(model_form, name), "other"])
        policy = Policy((Rule(unicodedata.normalize(rule_form, name), storage="bf16"),))
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnmatchedRuleWarning)
            with mixprec.apply(model, policy) as applied:
                assert applied.unmatched == []
                assert getattr(model, unicodedata.normalize(model_form, name)).weight.dtype == torch.bfloat16
                assert model.other.weight.dtype == torch.float32

    @given(st.text(st.characters(min_codepoint=0x61, max_codepoint=0x7A), min_size=2, max_size=8)
           .filter(lambda w: not hasattr(nn.Module(), w)),
           st.sampled_from(["\u0435", "\u0430", "\u043e", "\u0456", "\u03bf", "\uff45", "\u200b"]),
           st.integers(min_value=0, max_value=7))
    @settings(max_examples=60, deadline=None)
    def test_a_look_alike_near_miss_shows_the_difference(self, word, odd, at):
        """A rule with one character swapped for a look-alike: the message escapes it, so the
        rule and the closest name differ on screen."""
        at = min(at, len(word))
        typo = word[:at] + odd + word[at + 1:]
        model = _named([word, "zzzzzzzzzzzz"])
        (unmatched,) = _unmatched(model, typo)
        message = unmatched.message()
        assert message.isascii()
        assert f"'{word}'" in message and ascii(typo) in message and ascii(typo) != f"'{word}'"


def _unmatched(model: nn.Module, match: str):
    from mixprec.casting.explain import explain_unmatched

    return explain_unmatched(model, Policy((Rule(match, keep_fp32=True),)))


class TestExplainShowsUnmatched:
    @pytest.mark.parametrize("n", [300])  # (one rule: the message is TestUnmatchedRules'; 3,000: apply's summary there)
    def test_explain_text_and_json_carry_unmatched_rules(self, n, tmp_path):
        path = tmp_path / "p.toml"
        Policy(tuple(Rule(f"t3.nett.{i}", keep_fp32=True) for i in range(n)) + (Rule("vocoder", storage="bf16"),)).save(path)
        base = ["explain", "--pipeline", "tts", "--size", "test", "--policy", str(path)]
        text = runner.invoke(app, base)
        assert text.exit_code == 0, text.output
        lines = [line for line in text.stderr.splitlines() if "match" in line and "no module" in line]
        assert len(lines) == 1 and "t3.nett.0" in lines[0]  # one line, also for 3,000 rules
        if n > 1:
            assert f"{n:,} policy rules match no module" in lines[0]
        data = json.loads(runner.invoke(app, [*base, "--json"]).stdout)
        assert len(data["unmatched_rules"]) == n and data["unmatched_rules"][0]["match"] == "t3.nett.0"
        assert any("no module" in w for w in data["warnings"])
