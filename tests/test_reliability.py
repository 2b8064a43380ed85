"""Regressions from trying mixprec as a hostile user would: bad inputs, nested applies, bare modules."""

from __future__ import annotations

import math

import pytest
import torch

import mixprec
from mixprec.diagnose.fallbacks import FallbackStore
from mixprec.policy import Policy, Rule

from guard_models import MixedCallMLP, OverflowingMLP, assert_fallback_output, overflowing_lyric_encoder, tokens

FP16 = Policy((Rule("*", storage="fp16"),))


@pytest.fixture
def store(tmp_path):
    return FallbackStore(tmp_path / "fallbacks.json")


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("mode", ["raise", "fallback"])
def test_nonfinite_input_is_blamed_not_a_module(store, bad, mode):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    applied = mixprec.apply({"m": model}, FP16)
    guard = mixprec.guard(applied, on_nonfinite=mode, store=store)
    x = torch.randn(2, 4)
    x[0, 1] = bad
    with pytest.raises(mixprec.NonFiniteInputError, match=r"component 'm' was called with non-finite values in argument 0"):
        with torch.no_grad():
            model(x)
    assert guard.pins == {} and store.load() == {}
    assert applied.policy.rules == FP16.rules and model[0].weight.dtype == torch.float16
    applied.revert()


def test_a_nonfinite_keyword_argument_is_named_and_nothing_falls_back(store):
    model = MixedCallMLP()
    applied = mixprec.apply({"m": model}, FP16)
    guard = mixprec.guard(applied, on_nonfinite="fallback", store=store)
    bias = torch.zeros(4)
    bias[2] = math.nan
    with pytest.raises(mixprec.NonFiniteInputError, match=r"non-finite values in argument 'extra'"), torch.no_grad():
        model(torch.ones(2, 4), scale=torch.ones(4), extra={"bias": bias})
    assert guard.pins == {} and model.up.weight.dtype == torch.float16
    applied.revert()


def test_fallback_fixes_a_mixed_positional_and_keyword_call_and_leaves_the_callers_objects(store):
    model = MixedCallMLP()
    x, scale, extra = torch.ones(2, 4), torch.full((4,), 2.0), {"bias": torch.ones(4)}
    args_list, args_tuple = [x], (x,)
    with torch.no_grad():
        expected = model(x, scale=scale, extra=extra)
    applied = mixprec.apply({"m": model}, FP16)
    guard = mixprec.guard(applied, on_nonfinite="fallback", store=store)
    with pytest.warns(UserWarning, match="pinned"), torch.no_grad():
        out = model(*args_tuple, scale=scale, extra=extra)
    assert_fallback_output(out, expected, guard)
    assert guard.pins
    # Nothing the caller owns changed: the tensors, the dict, the list and the tuple.
    assert x.dtype == scale.dtype == extra["bias"].dtype == torch.float32
    assert list(extra) == ["bias"] and args_list[0] is x and args_tuple[0] is x
    applied.revert()


def test_lists_and_tuples_passed_in_are_cast_into_new_ones():
    class Pair(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, pair, extra):
            return self.lin(pair[0] + pair[1]) + self.lin(extra[0])

    model = Pair()
    applied = mixprec.apply(model, Policy((Rule("*", storage="bf16"),)))
    a, b = torch.randn(2, 4), torch.randn(2, 4)
    pair, extra = [a, b], (a,)
    with torch.no_grad():
        out = model(pair, extra)
    assert out.dtype == torch.float32
    assert pair == [a, b] and pair[0] is a and extra[0] is a and a.dtype == b.dtype == torch.float32
    applied.revert()


def test_fallback_works_on_a_bare_module(store):
    model = OverflowingMLP()
    x = torch.ones(2, 4)
    with torch.no_grad():
        expected = model(x)
    applied = mixprec.apply(model, FP16)
    guard = mixprec.guard(applied, on_nonfinite="fallback", store=store)
    with pytest.warns(UserWarning, match="pinned"), torch.no_grad():
        out = model(x)
    assert_fallback_output(out, expected, guard)
    assert guard.pins
    applied.revert()
    assert model.up.weight.dtype == torch.float32


def test_a_policy_on_part_of_an_applied_model_is_refused():
    model = overflowing_lyric_encoder()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    applied = mixprec.apply(model, Policy((Rule("*", storage="bf16"),)))
    with pytest.raises(mixprec.ApplyError, match="already has a mixprec policy applied to it or to a part of it"):
        mixprec.apply(model.blocks[0].norm, FP16)
    applied.revert()
    part = mixprec.apply(model.blocks[0].norm, FP16)
    with pytest.raises(mixprec.ApplyError, match="already has a mixprec policy applied"):
        mixprec.apply(model, FP16)  # contains an applied part
    part.revert()
    after = model.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
    with torch.no_grad():
        model(tokens())


def test_gradio_analytics_are_off_unless_asked_for(monkeypatch):
    pytest.importorskip("gradio")
    from mixprec.ui.app import build_app

    monkeypatch.delenv("GRADIO_ANALYTICS_ENABLED", raising=False)
    assert build_app("en").analytics_enabled is False
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "True")
    assert build_app("en").analytics_enabled is True


def test_disk_originals_that_vanished_leave_the_model_applied_and_say_so():
    import shutil

    model = overflowing_lyric_encoder()
    applied = mixprec.apply(model, Policy((Rule("*", storage="bf16"),)), keep_original="disk")
    shutil.rmtree(applied._disk.name)
    with pytest.raises(mixprec.RevertError, match="cannot read the original weights back .* the policy is still applied"):
        applied.revert()
    assert applied.active and model.blocks[0].mlp.up.dtype == torch.bfloat16
    with torch.no_grad():
        model(tokens())  # hooks still in place: it still runs


def test_binary_config_files_name_the_file_and_byte(tmp_path, clean_env):
    env = tmp_path / ".env"
    env.write_bytes(b"MIXPREC_FLOAT32_MATMUL_PRECISION=\xff\xfehigh\n")
    with pytest.raises(mixprec.ConfigError, match=r"\.env: not a UTF-8 text \.env file \(byte 33 is 0xff\)"):
        mixprec.init(env_file=env)
    toml = tmp_path / "mixprec.toml"
    toml.write_bytes(b"\x00\x81binary")
    with pytest.raises(mixprec.ConfigError, match=r"mixprec.toml: not a UTF-8 text config file \(byte 1 is 0x81\)"):
        mixprec.init(config_file=toml)
    policy = tmp_path / "p.toml"
    policy.write_bytes(b"\x89PNG\r\n")
    with pytest.raises(mixprec.PolicyError, match=r"p.toml: not a UTF-8 text file \(byte 0 is 0x89\)"):
        Policy.load(policy)


def test_error_listings_are_capped_and_long_values_clipped(tmp_path, clean_env):
    env = tmp_path / ".env"
    env.write_text("\n".join(f"bad line {i} ===" for i in range(5000)) + "\n")
    with pytest.raises(mixprec.ConfigError) as excinfo:
        mixprec.init(env_file=env)
    message = str(excinfo.value)
    assert message.count("malformed .env line") == 20 and "... and 4980 more problems" in message
    env.write_text("MIXPREC_FLOAT32_MATMUL_PRECISION=" + "z" * 5_000_000 + "\n")  # a 5 MB value in a .env file
    with pytest.raises(mixprec.ConfigError) as excinfo:
        mixprec.init(env_file=env)
    assert len(str(excinfo.value)) < 2_000 and "characters)" in str(excinfo.value)
    clean_env.setenv("MIXPREC_FLOAT32_MATMUL_PRECISION", "x" * 100_000)
    clean_env.setenv("MIXPREC_CONV_TF32", "y" * 100_000)
    with pytest.raises(mixprec.ConfigError) as excinfo:
        mixprec.init()
    assert len(str(excinfo.value)) < 2_000 and "characters)" in str(excinfo.value)


def test_cli_errors_print_paths_as_given(tmp_path):
    from typer.testing import CliRunner

    from mixprec.cli import app

    result = CliRunner().invoke(app, ["explain", "--pipeline", "tts", "--size", "test", "--policy", "[red]p.toml"])
    assert result.exit_code == 2 and "[red]p.toml" in result.output


def test_outputs_and_inputs_are_checked_before_any_work(tmp_path):
    import os

    from typer.testing import CliRunner

    from mixprec.cli import app

    runner = CliRunner()
    folder = tmp_path / "a-dir"
    folder.mkdir()
    afile = tmp_path / "plain.txt"
    afile.write_text("x")
    db = str(tmp_path / "s.sqlite")
    cases = [
        (["bench", "--pipeline", "minilm", "--size", "test", "--db", str(folder)], "--db", "is a directory"),
        (["bench", "--pipeline", "minilm", "--size", "test", "--db", str(afile / "x.sqlite")], "--db", "is a file, not a directory"),
        (["bench", "--pipeline", "minilm", "--size", "test", "--db", db, "--html", str(folder)], "--html", "is a directory"),
        (["bench", "--pipeline", "minilm", "--size", "test", "--db", db, "--json", str(tmp_path / "no" / "r.json")], "--json", "does not exist"),
        (["bench", "--pipeline", "minilm", "--size", "test", "--db", db, "--json", str(folder)], "--json", "is a directory"),
        (["bench", "--pipeline", "minilm", "--size", "test", "--db", db, "--csv", str(folder)], "--csv", "is a directory"),
        (["bench", "--pipeline", "minilm", "--size", "test", "--db", db, "--timeout", "nan"], "--timeout", "finite, positive"),
        (["bench", "--pipeline", "minilm", "--size", "test", "--db", db, "--budget", "forever"], "--budget", "positive duration"),
        (["tune", "--pipeline", "minilm", "--size", "huge", "--db", db], "'huge'", "valid sizes: default, test"),
        (["bench", "--pipeline", "", "--db", db], "--pipeline ''", "at least one pipeline"),
        (["bench", "--pipeline", "minilm", "--size", "huge", "--db", db], "'huge'", "valid sizes: default, test"),
        (["tune", "--pipeline", "minilm", "--size", "test", "--db", db, "--out", str(folder)], "--out", "is a directory"),
        (["tune", "--pipeline", "minilm", "--size", "test", "--db", db, "--bound", "sqnr>=1e999"], "1e999", "not a finite number"),
        (["run", "--pipeline", "minilm", "--size", "test", "--out", str(folder)], "--out", "is a directory"),
    ]
    for args, what, why in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert what in result.output and why in result.output, (args, result.output)
    assert not os.path.exists(db)  # refused before the store was created
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        result = runner.invoke(app, ["bench", "--pipeline", "minilm", "--size", "test", "--db", str(locked / "s.sqlite")])
        assert result.exit_code == 2 and "cannot create files" in result.output


def test_a_submodule_shared_by_two_components_is_stored_in_the_wider_dtype_with_a_warning():
    shared = torch.nn.Linear(4, 4)
    a, b = torch.nn.Sequential(shared, torch.nn.ReLU()), torch.nn.Sequential(torch.nn.Linear(4, 4), shared)
    before = shared.weight.detach().clone()
    policy = Policy((Rule("a", storage="bf16"), Rule("b", storage="fp16")))
    with pytest.warns(UserWarning, match=r"shared by a\.0, b\.1 planned as bf16, fp16: stored in bf16"):
        applied = mixprec.apply({"a": a, "b": b}, policy)
    assert shared.weight.dtype == torch.bfloat16
    rows = {r["module"]: r for r in applied.explain()}
    assert rows["a.0"]["storage"] == rows["b.1"]["storage"] == "bf16"  # explain tells the truth
    with torch.no_grad():
        assert torch.isfinite(b(torch.randn(2, 4))).all()
    applied.revert()
    assert shared.weight.dtype == torch.float32 and torch.equal(shared.weight, before)


def test_the_ui_shows_stores_without_creating_them_and_survives_absurd_paths(tmp_path):
    pytest.importorskip("gradio")
    from mixprec.ui.bench_tab import list_runs, show_run

    new = tmp_path / "sub" / "new.sqlite"
    text = show_run(str(new), 1, lang="en")
    assert "new.sqlite" in text and not new.exists() and not new.parent.exists()
    long = "/tmp/" + "x" * 100_000
    text, choices = list_runs(long, lang="en")
    assert choices == [] and len(text) < 2_000
    assert len(show_run(long, 1, lang="en")) < 2_000
