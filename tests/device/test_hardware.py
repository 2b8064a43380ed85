from __future__ import annotations

import pytest
import torch

from mixprec import hardware
from mixprec.policy import presets
from mixprec.device import backends, matmul

# The probe's own measurement: no scripted machine description. Each test scripts the
# CPU flags and timings it needs, or asserts only what holds on any machine.
pytestmark = pytest.mark.real_probe


def _on_cpu(monkeypatch, flags=("avx2", "avx512_bf16")):
    """The probe reads ``flags`` as this CPU's (not the machine's own)."""
    monkeypatch.setattr(hardware, "_cpu_info", lambda: ("Simulated CPU", tuple(flags)))


@pytest.fixture(scope="module")
def hw():
    """This machine's own probe (the suite's scripted machine set aside)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(hardware.PROBE_FILE_VAR, raising=False)
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
    # On a loaded machine the rounds may disagree or scatter: "undecided" or "unstable" is
    # then the honest answer, never the opposite class.
    unsettled = (hardware.UNDECIDED, hardware.UNSTABLE)
    if flags & {"avx512_bf16", "amx_bf16"}:
        assert hw.dtypes["bf16"].klass in ("fast", *unsettled), hw.dtypes
        assert hw.dtypes["bf16"].klass in unsettled or "bf16" in hw.fast_16bit()
    if not flags & {"avx512_fp16", "amx_fp16"}:
        assert hw.dtypes["fp16"].klass in ("emulated", *unsettled), hw.dtypes
        assert not hw.is_fast("fp16")
    else:
        assert hw.dtypes["fp16"].klass != "emulated", hw.dtypes


EVERY_FLAG = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile", "fma", "f16c")


@pytest.mark.parametrize(("aten", "onednn", "usable"), [
    ("AVX512", "", EVERY_FLAG),
    ("AVX2", "AVX2", ("avx2", "fma", "f16c")),  # make test-avx2: the kernels of a CPU with AVX2 only
    ("AVX512", "avx512_core_bf16", ("avx2", "avx512f", "avx512_bf16", "fma", "f16c")),
    ("AVX2", "", ("avx2", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile", "fma", "f16c")),  # 16-bit products are oneDNN's
    ("AVX512", "AVX512_CORE_AMX", ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "fma", "f16c")),
    ("AVX512", "no such level", EVERY_FLAG),  # oneDNN ignores a value it does not know
])
def test_the_flags_stated_are_those_the_kernels_may_use_under_atens_and_onednns_caps(monkeypatch, aten, onednn, usable):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: aten)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", onednn)
    assert hardware.usable_flags(EVERY_FLAG) == usable


def test_classify_thresholds():
    assert hardware.classify(2.8, True) == "fast"
    assert hardware.classify(1.0, True) == "no_speedup"
    assert hardware.classify(1 / 140, True) == "emulated"
    assert hardware.classify(None, False) == "unsupported"


def test_probe_restores_torch_flags():
    before = backends.snapshot()
    hardware.probe("cpu", use_cache=False)
    assert backends.snapshot() == before


def _scripted_timings(monkeypatch, seconds):
    """The probe's timing source made to answer ``seconds(dtype, level, call_number)``."""
    calls = {}

    def fake_call(case):
        key = (case.a.dtype, case.level)
        calls[key] = calls.get(key, 0) + 1
        return seconds(case.a.dtype, case.level, calls[key])

    monkeypatch.setattr(matmul.MatmulCase, "_call", fake_call)
    return calls


def test_probe_is_cached_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    _on_cpu(monkeypatch)
    _scripted_timings(monkeypatch, lambda dtype, level, n: {torch.bfloat16: 0.0004, torch.float16: 0.1}.get(dtype, 0.001))
    first = hardware.probe("cpu", layers=False)
    assert not first.cached and first.dtypes["bf16"].klass == "fast" and first.dtypes["fp16"].klass == "emulated"
    assert len(list(tmp_path.glob("probe-*.json"))) == 1
    second = hardware.probe("cpu", layers=False)
    assert second.cached
    assert second.dtypes == first.dtypes


@pytest.mark.parametrize(("flags", "storage", "said"), [
    (("avx2",), "fp32", "used as emulated from the CPU flags (none of amx_bf16, avx512_bf16), not measured"),
    (("avx2", "avx512_bf16"), "bf16", "used as fast from the CPU flags (avx512_bf16), not measured"),
    (("avx2", "avx512_bf16", "amx_bf16"), "bf16", "used as fast from the CPU flags (amx_bf16), not measured"),
])
def test_a_probe_on_a_busy_machine_says_undecided_and_caches_nothing(tmp_path, monkeypatch, flags, storage, said):
    """bf16's calls slowed by other jobs in every other round: no verdict, no cache; the
    presets use what the CPU's flags state instead, and say so."""
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    _on_cpu(monkeypatch, flags)

    def busy(dtype, level, n):
        if dtype == torch.bfloat16:
            return 0.0004 if (n // 2) % 2 else 0.02  # 2.5x fp32 in some rounds, 0.05x in others
        return 0.001

    _scripted_timings(monkeypatch, busy)
    hw = hardware.probe("cpu", layers=False)
    assert hw.dtypes["bf16"].klass == hardware.UNDECIDED
    assert not list(tmp_path.glob("probe-*.json"))
    policy, reasons = presets.resolve("fast", hw)
    assert {r.storage for r in policy.rules if r.storage} == {storage}
    bf16 = next(r for r in reasons if r.startswith("bf16:"))
    assert "timing rounds disagreed" in bf16 and "no evidence" in bf16 and bf16.endswith(said), reasons
    if storage == "bf16":
        assert policy.rules[0].reason == "bf16 is " + said.removeprefix("used as ")
    assert hardware.probe("cpu", layers=False).dtypes == hw.dtypes  # this process keeps its answer
    hardware._UNDECIDED_THIS_PROCESS.clear()  # as a new process starts
    monkeypatch.undo()
    monkeypatch.delenv(hardware.PROBE_FILE_VAR, raising=False)  # still this test's own probe, measured
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    _on_cpu(monkeypatch, flags)  # the same CPU, whatever this machine's own flags are
    # Measured again, now quiet: bf16 at what this CPU's units allow (2.5x; without them, emulated).
    units = storage == "bf16"
    quiet = 0.0004 if units else 0.05
    _scripted_timings(monkeypatch, lambda dtype, level, n: quiet if dtype == torch.bfloat16 else 0.001)
    assert hardware.probe("cpu", layers=False).dtypes["bf16"].klass == ("fast" if units else "emulated")


def test_a_later_measurement_that_contradicts_the_cached_probe_drops_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    _on_cpu(monkeypatch)
    _scripted_timings(monkeypatch, lambda dtype, level, n: 0.005 if dtype == torch.bfloat16 else 0.001)
    hw = hardware.probe("cpu", layers=False)  # a noisy moment classed bf16 emulated (0.2x) in every round
    assert hw.dtypes["bf16"].klass == "emulated" and hardware.cache_path(hw).exists()
    assert hardware.contradiction(hw, "bf16", 0.9, 1.1) is None  # a model is not a matmul: no contradiction
    why = hardware.contradiction(hw, "bf16", 1.6, 1.9)
    assert "classed bf16 emulated" in why and "1.60x to 1.90x" in why
    assert hardware.forget(hw) and not hardware.cache_path(hw).exists()


def test_round_trip(hw):
    again = hardware.Hardware.from_dict(hw.to_dict())
    assert again == hw


def test_bad_device():
    with pytest.raises(ValueError, match="unsupported device"):
        hardware.probe("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            hardware.probe("cuda")


def test_resolve_device_names_the_source_the_value_and_why(monkeypatch):
    assert hardware.resolve_device("cpu", source="--device") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^--device 'tpu': unsupported device; choose cpu, cuda, cuda:N or mps$"):
        hardware.resolve_device("tpu", source="--device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hardware.resolve_device(None) == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^--device 'cuda:1': CUDA is not available on this machine .*; use cpu$"):
        hardware.resolve_device("cuda:1", source="--device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert hardware.resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ValueError, match=r"^device 'cuda:1': this machine has 1 CUDA device \(cuda:0 to cuda:0\)$"):
        hardware.resolve_device("cuda:1")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_probe():
    hw = hardware.probe("cuda", use_cache=False)
    assert hw.capability is not None
    if hw.capability >= (8, 0):
        assert hw.dtypes["tf32"].supported and hw.dtypes["bf16"].supported


def _by_round(monkeypatch, flags, seconds):
    """The probe on a CPU with ``flags`` whose calls take ``seconds(dtype, level, round)``:
    every call of a round reads the same, as the simulated machine is in that round."""
    monkeypatch.setattr(hardware, "_cpu_info", lambda: ("Simulated CPU", tuple(flags)))
    monkeypatch.setattr(matmul.MatmulCase, "_call", lambda case: seconds(case.a.dtype, case.level, len(case.rounds)))


def _bf16(times):
    """bf16 calls of ``times[round]`` seconds (the last one repeats), fp16 emulated, fp32 1 ms."""
    return lambda dtype, level, r: {torch.bfloat16: times[min(r, len(times) - 1)], torch.float16: 0.1}.get(dtype, 0.001)


class TestProbeKeepsOnlyTrustworthyFigures:
    """A figure whose rounds scatter, or that claims more than the hardware allows, is
    re-measured, then reported unstable: never cached, no evidence for the presets."""

    @pytest.mark.parametrize(("flags", "times", "klass", "why"), [
        (("avx2", "avx512_bf16"), [0.0004], "fast", None),  # 2.5x, steady: kept
        (("avx2", "avx512_bf16"), [1.0e-3 / 52.983], hardware.UNSTABLE, "implausible: avx512_bf16 allows at most 4x"),
        (("avx2", "avx512_bf16", "amx_bf16"), [1.0e-3 / 52.983], hardware.UNSTABLE, "implausible: amx_bf16 allows at most 32x"),
        (("avx2", "avx512_bf16", "amx_bf16"), [1.0e-3 / 16], "fast", None),  # AMX: 16x is within what it does
        (("avx2",), [0.0003], hardware.UNSTABLE, "3.33x fp32 is implausible: a cpu without native 16-bit units"),
        # Every round says "fast", but from 1.7x to 7.7x: the rounds, re-measured to the last, never agree.
        (("avx2", "amx_bf16"), [0.0006, 0.00013] * 4, hardware.UNSTABLE, "ranged from 1.67x to 7.69x fp32"),
        # One burst in the first rounds: re-measured until the rounds agree, then kept.
        (("avx2", "amx_bf16"), [0.0004, 0.0001, 0.0004, 0.0004, 0.0004], "fast", None),
    ])
    def test_scenarios(self, tmp_path, monkeypatch, flags, times, klass, why):
        monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
        _by_round(monkeypatch, flags, _bf16(times))
        hw = hardware.probe("cpu", layers=False)
        bf16 = hw.dtypes["bf16"]
        assert bf16.klass == klass, bf16
        assert (why is None and bf16.note is None) or why in bf16.note, bf16.note
        assert hardware.cache_path(hw).exists() is (klass == "fast")
        if klass == hardware.UNSTABLE:
            policy, reasons = presets.resolve("fast", hw)
            # No evidence: what the flags state decides (bf16 units: bf16; none: emulated, so fp32).
            units = set(flags) & {"avx512_bf16", "amx_bf16"}
            assert {r.storage for r in policy.rules if r.storage} == ({"bf16"} if units else {"fp32"})
            assert any(r.startswith("bf16: the probe's figure is unstable") and "no evidence" in r for r in reasons), reasons
        hardware._UNDECIDED_THIS_PROCESS.clear()

    def test_the_probe_measures_again_while_the_rounds_scatter(self, tmp_path, monkeypatch):
        monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
        rounds_seen = []

        def seconds(dtype, level, r):
            rounds_seen.append(r)
            return _bf16([0.0004, 0.0001, 0.0004, 0.0004, 0.0004])(dtype, level, r)

        _by_round(monkeypatch, ("amx_bf16",), seconds)
        hw = hardware.probe("cpu", layers=False)
        assert hw.dtypes["bf16"].klass == "fast" and max(rounds_seen) + 1 > hardware.ROUNDS

    def test_an_implausible_cached_figure_is_measured_again(self, tmp_path, monkeypatch):
        """A cache written under load by an older probe: "bf16 52.983x fp32" is not believed."""
        import dataclasses
        import json

        monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
        _by_round(monkeypatch, ("avx2", "avx512_bf16"), _bf16([0.0004]))
        quiet = hardware.probe("cpu", layers=False)
        loaded = dataclasses.replace(quiet, dtypes={**quiet.dtypes, "bf16": dataclasses.replace(
            quiet.dtypes["bf16"], ratio=52.983, gflops=52.983 * quiet.dtypes["fp32"].gflops)})
        hardware.cache_path(quiet).write_text(json.dumps(loaded.to_dict()))
        again = hardware.probe("cpu", layers=False)
        assert not again.cached and again.dtypes["bf16"].ratio == pytest.approx(2.5)
        assert hardware.probe("cpu", layers=False).cached  # the new, plausible figure is kept

    @pytest.mark.parametrize(("ratios", "island", "unstable"), [
        ([2.11] * 5, True, False),  # every round: the fp32 island is faster
        ([2.11, 0.9, 2.11, 0.9, 2.11, 0.9, 2.11, 0.9, 2.11, 0.9], False, True),  # under load: no evidence
        ([1.0] * 5, False, False),
    ])
    def test_layer_figures(self, tmp_path, monkeypatch, ratios, island, unstable):
        from mixprec.device import layers

        monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
        _by_round(monkeypatch, ("avx2", "avx512_bf16"), _bf16([0.0004]))
        monkeypatch.setattr(layers, "KINDS", {"ConvTranspose1d": layers.KINDS["ConvTranspose1d"]})
        calls = []

        def best(call, sync, budget_s):  # native, island, native, island, ...: one kind per round
            calls.append(call)
            return ratios[min(len(calls) // 2, len(ratios) - 1)] if len(calls) % 2 else 1.0

        monkeypatch.setattr(layers, "_best", best)
        hw = hardware.probe("cpu")
        info = hw.layers["bf16"]["ConvTranspose1d"]
        assert (info["island"], info["unstable"]) == (island, unstable), info
        assert hardware.cache_path(hw).exists() is not unstable
        policy, reasons = presets.resolve("fast", hw)
        assert any(r.match == "type:ConvTranspose1d" for r in policy.rules) is island
        if unstable:
            assert len(calls) == 2 * 10  # re-measured up to twice the planned rounds
            assert any("ConvTranspose1d layers: no fp32 island" in r and "unstable" in r for r in reasons), reasons
        hardware._UNDECIDED_THIS_PROCESS.clear()


class TestProbeFiguresReadAsTheirClass:
    """A probe figure reads as a measurement only where its class is decided: an ``undecided``
    or ``unstable`` one says it was not used, in ``mixprec env`` and in the HTML report."""

    @pytest.mark.parametrize(("klass", "ratio", "shown"), [
        ("fast", 3.9, "3.90x fp32"),
        ("emulated", 0.00712, "0.00712x fp32"),
        ("no_speedup", 1.0, "1.00x fp32"),
        (hardware.UNSTABLE, 52.983, "53.0x fp32 measured, not used"),
        (hardware.UNDECIDED, 1.35, "1.35x fp32 measured, not used"),
        ("unsupported", None, None),
    ])
    def test_env_and_report(self, tmp_path, monkeypatch, klass, ratio, shown):
        import dataclasses

        from typer.testing import CliRunner

        from mixprec.bench.report import render_html
        from mixprec.cli import app

        monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
        _by_round(monkeypatch, ("avx2", "avx512_bf16"), _bf16([0.0004]))
        measured = hardware.probe("cpu", layers=False)
        note = None if klass in ("fast", "emulated", "no_speedup", "unsupported") else "its timing rounds ranged widely"
        bf16 = hardware.DtypeSpeed("bf16", ratio is not None, None if ratio is None else 100 * ratio, ratio, klass, note)
        layer = {"gain": 2.11, "island": False, "unstable": True, "range": [0.9, 2.11]}
        hw = dataclasses.replace(measured, dtypes={**measured.dtypes, "bf16": bf16}, layers={"bf16": {"ConvTranspose1d": layer}})
        assert hardware.ratio_text(ratio, klass) == shown
        monkeypatch.setattr(hardware, "probe", lambda device, use_cache=True: hw)
        monkeypatch.setenv("COLUMNS", "200")
        out = CliRunner().invoke(app, ["env", "--device", "cpu"])
        assert out.exit_code == 0, out.output
        row = next(line for line in out.output.splitlines() if line.strip("│ ").startswith("bf16 "))
        assert (shown or "│ -  ") in row and klass in row
        assert "52.98" not in out.output and "2.11x" not in out.output  # neither figure reads as a measurement
        layer_row = next(line for line in out.output.splitlines() if "ConvTranspose1d" in line)
        assert "unstable (0.90–2.11), not used" in layer_row
        run = {"id": 1, "pipeline": "tts", "size": "test", "configs": [],
               "machine": {"device_type": "cpu", "name": "Simulated CPU", "dtypes": hw.to_dict()["dtypes"]}}
        assert f"bf16 {klass}" + (f" ({shown})" if shown else "") in render_html([run])
        hardware._UNDECIDED_THIS_PROCESS.clear()


class TestWhatTheHardwareStates:
    """Where the probe cannot decide, decisions use what the CPU flags or the compute capability state."""

    @pytest.mark.parametrize(("dtype", "device", "flags", "capability", "klass", "source"), [
        ("bf16", "cpu", ("avx2", "amx_bf16", "avx512_bf16"), None, "fast", "amx_bf16"),
        ("bf16", "cpu", ("avx2", "avx512_bf16"), None, "fast", "avx512_bf16"),
        ("bf16", "cpu", ("avx2",), None, "emulated", "none of amx_bf16, avx512_bf16"),
        ("fp16", "cpu", ("avx512_fp16",), None, "no_speedup", "avx512_fp16"),
        ("fp16", "cpu", ("avx512_fp16", "amx_fp16"), None, "fast", "amx_fp16"),
        ("fp16", "cpu", ("avx2",), None, "emulated", "none of amx_fp16, avx512_fp16"),
        ("bf16", "cuda", (), (9, 0), "fast", "9.0 >= 8.0"),
        ("fp16", "cuda", (), (7, 5), "fast", "7.5 >= 7.0"),
    ])
    def test_stated(self, dtype, device, flags, capability, klass, source):
        said = hardware.stated(dtype, device, flags, capability)
        assert said[0] == klass and source in said[1] and said[1].endswith("not measured")

    def test_nothing_stated_for_an_old_gpu_or_tf32_on_a_cpu(self):
        assert hardware.stated("bf16", "cuda", (), (7, 5)) is None
        assert hardware.stated("tf32", "cpu", ("amx_bf16",)) is None

    def test_effective_uses_a_measured_class_as_it_is_and_states_only_the_unsettled(self):
        import dataclasses

        base = hardware.probe("cpu", layers=False)
        flagged = dataclasses.replace(base, cpu_flags=("amx_bf16",))
        measured = dataclasses.replace(flagged, dtypes={**base.dtypes, "bf16": dataclasses.replace(
            base.dtypes["bf16"], klass="no_speedup", note=None)})
        assert measured.effective("bf16") is measured.dtypes["bf16"] and not measured.is_fast("bf16")
        busy = dataclasses.replace(flagged, dtypes={**base.dtypes, "bf16": dataclasses.replace(
            base.dtypes["bf16"], klass=hardware.UNSTABLE, note="its rounds scattered")})
        used = busy.effective("bf16")
        assert used.klass == "fast" and used.note.startswith("from the CPU flags (amx_bf16), not measured")
        assert "its rounds scattered" in used.note and busy.fast_16bit()[0] == "bf16"


def test_a_cpu_probe_times_one_thread_in_cpu_time_and_restores_the_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    _on_cpu(monkeypatch)
    threads = torch.get_num_threads()
    seen = []
    monkeypatch.setattr(matmul.MatmulCase, "_call", lambda case: seen.append(torch.get_num_threads()) or 0.001)
    hw = hardware.probe("cpu", layers=False, use_cache=False)
    assert set(seen) == {1} and torch.get_num_threads() == threads
    assert hw.clock == "cpu-time, 1 thread" and hw.threads == threads


class TestARecordedMachine:
    """``MIXPREC_PROBE_FILE``: a recorded description is used instead of measuring."""

    def test_the_recorded_description_is_used_and_nothing_is_measured(self, tmp_path, monkeypatch):
        import machines

        monkeypatch.setattr(hardware, "measure", lambda *a, **k: pytest.fail("measured despite a recorded machine"))
        path = machines.write(tmp_path / "m.json", machines.CLASSES["cuda"][1])
        monkeypatch.setenv(hardware.PROBE_FILE_VAR, str(path))
        hw = hardware.probe("cpu")
        assert hw.cpu_flags == machines.AMX.cpu_flags and hw.recorded == str(path) and hw.cached
        assert hw.dtypes == machines.AMX.dtypes and hw.layers == machines.AMX.layers

    def test_what_env_json_prints_is_a_recording(self, tmp_path, monkeypatch):
        import json

        from typer.testing import CliRunner

        from mixprec.cli import app

        import machines

        monkeypatch.setenv(hardware.PROBE_FILE_VAR, str(machines.write(tmp_path / "amx.json", (machines.AMX,))))
        out = CliRunner().invoke(app, ["env", "--json", "--device", "cpu"])
        assert out.exit_code == 0, out.output
        recording = tmp_path / "env.json"
        recording.write_text(out.stdout)
        monkeypatch.setenv(hardware.PROBE_FILE_VAR, str(recording))
        assert hardware.probe("cpu").dtypes == machines.AMX.dtypes
        assert json.loads(recording.read_text())["hardware"]["cpu_flags"] == list(machines.AMX.cpu_flags)
        monkeypatch.setenv("COLUMNS", "250")
        shown = CliRunner().invoke(app, ["env", "--device", "cpu"])
        assert f"recorded in {recording} through MIXPREC_PROBE_FILE, not measured here" in shown.output
        assert "unknown setting" not in shown.output  # the variable is mixprec's, not a setting

    @pytest.mark.parametrize(("content", "said"), [
        (None, "cannot read it"),
        ("{not json", "not JSON"),
        ('{"device_type": "cpu"}', "not a machine description (KeyError"),
        ('[{"device_type": "tpu", "dtypes": {}}]', "(item 0): not a machine description"),
        ("[]", "describes nothing, not cpu"),
    ])
    def test_a_bad_file_is_refused_naming_the_variable_and_the_file(self, tmp_path, monkeypatch, content, said):
        path = tmp_path / "machine.json"
        if content is not None:
            path.write_text(content)
        monkeypatch.setenv(hardware.PROBE_FILE_VAR, str(path))
        with pytest.raises(ValueError) as exc:
            hardware.probe("cpu")
        assert str(exc.value).startswith(f"MIXPREC_PROBE_FILE='{path}'") and said in str(exc.value), exc.value

    def test_a_file_without_this_device_names_what_it_holds(self, tmp_path, monkeypatch):
        import dataclasses

        import machines

        only_gpu = dataclasses.replace(machines.H100)
        monkeypatch.setenv(hardware.PROBE_FILE_VAR, str(machines.write(tmp_path / "gpu.json", (only_gpu,))))
        with pytest.raises(ValueError, match="describes cuda, not cpu: record it with `mixprec env --device cpu --json`"):
            hardware.probe("cpu")

    @pytest.mark.parametrize("name", ["avx2", "avx512-bf16", "amx", "cuda"])
    def test_every_hardware_class_is_a_description_the_probe_would_keep(self, name):
        """The suite's classes pass the checks a measured probe must pass to be cached."""
        import machines
        from mixprec.device.trust import holds

        for hw in machines.CLASSES[name][1]:
            assert holds(hw, (hardware.UNDECIDED, hardware.UNSTABLE)), hw
            assert hardware.Hardware.from_dict(hw.to_dict()) == hw

    def test_a_recorded_gpu_decides_on_a_machine_without_one(self, tmp_path, monkeypatch):
        from typer.testing import CliRunner

        from mixprec.cli import app

        import machines

        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setenv(hardware.PROBE_FILE_VAR, str(machines.write(tmp_path / "gpu.json", machines.CLASSES["cuda"][1])))
        assert hardware.probe("cuda").capability == (9, 0)
        monkeypatch.setenv("COLUMNS", "250")
        out = CliRunner().invoke(app, ["presets", "--device", "cuda"])
        assert out.exit_code == 0 and "Presets for cuda (Simulated NVIDIA H100 80GB HBM3)" in out.output, out.output
        assert "fp16 measured 9.31x fp32 matmul speed" in out.output
        with pytest.raises(ValueError, match="unsupported device"):
            hardware.probe("tpu")
