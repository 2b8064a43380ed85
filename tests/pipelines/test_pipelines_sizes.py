"""What each size of a pipeline is for and needs, counted on the meta device."""

from __future__ import annotations

import pytest
import torch

from mixprec import pipelines
from mixprec.pipelines._sizes import FP32_BYTES, build_for_counting, describe_sizes, size_notes


def test_every_builtin_size_says_what_it_is_for_and_needs():
    tts = describe_sizes("tts")
    assert list(tts) == ["default", "test", "large"]
    assert all(info["purpose"] for info in tts.values())
    assert tts["test"]["parameters"] < tts["default"]["parameters"] < tts["large"]["parameters"]
    for info in tts.values():
        assert info["fp32_weight_bytes"] == FP32_BYTES * info["parameters"]
    # the meta count is the real build's count
    assert tts["test"]["parameters"] == pipelines.get("tts", size="test").parameter_counts()["total"]
    diffusion = describe_sizes("diffusion")
    assert list(diffusion) == ["default", "test", "large"]
    assert diffusion["large"]["fp32_weight_bytes"] > 4e9  # SD-1.5 in fp32: about 4 GB
    assert list(size_notes("minilm")) == ["default", "test"]


def test_counting_allocates_no_weights_where_the_factory_builds_on_meta():
    pipe = build_for_counting("diffusion", size="large")
    assert {p.device.type for m in pipe.components.values() for p in m.parameters()} == {"meta"}


def test_a_factory_that_refuses_meta_is_counted_on_a_real_build(monkeypatch):
    def factory(*, size="default", seed=0):  # no device keyword: cannot be asked for meta
        module = torch.nn.Linear(3, 2)
        if next(module.parameters()).is_meta:
            raise RuntimeError("this factory reads weight files")

        class One(pipelines.Pipeline):
            name, output_kind = "one", "embedding"

        return One({"m": torch.nn.Linear(3, 2)})

    pipelines.register("sizes-test-one", factory)
    try:
        assert build_for_counting("sizes-test-one").parameter_counts()["total"] == 8
        assert describe_sizes("sizes-test-one") == {
            "default": {"purpose": "", "parameters": 8, "fp32_weight_bytes": 32}}
    finally:
        pipelines._registry._registered.pop("sizes-test-one")


def test_an_unknown_size_is_an_error():
    with pytest.raises(ValueError, match="valid sizes"):
        build_for_counting("tts", size="huge")
