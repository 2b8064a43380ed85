from __future__ import annotations

import itertools
import warnings

import pytest
import torch

import mixprec
from mixprec.device import backends
from mixprec.device.settings import NumericSettings

from fake_torch import OldTorch

COMBINATIONS = [
    NumericSettings(matmul=m, conv_tf32=c, fp16_reduced_precision_reduction=f, bf16_reduced_precision_reduction=b)
    for m, c, f, b in itertools.product(("highest", "high", "medium"), (True, False), (True, False), (True, False))
]


def _app_used_new_api():
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # legacy getters now raise


def _app_set_root():
    torch.backends.fp32_precision = "tf32"
    torch.backends.mkldnn.conv.fp32_precision = "ieee"


def _app_used_legacy():
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = False


STARTS = {"fresh": lambda: None, "app-new-api": _app_used_new_api, "app-root": _app_set_root, "app-legacy": _app_used_legacy}
_NEW_API = pytest.mark.skipif(not backends.uses_fp32_precision_api(), reason="needs torch >= 2.9 (fp32_precision tree)")
#: The starting states, those an app can only reach through the fp32_precision tree skipped on
#: an older torch (writing there would leave a plain attribute on the real torch module).
START_PARAMS = [pytest.param(name, marks=_NEW_API) if name in ("app-new-api", "app-root") else name for name in STARTS]


def _read_every_getter():
    """Read both families of getters; any RuntimeError fails the test."""
    legacy = {
        "matmul": torch.get_float32_matmul_precision(),
        "cuda_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "fp16": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "bf16": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    }
    tree = backends.read_tree()
    return legacy, tree


@pytest.mark.skipif(not backends.uses_fp32_precision_api(), reason="needs torch >= 2.9 (fp32_precision tree)")
@pytest.mark.parametrize("start", list(STARTS))
def test_every_write_keeps_both_getter_families_readable(start):
    STARTS[start]()
    base = backends.snapshot()
    for settings in COMBINATIONS:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no torch deprecation warning may reach the user
            backends.apply_settings(settings)
        legacy, tree = _read_every_getter()
        assert legacy["matmul"] == settings.matmul
        assert legacy["cudnn_tf32"] == settings.conv_tf32
        assert legacy["fp16"] == settings.fp16_reduced_precision_reduction
        assert legacy["bf16"] == settings.bf16_reduced_precision_reduction
        assert tree["cuda.matmul"] == ("ieee" if settings.matmul == "highest" else "tf32")
        assert tree["mkldnn.matmul"] == {"highest": "ieee", "high": "tf32", "medium": "bf16"}[settings.matmul]
        assert backends.current_settings() == settings
    backends.restore(base)
    assert backends.snapshot() == base


@pytest.mark.skipif(not backends.uses_fp32_precision_api(), reason="needs torch >= 2.9")
def test_app_root_setting_is_left_alone():
    _app_set_root()
    backends.apply_settings(NumericSettings(matmul="medium", conv_tf32=False))
    tree = backends.read_tree()
    assert tree["generic.all"] == "tf32"  # the app's own choices survive
    assert tree["mkldnn.conv"] == "ieee"


@pytest.mark.parametrize("start", START_PARAMS)
def test_numerics_restores_exactly_on_exit_and_on_exception(start):
    STARTS[start]()
    before = backends.snapshot()
    with mixprec.numerics(matmul="medium", conv_tf32=False) as active:
        assert active.matmul == "medium"
        assert torch.get_float32_matmul_precision() == "medium"
    assert backends.snapshot() == before

    with pytest.raises(KeyError):
        with mixprec.numerics(matmul="high", fp16_reduced_precision_reduction="off"):
            assert torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction is False
            raise KeyError("boom")
    assert backends.snapshot() == before


def test_numerics_rejects_bad_value_and_changes_nothing():
    before = backends.snapshot()
    with pytest.raises(ValueError, match="valid values: highest, high, medium"):
        with mixprec.numerics(matmul="fastest"):
            pass
    assert backends.snapshot() == before


def test_describe_reads_back_what_torch_reports():
    # Set through torch directly, not through mixprec: describe() must see it.
    torch.set_float32_matmul_precision("medium")
    torch.backends.cudnn.allow_tf32 = False
    state = mixprec.describe()
    assert state["float32_matmul_precision"] == "medium"
    assert state["cudnn_allow_tf32"] is False
    assert state["backends"]["cudnn_conv"] == "ieee"
    if backends.uses_fp32_precision_api():
        assert state["backends"]["mkldnn_matmul"] == "bf16"
        assert state["backends"]["cuda_matmul"] == "tf32"
    assert state["torch_version"] == torch.__version__
    assert state["device"] in ("cpu",) or torch.cuda.is_available()


@pytest.mark.skipif(not backends.uses_fp32_precision_api(), reason="needs torch >= 2.9")
def test_describe_reports_mixed_state_without_raising():
    _app_used_new_api()
    state = mixprec.describe()
    assert "float32_matmul_precision" in state["unreadable_legacy_getters"]
    assert state["backends"]["cuda_matmul"] == "tf32"
    with pytest.raises(backends.FlagReadError, match="mixed the legacy and new"):
        backends.current_settings()


# -- torch < 2.9: only the legacy flags ------------------------------------------------


def test_legacy_torch_apply_describe_restore():
    old = OldTorch()
    assert not backends.uses_fp32_precision_api(old)
    before = backends.snapshot(old)
    assert before.tree == {}
    backends.apply_settings(NumericSettings(matmul="medium", conv_tf32=False, bf16_reduced_precision_reduction=False), old)
    assert old.get_float32_matmul_precision() == "medium"
    assert old.backends.cudnn.allow_tf32 is False
    assert old.backends.cuda.matmul.allow_bf16_reduced_precision_reduction is False
    state = backends.describe(old)
    assert state["api"] == "legacy"
    assert state["backends"] == {"cuda_matmul": "tf32", "cudnn_conv": "ieee", "mkldnn_matmul": "bf16"}
    assert state["torch_version"] == "2.3.1"
    backends.restore(before, old)
    assert backends.snapshot(old) == before


def test_legacy_torch_numerics_context_restores_on_exception():
    old = OldTorch()
    with pytest.raises(RuntimeError, match="inside"):
        with backends.numerics(matmul="high", torch_module=old):
            assert old.get_float32_matmul_precision() == "high"
            raise RuntimeError("inside")
    assert old.get_float32_matmul_precision() == "highest"


def test_failed_write_leaves_nothing_half_applied():
    old = OldTorch(fail_once_on_bf16=True)
    before = backends.snapshot(old)
    with pytest.raises(RuntimeError, match="simulated failure"):
        backends.apply_settings(NumericSettings(matmul="medium", conv_tf32=False, bf16_reduced_precision_reduction=False), old)
    # matmul and cuDNN were written before the failure and must have been rolled back.
    assert old.writes == ["medium", "highest"]
    assert backends.snapshot(old) == before


# -- owners of the settings: ending out of order -------------------------------------------


def test_numerics_blocks_exited_out_of_order_end_where_they_started():
    import contextlib

    assert torch.get_float32_matmul_precision() == "highest"
    first, second = backends.numerics(matmul="medium"), backends.numerics(matmul="high")
    first.__enter__()
    second.__enter__()
    with pytest.warns(UserWarning, match=r"numerics\(matmul='medium'\) ended while .*numerics\(matmul='high'\).*kept matmul"):
        first.__exit__(None, None, None)
    assert torch.get_float32_matmul_precision() == "high"  # the later block still holds it
    second.__exit__(None, None, None)
    assert torch.get_float32_matmul_precision() == "highest"  # not the stale "medium"

    stack = contextlib.ExitStack()
    inner = backends.numerics(conv_tf32=False)
    stack.enter_context(backends.numerics(matmul="medium"))
    conv_before = torch.backends.cudnn.allow_tf32
    inner.__enter__()
    with pytest.warns(UserWarning, match=r"put back matmul='highest'"):
        stack.close()  # the outer block ends first: its matmul goes, the inner's conv setting stays
    assert torch.get_float32_matmul_precision() == "highest"
    assert torch.backends.cudnn.allow_tf32 is False
    inner.__exit__(None, None, None)
    assert torch.backends.cudnn.allow_tf32 is conv_before
    assert torch.get_float32_matmul_precision() == "highest"


def test_numerics_blocks_on_two_threads_ending_out_of_order():
    import threading

    entered, done = threading.Event(), threading.Event()

    def other():
        with backends.numerics(matmul="high"):
            entered.set()
            done.wait(10)

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        first = backends.numerics(matmul="medium")
        first.__enter__()
        thread = threading.Thread(target=other)
        thread.start()
        assert entered.wait(10)
        first.__exit__(None, None, None)  # this thread ends first
        done.set()
        thread.join(10)
    assert torch.get_float32_matmul_precision() == "highest"


def test_policies_reverted_first_in_first_out_and_apply_inside_a_block(bf16_cpu):
    from mixprec.policy import Policy, Rule

    medium = Policy((Rule("*", storage="bf16"),), numerics=NumericSettings(matmul="medium"))
    high = Policy((Rule("*", storage="bf16"),), numerics=NumericSettings(matmul="high"))
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    first, second = mixprec.apply(a, medium), mixprec.apply(b, high)
    with pytest.warns(UserWarning, match=r"the numerics of policy 'custom' ended while the numerics of policy 'custom', "
                                          r"started after it.*kept [a-z0-9_, ]*matmul"):
        first.revert()
    assert torch.get_float32_matmul_precision() == "high"
    second.revert()
    assert torch.get_float32_matmul_precision() == "highest"

    block = backends.numerics(matmul="high")
    block.__enter__()
    applied = mixprec.apply(a, medium)
    with pytest.warns(UserWarning, match="ended while"):
        block.__exit__(None, None, None)  # the block ends before the policy inside it is reverted
    assert torch.get_float32_matmul_precision() == "medium"
    applied.revert()
    assert torch.get_float32_matmul_precision() == "highest"


def test_in_order_ends_restore_exactly_and_warn_nothing():
    before = backends.snapshot()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with backends.numerics(matmul="medium"):
            handle = backends.apply_settings(NumericSettings(matmul="high", conv_tf32=False))
            backends.restore(handle)
            assert torch.get_float32_matmul_precision() == "medium"
    assert backends.snapshot() == before


def test_the_api_is_read_from_torch_itself_not_from_a_leftover_attribute():
    """On a torch without the tree, an ``fp32_precision`` attribute someone wrote onto
    ``torch.backends`` is not the API: the compiled core decides."""
    from types import SimpleNamespace

    old = SimpleNamespace(_C=SimpleNamespace(), backends=SimpleNamespace(fp32_precision="tf32"))
    assert not backends.uses_fp32_precision_api(old)
    new = SimpleNamespace(_C=SimpleNamespace(_get_fp32_precision_getter=lambda b, o: "ieee"), backends=SimpleNamespace())
    assert backends.uses_fp32_precision_api(new)
    assert backends.uses_fp32_precision_api() == hasattr(torch._C, "_get_fp32_precision_getter")
