"""The one-call GPU check runs dry on a CPU and writes its results file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _gpu_check():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_dry_run_on_the_cpu_writes_every_section(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path / "cache"))
    before = torch.get_float32_matmul_precision()
    check = _gpu_check()
    # Each step at its smallest (the quick dry run, gpu_check.py's docstring): calibrations of 5 s,
    # 2 timed rounds, and inductor's C++ for the token decoder alone (every component's: a minute of CPU).
    assert check.main(["--device", "cpu", "--pipelines", "tts", "--configs", "fp32,fast", "--budget", "10",
                       "--calibrate-limit", "5", "--rounds", "2", "--compile-only", "t3",
                       "--out-dir", str(tmp_path)]) == 0
    text = (tmp_path / "gpu-cpu-dry-run.md").read_text()
    assert "torch reads back: get_float32_matmul_precision = `high`" in text  # the app's env var took effect
    assert "after restore: get_float32_matmul_precision = `highest`" in text
    for section in ("## mixprec env", "## mixprec bench: tts", "## mixprec calibrate: tts", "## What mixprec adds per run",
                    "## The numerics guard's cost", "## Compiled token decode (tts)"):
        assert section in text
    # env, bench, calibrate, overhead, compiled decode each finished; bench's 10 s budget may leave a
    # loaded machine nothing to measure, which it says with exit status 1 (docs/cli.md)
    bench = text[text.index("## mixprec bench: tts"):text.index("## mixprec calibrate: tts")]
    assert ": exit 0," in bench or (": exit 1," in bench and "not measured: run 1 (tts)" in bench), bench
    assert text.replace(bench, "").count(": exit 0,") == 4, text
    assert "| fast+compile |" in text and "recompile-limit warnings" in text
    assert "compiled components (--compile-only): t3; the others run eager" in text
    assert "--calibration-limit 5" in text and "2 interleaved rounds" in text  # the limits reached the steps
    assert torch.get_float32_matmul_precision() == before


def test_a_time_limit_skips_the_steps_it_leaves_no_time_for(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path / "cache"))
    check = _gpu_check()
    started = []
    monkeypatch.setattr(check, "_run", lambda title, *a, **k: started.append(title) or [])
    assert check.main(["--device", "cpu", "--pipelines", "tts", "--configs", "fp32", "--time-limit", "30",
                       "--out-dir", str(tmp_path)]) == 0
    text = (tmp_path / "gpu-cpu-dry-run.md").read_text()
    assert started == []  # no step started with under a minute left
    assert "## Numerics" in text  # the numerics in this process come first and always run
    for section in ("## mixprec env", "## mixprec bench: tts", "## mixprec calibrate: tts", "## Compiled token decode (tts)"):
        assert f"{section}\n\nskipped: under a minute of the 30 s time limit was left" in text
    assert "## The numerics guard's cost" not in text


def test_cuda_is_refused_where_torch_sees_none(tmp_path, monkeypatch):
    check = _gpu_check()
    monkeypatch.setattr(check.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        check.main(["--device", "cuda", "--out-dir", str(tmp_path)])
    assert exc.value.code == 2
