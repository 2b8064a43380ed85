from __future__ import annotations

import pytest
import torch

from mixprec import hardware
from mixprec.device import backends


@pytest.fixture(scope="module")
def hw():
    return hardware.probe("cpu", use_cache=False)


def test_cpu_probe_describes_the_machine(hw):
    assert hw.device_type == "cpu"
    assert hw.capability is None
    assert hw.memory_bytes and hw.memory_bytes > 2**28
    assert set(hw.dtypes) == {"fp32", "tf32", "bf16", "fp16"}
    assert hw.dtypes["fp32"].ratio == 1.0
    assert all(d.gflops and d.gflops > 0 for d in hw.dtypes.values())


def test_probe_tells_fast_from_emulated_on_this_cpu(hw):
    """The measured class agrees with what the CPU's instruction set predicts.

    Without AVX512-FP16 / AMX-FP16 a CPU emulates fp16 matmuls (about 140x slower than
    fp32 on an AMD EPYC with avx512_bf16); with AVX512-BF16 or AMX-BF16, bf16 is fast.
    """
    flags = set(hw.cpu_flags)
    if flags & {"avx512_bf16", "amx_bf16"}:
        assert hw.dtypes["bf16"].klass == "fast", hw.dtypes
        assert "bf16" in hw.fast_16bit()
    if not flags & {"avx512_fp16", "amx_fp16"}:
        assert hw.dtypes["fp16"].klass == "emulated", hw.dtypes
        assert not hw.is_fast("fp16")
    else:
        assert hw.dtypes["fp16"].klass != "emulated", hw.dtypes


def test_classify_thresholds():
    assert hardware.classify(2.8, True) == "fast"
    assert hardware.classify(1.0, True) == "no_speedup"
    assert hardware.classify(1 / 140, True) == "emulated"
    assert hardware.classify(None, False) == "unsupported"


def test_probe_restores_torch_flags():
    before = backends.snapshot()
    hardware.probe("cpu", use_cache=False)
    assert backends.snapshot() == before


def test_probe_is_cached_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    first = hardware.probe("cpu")
    assert not first.cached
    assert len(list(tmp_path.glob("probe-*.json"))) == 1
    second = hardware.probe("cpu")
    assert second.cached
    assert second.dtypes == first.dtypes


def test_round_trip(hw):
    again = hardware.Hardware.from_dict(hw.to_dict())
    assert again == hw


def test_bad_device():
    with pytest.raises(ValueError, match="unsupported device"):
        hardware.probe("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            hardware.probe("cuda")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_probe():
    hw = hardware.probe("cuda", use_cache=False)
    assert hw.capability is not None
    if hw.capability >= (8, 0):
        assert hw.dtypes["tf32"].supported and hw.dtypes["bf16"].supported
