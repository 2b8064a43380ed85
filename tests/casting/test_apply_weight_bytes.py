"""``Applied.weight_bytes_before`` and ``Applied.weight_bytes()``: the model's own weights before
and after a policy, as the README's quick start prints them, on every hardware class."""

from __future__ import annotations

import pytest
import torch

import machines
import mixprec
from mixprec import Policy, Rule, hardware


def _quick_start_model() -> torch.nn.Module:
    """The README's quick-start model."""
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)).eval()


def _bytes_now(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


FP32_BYTES = _bytes_now(_quick_start_model())


def test_a_16_bit_policy_halves_the_weights_and_revert_gives_them_back():
    model = _quick_start_model()
    with mixprec.apply(model, Policy((Rule("*", storage="bf16"),))) as applied:
        assert applied.weight_bytes_before == FP32_BYTES
        assert applied.weight_bytes() == FP32_BYTES // 2 == _bytes_now(model)
        assert applied.original_bytes == FP32_BYTES  # the originals kept besides the model
    assert mixprec.weight_bytes(model) == applied.weight_bytes_before


def test_a_policy_that_casts_nothing_leaves_the_weight_bytes_as_they_were():
    model = _quick_start_model()
    with mixprec.apply(model, Policy((Rule("*", storage="fp32"),))) as applied:
        assert applied.weight_bytes() == applied.weight_bytes_before == FP32_BYTES
        assert applied.original_bytes == 0  # nothing kept: what the quick start used to print as "from 0"


def test_the_bytes_before_count_what_the_model_held_not_fp32():
    model = _quick_start_model().to(torch.float16)
    with mixprec.apply(model, Policy((Rule("*", storage="bf16"),))) as applied:
        assert applied.weight_bytes_before == FP32_BYTES // 2 == applied.weight_bytes()
        assert model[0].weight.dtype == torch.bfloat16


@pytest.mark.parametrize("name", list(machines.CLASSES))
def test_the_quick_start_line_names_the_weights_before_and_after_on_every_hardware_class(
        name, _probe_files, monkeypatch, capsys):
    monkeypatch.setenv(hardware.PROBE_FILE_VAR, str(_probe_files[name]))
    model = _quick_start_model()
    with mixprec.apply(model, mixprec.preset("fast")) as applied:
        model(torch.randn(8, 256))
        print(f"weights: {applied.weight_bytes_before} -> {applied.weight_bytes()} bytes")
        after = _bytes_now(model)
        cast = any(p.dtype != torch.float32 for p in model.parameters())
    assert capsys.readouterr().out == f"weights: {FP32_BYTES} -> {after} bytes\n"
    assert (after < FP32_BYTES) == cast
    # avx2 measures 16 bits emulated: `fast` casts nothing there, and says so with equal figures.
    assert cast == (name != "avx2")
