"""The suite's 16-bit FLOP counter (tests/_flops16.py): exact counts, nothing for other dtypes,
the work of threads and subprocesses counted, the budget enforced, under pytest-xdist too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from _flops16_site.flops16_count import Flops16Mode

TESTS = Path(__file__).parent
BF16, FP16 = torch.bfloat16, torch.float16


def _counted(body, dtypes: tuple[str, ...] = ("bf16", "fp16")) -> dict[str, int]:
    """The FLOPs ``body`` computed in ``dtypes``."""
    with Flops16Mode() as mode:
        body()
    assert mode.uncounted == {}
    return {name: mode.counts[name] for name in dtypes}


def test_a_bf16_matmul_counts_two_m_n_k():
    m, k, n = 3, 5, 7
    assert _counted(lambda: torch.ones(m, k, dtype=BF16) @ torch.ones(k, n, dtype=BF16)) == {"bf16": 2 * m * n * k, "fp16": 0}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_matmul_in_another_dtype_counts_nothing_in_16_bit(dtype):
    assert _counted(lambda: torch.ones(3, 5, dtype=dtype) @ torch.ones(5, 7, dtype=dtype)) == {"bf16": 0, "fp16": 0}


def test_fp32_products_count_as_fp32_and_float64_counts_nowhere():
    every = ("bf16", "fp16", "fp32")
    assert _counted(lambda: torch.ones(3, 5) @ torch.ones(5, 7), every) == {"bf16": 0, "fp16": 0, "fp32": 2 * 3 * 5 * 7}
    with torch.inference_mode():  # linear reaches the mode whole: its products are counted all the same
        assert _counted(lambda: F.linear(torch.ones(2, 8), torch.ones(4, 8)), every) == {"bf16": 0, "fp16": 0, "fp32": 2 * 2 * 8 * 4}
    assert _counted(lambda: torch.ones(3, 5, dtype=torch.float64) @ torch.ones(5, 7, dtype=torch.float64), every) == dict.fromkeys(every, 0)


def test_inference_mode_linear_batched_matmul_convolution_and_attention_count_by_their_formulas():
    """In inference mode ``linear`` and attention reach the mode whole and are counted all the same."""
    x = torch.ones(2, 6, 8, dtype=FP16)
    heads = torch.ones(2, 3, 6, 8, dtype=BF16)
    with torch.inference_mode():
        assert _counted(lambda: F.linear(x, torch.ones(4, 8, dtype=FP16), torch.ones(4, dtype=FP16))) == {
            "bf16": 0, "fp16": 2 * 12 * 8 * 4}
        assert _counted(lambda: F.scaled_dot_product_attention(heads, heads, heads)) == {
            "bf16": 2 * (2 * 2 * 3 * 6 * 6 * 8), "fp16": 0}  # q k^T, then the weights times v
    assert _counted(lambda: torch.bmm(x, torch.ones(2, 8, 5, dtype=FP16))) == {"bf16": 0, "fp16": 2 * 2 * 6 * 8 * 5}
    conv = torch.nn.Conv1d(6, 4, kernel_size=3).to(BF16)
    assert _counted(lambda: conv(x.to(BF16))) == {"bf16": 2 * 2 * 4 * 6 * 3 * 6, "fp16": 0}  # out positions: 8-3+1


def test_an_fp32_linear_under_bf16_autocast_counts_as_bf16():
    x, w = torch.ones(3, 8), torch.ones(4, 8)
    with torch.autocast("cpu", dtype=BF16):
        assert _counted(lambda: F.linear(x, w)) == {"bf16": 2 * 3 * 8 * 4, "fp16": 0}


def test_meta_tensors_compute_and_count_nothing():
    assert _counted(lambda: torch.ones(64, 64, dtype=BF16, device="meta") @ torch.ones(64, 64, dtype=BF16, device="meta")) == {
        "bf16": 0, "fp16": 0}


#: A tiny suite for the plugin: 48 FLOPs and a pipeline build; fp32 alone; 2 * 8192 split between
#: a thread and a subprocess (which builds one pipeline); 2048 in a test whose marker the budget
#: leaves out; 2048 in a test run without the counter.
GENERATED = '''
import multiprocessing, sys, threading, pytest, torch

def bf16_matmul(m, k, n):
    torch.ones(m, k, dtype=torch.bfloat16) @ torch.ones(k, n, dtype=torch.bfloat16)

def built_and_computed(m, k, n):
    sys.audit("mixprec.pipelines.build", "tts", "test")  # what mixprec.pipelines.get raises
    bf16_matmul(m, k, n)

def test_small():
    bf16_matmul(2, 3, 4)
    sys.audit("mixprec.pipelines.build", "tts", "test")

def test_fp32():
    torch.ones(64, 64) @ torch.ones(64, 64)

def test_large_in_a_thread_and_a_subprocess():
    thread = threading.Thread(target=bf16_matmul, args=(8, 16, 32))
    thread.start()
    thread.join()
    child = multiprocessing.get_context("spawn").Process(target=built_and_computed, args=(16, 16, 16))
    child.start()
    child.join()
    assert child.exitcode == 0

@pytest.mark.measures_the_machine
def test_unbudgeted():
    bf16_matmul(8, 8, 16)

@pytest.mark.flops16_off("the counter must not see this test")
def test_off():
    bf16_matmul(8, 8, 16)
'''
CONFTEST = '''
pytest_plugins = ["_flops16"]

def pytest_configure(config):
    config.addinivalue_line("markers", "measures_the_machine: times this machine")
'''
SMALL, LARGE = "test_generated.py::test_small", "test_generated.py::test_large_in_a_thread_and_a_subprocess"


def _run_generated(folder: Path, per_test: int, total: int, extra: tuple[str, ...] = (), *,
                   via_env: bool = False, totals: dict[str, int] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the generated suite with the report and the budget named by options (or, ``via_env``,
    by the environment variables); its exit status and report."""
    folder.mkdir()
    (folder / "test_generated.py").write_text(GENERATED)
    (folder / "conftest.py").write_text(CONFTEST)
    (folder / "budget.json").write_text(json.dumps({"per_test_flops": per_test, "total_flops": total, "totals": totals or {},
                                                    "unbudgeted_markers": {"measures_the_machine": "its count follows the machine"}}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p))
    for name in ("MIXPREC_TEST_FLOPS16", "MIXPREC_TEST_FLOPS16_BUDGET", "PYTEST_ADDOPTS"):
        env.pop(name, None)
    options = ["--flops16=report.json", "--flops16-budget=budget.json"]
    if via_env:
        env.update(MIXPREC_TEST_FLOPS16="report.json", MIXPREC_TEST_FLOPS16_BUDGET="budget.json")
        options = []
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options, *extra], cwd=folder,
                         env=env, capture_output=True, text=True, timeout=300)
    return out, json.loads((folder / "report.json").read_text())


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """One run of the generated suite in one process, over the ceiling, the total and the builds'
    total (the processes' and fp32's totals met exactly): its folder, exit status and report."""
    folder = tmp_path_factory.mktemp("flops16") / "serial"
    out, report = _run_generated(folder, per_test=1000, total=100, totals={"builds": 1, "processes": 2, "fp32": 2 * 64 ** 3})
    return folder, out, report


def test_the_plugin_counts_each_test_and_fails_one_above_the_ceiling_and_a_session_above_the_total(serial):
    _, out, report = serial
    assert out.returncode == 1, out.stdout + out.stderr
    nothing = {"bf16": 0, "fp16": 0, "fp32": 0, "builds": 0, "processes": 0}
    assert report["tests"][SMALL] == {**nothing, "bf16": 48, "builds": 1, "seconds": report["tests"][SMALL]["seconds"]}
    assert report["tests"]["test_generated.py::test_fp32"]["bf16"] == 0
    assert report["tests"]["test_generated.py::test_fp32"]["fp32"] == 2 * 64 ** 3
    large = report["tests"][LARGE]
    # the spawned child, and the resource tracker spawn starts beside it: two Python processes
    assert (large["bf16"], large["fp16"], large["builds"], large["processes"]) == (16384, 0, 1, 2)
    assert large["subprocesses"] == {**nothing, "bf16": 8192, "builds": 1, "processes": 2}
    assert report["tests"]["test_generated.py::test_unbudgeted"]["bf16"] == 2048
    assert report["tests"]["test_generated.py::test_unbudgeted"]["unbudgeted"].startswith("marked measures_the_machine")
    off = report["tests"]["test_generated.py::test_off"]
    assert (off["bf16"], off["not_counted"]) == (0, "the counter must not see this test")
    total = report["total"]
    assert (total["bf16"], total["fp16"], total["all"], total["budgeted"]) == (48 + 16384 + 2048, 0, 48 + 16384 + 2048, 48 + 16384)
    assert total["budgeted_others"] == {"fp32": 2 * 64 ** 3, "builds": 2, "processes": 2}
    assert report["by_op"] == {"aten.mm": 48 + 16384 - 8192 + 2048 + 2 * 64 ** 3}  # this process's own (the subprocess's is in the tests)
    # the large test passed, then errored at teardown; the unbudgeted one (above the ceiling too) did not
    assert "5 passed, 1 error" in out.stdout
    assert "ERROR at teardown of test_large_in_a_thread_and_a_subprocess" in out.stdout
    assert "above the per-test ceiling" in out.stdout and "above the budget" in out.stdout


def test_under_xdist_the_workers_parts_make_the_same_report_and_the_total_alone_fails_the_session(tmp_path):
    """Enabled by the environment variables this time: the workers get the settings from the suite's process."""
    pytest.importorskip("xdist")
    out, report = _run_generated(tmp_path / "xdist", per_test=10**6, total=10_000, extra=("-n", "2"), via_env=True)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "5 passed" in out.stdout and "above the budget" in out.stdout
    assert report["total"]["budgeted"] == 48 + 16384
    assert report["tests"][LARGE]["subprocesses"] == {"bf16": 8192, "fp16": 0, "fp32": 0, "builds": 1, "processes": 2}


def test_builds_processes_and_fp32_flops_over_their_totals_fail_the_session_naming_the_largest(serial):
    _, out, _ = serial
    failure = out.stdout.split("FAILED:", 1)[1]
    assert "the suite's builds: 2 pipeline builds, above the budget of 1 pipeline builds (totals.builds in " in failure
    assert "processes started, above" not in failure and "fp32 FLOPs" not in failure  # each at its total, not above
    assert "test_generated.py::test_small: 1 pipeline builds" in failure  # the largest named


def test_select_runs_only_the_tests_a_report_says_computed_in_16_bit(serial):
    folder, _, _ = serial
    # what pytest collects is what it runs: the selection is made at collection
    again = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--flops16-select=report.json",
                            "--collect-only"], cwd=folder, env=dict(os.environ, PYTHONPATH=str(TESTS)),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    chosen = sorted(line.split("::")[1] for line in again.stdout.splitlines() if line.startswith("test_generated.py::"))
    assert chosen == ["test_large_in_a_thread_and_a_subprocess", "test_small", "test_unbudgeted"]
    assert "3/5 tests collected (2 deselected)" in again.stdout
    (folder / "broken.json").write_text("{}")
    broken = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--flops16-select=broken.json"],
                            cwd=folder, env=dict(os.environ, PYTHONPATH=str(TESTS)), capture_output=True, text=True, timeout=300)
    assert broken.returncode == 4 and "--flops16-select:" in broken.stderr and "broken.json is not a report of --flops16" in broken.stderr


#: The instruction-set caps under which ATen and oneDNN run the kernels a CPU with AVX2 only runs
#: (read once, when each library starts: so only in a new process).
AVX2_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}

#: Run in a new process: every 16-bit module kind the suite computes (an RNN's composite kernel
#: included), once without the counter and once under it; prints what each gave.
_SAME_KERNELS = r"""
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from _flops16_site.flops16_count import Flops16Mode

torch.manual_seed(0)
modules = {
    "lstm": (torch.nn.LSTM(24, 32, num_layers=2, batch_first=True), (2, 7, 24)),
    "gru": (torch.nn.GRU(24, 32, batch_first=True, bidirectional=True), (2, 7, 24)),
    "conv1d": (torch.nn.Conv1d(8, 16, 3, padding=1), (2, 8, 20)),
    "conv2d": (torch.nn.Conv2d(4, 8, 3, padding=1), (1, 4, 12, 12)),
    "linear": (torch.nn.Linear(24, 40), (3, 5, 24)),
    "encoder": (torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0).eval(), (2, 6, 32)),
    "mha": (torch.nn.MultiheadAttention(32, 4, batch_first=True).eval(), (2, 6, 32)),
}
result = {"capability": torch.backends.cpu.get_cpu_capability()}
for dtype in (torch.bfloat16, torch.float16):
    for name, (module, shape) in modules.items():
        module = module.to(dtype)
        x = torch.randn(shape).to(dtype)
        call = (lambda: module(x, x, x)) if name == "mha" else (lambda: module(x))
        outcome = {}
        for counted in (False, True):
            try:
                with torch.inference_mode():
                    if counted:
                        with Flops16Mode() as mode:
                            out = call()
                    else:
                        out = call()
                out = out[0] if isinstance(out, tuple) else out
                outcome[counted] = out.float().tolist()
            except RuntimeError as exc:
                outcome[counted] = "error: " + str(exc).splitlines()[0]
        key = f"{name}-{str(dtype).split('.')[-1]}"
        result[key] = {"same": outcome[False] == outcome[True], "without": str(outcome[False])[:120],
                       "with": str(outcome[True])[:120], "counted": mode.counts if counted and not isinstance(outcome[True], str) else None}
print(json.dumps(result))
"""


def test_the_counter_runs_the_kernels_that_run_without_it_under_the_avx2_caps():
    """What a test computes is the same with and without the counter, where a CPU has AVX2 only.

    A composite operator (``aten.lstm``) was once run under the counter through torch's Python
    decomposition, which calls oneDNN's RNN layer: oneDNN has no bf16 RNN primitive on AVX2, so
    a bf16 LSTM that runs without the counter raised under it. Every module kind is run both
    ways in one process capped to AVX2's kernels; outputs (or errors) must be identical, and
    what was counted must be non-zero.
    """
    env = {**os.environ, **AVX2_CAPS}
    env.pop("PYTHONPATH", None)  # no counter of the plugin's in this process: the script places its own
    out = subprocess.run([sys.executable, "-c", _SAME_KERNELS, str(TESTS)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result.pop("capability") == "AVX2"
    different = {key: (r["without"], r["with"]) for key, r in result.items() if not r["same"]}
    assert different == {}
    uncounted = [key for key, r in result.items() if not r["without"].startswith("error") and not r["counted"]]
    assert uncounted == []
