"""The fallback memory: concurrent processes, files of the wrong shape, a store that cannot be written."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import warnings

import pytest
import torch

import mixprec
from mixprec.diagnose.fallbacks import FallbackStore
from mixprec.policy import Policy, Rule

from guard_models import OverflowingMLP, assert_fallback_output, overflowing_lyric_encoder, tokens

FP16 = Policy((Rule("*", storage="fp16"),))


def _remember_many(path: str, worker: int, count: int) -> None:
    store = FallbackStore(path)
    for i in range(count):
        store.remember(f"model-{worker}", f"blocks.{i}", "fp32", description=f"worker {worker}")


def test_concurrent_processes_lose_no_pin(tmp_path):
    path = tmp_path / "fallbacks.json"
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    workers, count = 3, 15
    processes = [context.Process(target=_remember_many, args=(str(path), w, count)) for w in range(workers)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(60)
        assert p.exitcode == 0
    data = FallbackStore(path).load()
    assert sorted(data) == [f"model-{w}" for w in range(workers)]
    for w in range(workers):
        assert data[f"model-{w}"]["pins"] == {f"blocks.{i}": "fp32" for i in range(count)}
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


@pytest.mark.parametrize("content, kind", [("[1, 2]", "list"), ('"pins"', "string"), ("{not json", "not JSON")])
def test_a_file_of_the_wrong_shape_is_ignored_with_a_warning(tmp_path, content, kind):
    path = tmp_path / "fallbacks.json"
    path.write_text(content)
    store = FallbackStore(path)
    with pytest.warns(UserWarning, match=rf"ignoring fallback store .*fallbacks.json.*{kind}"):
        assert store.load() == {}
    with pytest.warns(UserWarning, match="ignoring fallback store"):
        store.remember("abc", "blocks.2.mlp", "bf16", description="lyrics")
    assert (tmp_path / "fallbacks.json.invalid").read_text() == content  # kept, not lost
    assert store.get("abc") == {"blocks.2.mlp": "bf16"}


def test_malformed_entries_are_dropped_and_the_rest_kept(tmp_path):
    path = tmp_path / "fallbacks.json"
    path.write_text(json.dumps({"good": {"pins": {"a": "fp32"}}, "bad": ["a"], "worse": {"pins": ["a"]},
                                "odd": {"pins": {"a": "fp32"}, "learned": "yesterday"}}))
    with pytest.warns(UserWarning, match=r"ignoring 3 malformed entries .*'bad', 'worse', 'odd'"):
        assert FallbackStore(path).load() == {"good": {"pins": {"a": "fp32"}}}


def test_guard_and_cli_run_with_a_list_in_the_store(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from mixprec.cli import app

    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    (tmp_path / "fallbacks.json").write_text("[]")
    model = overflowing_lyric_encoder()
    with torch.no_grad():
        reference = model(tokens())
        applied = mixprec.apply({"lyrics": model}, FP16)
        with pytest.warns(UserWarning, match="found a JSON list"):
            guard = mixprec.guard(applied, on_nonfinite="fallback")
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            out = model(tokens())
    assert torch.allclose(out.float(), reference, atol=5e-2)
    assert FallbackStore(tmp_path / "fallbacks.json").get(guard.fingerprint) == {m: p.dtype for m, p in guard.pins.items()}
    applied.revert()
    (tmp_path / "fallbacks.json").write_text("[]")
    listed = CliRunner().invoke(app, ["fallbacks", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert '"fallbacks": {}' in listed.stdout


def _unwritable(tmp_path, how):
    if how == "read-only folder":
        if sys.platform == "win32" or (hasattr(os, "geteuid") and os.geteuid() == 0):
            pytest.skip("needs POSIX permissions that bind this user (not root)")
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder / "fallbacks.json"
    blocker = tmp_path / "a-file"  # a file where the store's folder should be: no user can write there
    blocker.write_text("")
    return blocker / "fallbacks.json"


@pytest.mark.parametrize("how", ["read-only folder", "file in the way"])
def test_a_store_that_cannot_be_written_warns_and_the_call_returns(tmp_path, how):
    path = _unwritable(tmp_path, how)
    try:
        torch.manual_seed(0)
        model = OverflowingMLP().eval()
        x = torch.ones(2, 4)
        with torch.no_grad():
            reference = model(x)
            applied = mixprec.apply(model, FP16)
            guard = mixprec.guard(applied, on_nonfinite="fallback", store=FallbackStore(path))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = model(x)
        messages = [str(w.message) for w in caught]
        assert any("could not be remembered in" in m and "MIXPREC_CACHE_DIR" in m for m in messages), messages
        assert not any("remembered for the next start" in m for m in messages), messages
        assert_fallback_output(out, reference, guard)
        assert guard.pins and not path.exists()
        applied.revert()
    finally:
        if path.parent.is_dir():
            path.parent.chmod(0o755)
