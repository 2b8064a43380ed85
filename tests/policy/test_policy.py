from __future__ import annotations

import pytest
from torch import nn

from mixprec.policy import Policy, PolicyError, Rule, resolve_modules
from mixprec.device.settings import NumericSettings


def _model():
    return nn.ModuleDict({
        "enc": nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)),
        "head": nn.Linear(4, 2),
    })


def test_round_trip_toml_and_json():
    policy = Policy(
        rules=(Rule("*", storage="bf16"), Rule("type:LayerNorm", keep_fp32=True, reason="stats"),
               Rule("m.head", compute="fp32", output_dtype="fp32"), Rule("m.*", upcast_attention=True, optional=True)),
        numerics=NumericSettings(matmul="medium", conv_tf32=False),
        name="mine",
    )
    assert Policy.from_toml(policy.to_toml()) == policy
    assert Policy.from_json(policy.to_json()) == policy
    assert Policy.from_dict(policy.to_dict()) == policy


def test_last_matching_rule_wins_including_ancestor_matches():
    comps = {"m": _model()}
    policy = Policy((Rule("m.enc.0", storage="fp16"), Rule("m.enc", storage="bf16"), Rule("type:LayerNorm", keep_fp32=True),
                     Rule("m", storage="fp16")))
    plans = {p.qualname: p for p in resolve_modules(comps, policy)[0]}
    assert plans["m.enc.0"].storage == "fp16"  # rule #3 (on the ancestor m) is the last that matches
    assert plans["m.enc.0"].decided_by["storage"] == 3
    assert plans["m.enc.1"].storage == "fp32" and plans["m.enc.1"].keep_fp32  # a pin beats any storage rule
    assert plans["m.head"].compute_dtype == "fp16"


def test_type_rules_match_base_classes_by_glob():
    class MyNorm(nn.LayerNorm):
        pass

    comps = {"x": nn.Sequential(MyNorm(3), nn.Linear(3, 3))}
    plans = {p.qualname: p for p in resolve_modules(comps, Policy((Rule("type:*Norm", keep_fp32=True),)))[0]}
    assert plans["x.0"].keep_fp32 and not plans["x.1"].keep_fp32


def test_unmatched_rules_are_reported():
    _, unmatched = resolve_modules({"m": _model()}, Policy((Rule("m.enkoder", storage="bf16"), Rule("nothing", storage="bf16", optional=True))))
    assert unmatched == [0]


@pytest.mark.parametrize(("rule", "message"), [
    ({"match": "*", "storage": "fp4"}, "unknown dtype 'fp4'"),
    ({"match": "*", "compute": "fp8"}, "fp8 is a storage type"),
    ({"match": "*", "output_dtype": "e4m3"}, "fp8 is a storage type"),
    ({"match": "*", "storage": "bf61"}, "did you mean 'bf16'"),
    ({"match": "*", "compute": "fast"}, "valid: native, fp32"),
    ({"match": "*", "keep_fp32": "yes"}, "keep_fp32: expected true or false"),
    ({"match": "*"}, "sets nothing"),
    ({"storage": "bf16"}, "missing key 'match'"),
    ({"match": "*", "storge": "bf16"}, "unknown key 'storge' (did you mean 'storage'?)"),
])
def test_bad_rules_name_the_problem(rule, message):
    with pytest.raises(PolicyError) as excinfo:
        Policy.from_dict({"rules": [rule]})
    assert message in str(excinfo.value)
    assert "rules[0]" in str(excinfo.value)


def test_policy_file_errors_name_file_and_key(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('name = "x"\nrulez = []\n')
    with pytest.raises(PolicyError, match=rf"{path}: unknown key 'rulez' \(did you mean 'rules'\?\)"):
        Policy.load(path)
    path.write_text('[[rules]]\nmatch = "*"\nstorage = 16\n')
    with pytest.raises(PolicyError, match=rf"{path} rules\[0\]: rule '\*' storage: expected a string"):
        Policy.load(path)
    path.write_text('[numerics]\nmatmul = "fastest"\n')
    with pytest.raises(PolicyError, match=rf"{path} key 'numerics': invalid value 'fastest'"):
        Policy.load(path)
    path.write_text('[[rules]\n')
    with pytest.raises(PolicyError, match="malformed TOML"):
        Policy.load(path)
