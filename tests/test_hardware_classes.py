"""What mixprec decides under each hardware class: the probe, presets, bench's configurations, the
headline and the demo's plan.

The suite's machine is scripted (``tests/machines.py``); this module is marked ``hardware`` (``tests/conftest.py``) and
``make test-hardware`` runs them under every class (``MIXPREC_TEST_HARDWARE=avx2|avx512-bf16|amx|cuda``).
Each states what its class must give, so a decision that stops following the machine fails here.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import machines
from mixprec import hardware
from mixprec.bench.configs import default_configs
from mixprec.bench.plan import Calibration, config_cost, plan_runs
from mixprec.cli import app
from mixprec.policy import presets

#: Per class: the storage dtypes fast, balanced and memory resolve to, and memory's compute.
PRESETS = {
    "avx2": {"fast": {"fp32"}, "balanced": {"fp32"}, "memory": {"bf16"}, "memory compute": {"fp32"}},
    "avx512-bf16": {"fast": {"bf16"}, "balanced": {"bf16"}, "memory": {"bf16"}, "memory compute": {"native"}},
    "amx": {"fast": {"bf16"}, "balanced": {"bf16"}, "memory": {"bf16"}, "memory compute": {"native"}},
    "cuda": {"fast": {"fp16"}, "balanced": {"fp16"}, "memory": {"bf16"}, "memory compute": {"native"}},
}

#: Per class: bench's default configurations (what cannot help there is left out with a note).
DEFAULT_CONFIGS = {
    "avx2": ["fp32", "quality", "balanced", "fast", "memory"],
    "avx512-bf16": ["fp32", "matmul-medium", "autocast-bf16", "naive-bf16", "quality", "balanced", "fast", "memory"],
    "amx": ["fp32", "matmul-medium", "autocast-bf16", "naive-bf16", "naive-fp16", "quality", "balanced", "fast", "memory"],
    "cuda": ["fp32", "matmul-high", "matmul-medium", "autocast-bf16", "naive-bf16", "naive-fp16", "quality", "balanced",
             "fast", "memory"],
}


@pytest.fixture
def name(machine, request):
    return next(key for key, (hw, _) in machines.CLASSES.items() if hw is machine)


def test_the_probe_reads_the_class_and_measures_nothing(machine, name, monkeypatch):
    monkeypatch.setattr(hardware, "measure", lambda *a, **k: pytest.fail("the probe measured this machine"))
    cpu = hardware.probe("cpu")
    assert cpu.dtypes == machines.CLASSES[name][1][0].dtypes and cpu.recorded
    if machine.device_type == "cpu":
        assert cpu.cpu_flags == machine.cpu_flags


def test_presets_follow_the_class(machine, name):
    expected = PRESETS[name]
    for preset in ("fast", "balanced", "memory"):
        policy, reasons = presets.resolve(preset, machine)
        assert {r.storage for r in policy.rules if r.storage} == expected[preset], (preset, reasons)
    memory, _ = presets.resolve("memory", machine)
    assert {r.compute for r in memory.rules if r.compute} == expected["memory compute"]
    quality, _ = presets.resolve("quality", machine)
    assert {r.storage for r in quality.rules if r.storage} == {"fp32"} and quality.numerics.matmul == "highest"


def test_bench_leaves_out_what_cannot_help_here(machine, name):
    specs, notes = default_configs(machine)
    assert [s.name for s in specs] == DEFAULT_CONFIGS[name]
    left_out = {note.split(" left out", 1)[0] for note in notes}
    every = {"fp32", "matmul-high", "matmul-medium", "autocast-bf16", "naive-bf16", "naive-fp16", "quality", "balanced",
             "fast", "memory"}
    assert left_out == every - set(DEFAULT_CONFIGS[name])  # each one left out says so
    for spec in specs:  # nothing kept computes exactly what fp32 does, or in an emulated type
        assert not (spec.kind == "matmul" and machine.matmul_exact.get(spec.arg)), spec
        assert not (spec.dtype and machine.dtypes[spec.dtype].emulated), spec


def test_the_demos_plan_fits_its_budget_with_every_default_configuration(machine):
    """The demo on a 2-core machine: what the install and the probe left of its 420 s (about 214 s on
    the slowest class), a reference of 2 s a run loaded in 8 s: every default configuration is measured
    at least twice within it (a configuration in an emulated type would cost 60 reference runs)."""
    specs, _ = default_configs(machine)
    costs = [config_cost(spec, machine) for spec in specs]
    plan = plan_runs(Calibration(load_s=8.0, run_s=2.0), costs, budget_s=214.0, max_warmup=1, max_repeat=3, cores=2)
    assert plan.estimate_s <= 214.0 and not plan.dropped and plan.repeat >= 2, plan.reason


def test_env_shows_the_class_as_recorded(machine, name, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    out = CliRunner().invoke(app, ["env", "--device", "cpu"])
    assert out.exit_code == 0, out.output
    cpu = machines.CLASSES[name][1][0]
    assert cpu.name in out.output and "through MIXPREC_PROBE_FILE, not measured here" in out.output
    row = next(line for line in out.output.splitlines() if line.strip("│ ").startswith("bf16 "))
    assert cpu.dtypes["bf16"].klass in row
