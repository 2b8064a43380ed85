"""``+calibrated`` configurations: parsed for presets only, set up from the pipeline's own calibration."""

from __future__ import annotations

import pytest

from mixprec.bench.configs import UnknownConfigError, parse_configs, setup
from mixprec.device.clock import CpuTime
from mixprec.device.hardware import DtypeSpeed, Hardware


def _hw() -> Hardware:
    dtypes = {"fp32": DtypeSpeed("fp32", True, 100.0, 1.0, "fast"), "tf32": DtypeSpeed("tf32", False, 100.0, 1.0, "unsupported"),
              "bf16": DtypeSpeed("bf16", True, 300.0, 3.0, "fast"), "fp16": DtypeSpeed("fp16", True, 1.0, 0.01, "emulated")}
    return Hardware("cpu", "test cpu", None, 2**34, ("avx512_bf16",), 2, "x", dtypes)


def test_calibrated_presets_parse_and_other_configurations_are_refused():
    specs, _ = parse_configs("fast+calibrated,memory+calibrated+compile", _hw())
    by = {s.name: s for s in specs}
    assert by["fast+calibrated"].calibrated and by["fast+calibrated"].arg == "fast" and not by["fast+calibrated"].compile
    assert by["memory+calibrated+compile"].calibrated and by["memory+calibrated+compile"].compile
    for name in ("naive-bf16+calibrated", "fast+compile+calibrated", "p.toml+calibrated"):
        with pytest.raises(UnknownConfigError, match=r"\+calibrated checks a preset on the pipeline|does not exist"):
            parse_configs(name, _hw())


def test_a_calibrated_preset_is_set_up_from_its_calibration(tmp_path, monkeypatch):
    import importlib

    from mixprec import pipelines

    module = importlib.import_module("mixprec.calibration.calibrate")

    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    pipe = pipelines.get("tts", size="test")
    t3 = pipe.components["t3"]

    class ByDtype(CpuTime):  # bf16 weights: half fp32's time, whatever the machine does
        name = "scripted"

        def time(self, call):
            return call(), 0.5 if next(t3.parameters()).dtype != __import__("torch").float32 else 1.0

    monkeypatch.setattr(module, "clock_for", lambda device: ByDtype())
    spec = next(s for s in parse_configs("fast+calibrated", _hw())[0] if s.name == "fast+calibrated")
    context, info = setup(spec, pipe, _hw(), pipe.example_inputs(1, 0))
    assert info["calibration"]["chosen"] in ("rules", "rules-no-matmul")
    assert info["policy"]["name"].startswith("fast, calibrated: rules") and "measured in scripted" in info["policy"]["name"]
    with context():
        assert pipe.run(pipe.example_inputs(1, 0)).output.isfinite().all()
