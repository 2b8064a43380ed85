"""Every kind of tensor a model can hold, through apply, revert, the guard, the profile and
the benchmark: one model (``kinds_models.EveryKind``) holds them all."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import mixprec
from kinds_models import EveryKind, EveryKindPipeline, expected_bytes, parts, same_state, state
from mixprec.bench.configs import parse_configs, setup
from mixprec.casting.kinds import KINDS, kind, sample, stored_bytes
from mixprec.casting.targets import DTYPES
from mixprec.device.hardware import DtypeSpeed, Hardware, classify
from mixprec.diagnose.fallbacks import fingerprint


def _hw(**ratios: float) -> Hardware:
    speeds = {"fp32": 1.0, "tf32": 1.0, "bf16": 2.8, "fp16": 1 / 140} | ratios
    dtypes = {name: DtypeSpeed(name, True, 100 * r, r, "fast" if name == "fp32" else classify(r, name != "tf32"))
              for name, r in speeds.items()}
    return Hardware("cpu", "test cpu", None, 2**34, (), 2, torch.__version__, dtypes)


#: A CPU where bf16 is fast and fp16 emulated, and one where both are fast: the presets store in bf16 and in fp16.
MACHINES = {"bf16-cpu": _hw(), "fp16-cpu": _hw(bf16=0.5, fp16=2.5)}
CASES = [(name, machine) for machine in MACHINES for name in mixprec.PRESETS]
X = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))


@pytest.fixture(autouse=True)
def _quiet_torch_notes():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*(Sparse|sparse|quantiz).*")
        yield


def _policy(name: str, machine: str) -> mixprec.Policy:
    return mixprec.preset(name, hardware=MACHINES[machine])


class TestApplyRevert:
    @pytest.mark.parametrize("name,machine", CASES)
    @pytest.mark.parametrize("keep_original", ["cpu", "disk"])
    def test_each_kind_is_cast_or_left_by_design_and_put_back_bit_exactly(self, name, machine, keep_original):
        model = EveryKind()
        before = state(model)
        reference = model(X)
        policy = _policy(name, machine)
        with mixprec.apply(model, policy, keep_original=keep_original) as applied:
            storage = {p.qualname: DTYPES[p.storage] for p in applied.plans}
            tensors = dict([*model.named_parameters(), *model.named_buffers()])
            for tname, tkind in EveryKind.KINDS.items():
                t, original = tensors[tname], before[tname]
                assert type(t) is original[0] and t.layout == original[1], tname  # the object keeps its type and layout
                if tkind in ("floating", "sparse", "subclass"):  # values cast to the owner's storage dtype
                    assert t.dtype == storage[tname.rpartition(".")[0]], tname
                else:  # compressed sparse, complex, integer, bool, quantized, meta: never cast
                    assert t.dtype == original[2], tname
            out = model(X)
            assert torch.isfinite(out).all()
        assert same_state(before, state(model)) == []
        assert torch.equal(model(X), reference)  # the first fp32 run after revert is the one before apply

    def test_weight_bytes_count_what_each_kind_stores(self):
        model = EveryKind()
        assert mixprec.weight_bytes(model) == expected_bytes(model)
        # a sparse 8x8 tensor with 5 non-zeros is its indices and values, not 64 floats; a meta tensor holds nothing
        assert stored_bytes(model.coo) == 2 * 5 * 8 + 5 * 4
        assert stored_bytes(model.unloaded) == 0
        with mixprec.apply(model, _policy("fast", "bf16-cpu")) as applied:
            assert applied.weight_bytes() == expected_bytes(model) < expected_bytes(EveryKind())
            fresh = dict([*EveryKind().named_parameters(), *EveryKind().named_buffers()])
            cast = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.dtype == torch.bfloat16]
            assert applied.original_bytes == sum(p.numel() * p.element_size() for n in cast for p in parts(fresh[n]))

    @pytest.mark.parametrize("name", sorted(EveryKind.KINDS))
    def test_kinds_are_named_as_designed(self, name):
        model = EveryKind()
        t = dict([*model.named_parameters(), *model.named_buffers()])[name]
        expected = EveryKind.KINDS[name]
        assert kind(t) == {"subclass": "floating", "compressed": "sparse"}.get(expected, expected)
        assert kind(t) in KINDS

    def test_a_floating_meta_tensor_the_policy_would_cast_is_refused_and_nothing_changes(self):
        model = EveryKind()
        model.register_buffer("pending", torch.zeros(8, device="meta"))
        before = state(model)
        with pytest.raises(mixprec.ApplyError, match=r"meta device \(first: 'pending'\).*nothing was changed"):
            mixprec.apply(model, _policy("fast", "bf16-cpu"))
        assert same_state(before, state(model)) == []


class TestGuardProfileBench:
    @pytest.mark.parametrize("name,machine", CASES)
    def test_guard_remembering_falls_back_and_reverts_bit_exactly(self, name, machine, tmp_path):
        model = EveryKind()
        before = state(model)
        applied = mixprec.apply(model, _policy(name, machine))
        store = mixprec.FallbackStore(tmp_path / "fallbacks.json")
        guard = mixprec.guard(applied, on_nonfinite="fallback", hardware=MACHINES[machine], store=store)
        assert torch.isfinite(model(X)).all()
        guard.remove()
        applied.revert()
        assert same_state(before, state(model)) == []

    @pytest.mark.parametrize("name", sorted(n for n, k in EveryKind.KINDS.items() if k != "meta"))
    def test_the_fingerprint_samples_every_kind(self, name):
        """Changing the values of any one tensor, of any kind, changes the guard's fingerprint."""
        hw = MACHINES["bf16-cpu"]
        prints = []
        for change in (False, True):
            model = EveryKind()
            if change:
                t = dict([*model.named_parameters(), *model.named_buffers()])[name]
                with torch.no_grad():
                    for part in parts(t) if not t.is_quantized else []:
                        part.add_(1) if not part.dtype == torch.bool else part.logical_not_()
                    if t.is_quantized:
                        model.quantized = torch.quantize_per_tensor(t.dequantize() + 1, 0.05, 0, torch.qint8)
            with mixprec.apply(model, _policy("fast", "bf16-cpu")) as applied:
                prints.append(fingerprint(applied, hw))
        assert prints[0] != prints[1]

    def test_the_sample_of_each_kind_is_exact_and_finite(self):
        model = EveryKind()
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            s = sample(t, 4096)
            assert s.dtype == torch.float64 and torch.isfinite(s).all(), name
            assert s.numel() == sum(p.numel() for p in parts(t)[:1 if t.is_quantized else None]) or t.is_quantized, name

    @pytest.mark.parametrize("name,machine", CASES[:4])
    def test_profile_measures_every_module_and_changes_nothing(self, name, machine):
        model = EveryKind()
        before = state(model)
        prof = mixprec.profile(model, X, _policy(name, machine))
        assert {s.module for s in prof.modules} >= {"(root)", "lin"}
        assert same_state(before, state(model)) == []

    @pytest.mark.parametrize("config", ["fp32", "matmul-medium", "autocast-bf16", "naive-bf16", *mixprec.PRESETS])
    def test_every_bench_configuration_runs_and_reports_the_weights_it_holds(self, config):
        pipe = EveryKindPipeline()
        fp32_bytes = mixprec.weight_bytes(pipe)
        spec = next(s for s in parse_configs(config, MACHINES["bf16-cpu"])[0] if s.name == config)
        inputs = pipe.example_inputs(2, 0)  # made before the configuration is set up, as the worker does
        context, info = setup(spec, pipe, MACHINES["bf16-cpu"])
        with context():
            out = pipe.run(inputs)
        assert torch.isfinite(out.output).all()
        held = mixprec.weight_bytes(pipe)
        assert held == expected_bytes(pipe.components["net"])
        if config == "naive-bf16":
            assert held < fp32_bytes
        elif spec.kind != "preset" or config == "quality":  # quality keeps fp32 weights
            assert held == fp32_bytes
        else:  # the guard the benchmark installs may have pinned a module wider: what it reports is what is held
            assert held < fp32_bytes or info["guard"].pins


class _Cached(nn.Module):
    """Caches kept as plain attributes, filled (again) by the first call in the dtype it sees."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.table = None
        self.freqs = torch.polar(torch.ones(8), torch.arange(8.0))
        self.sparse_mask = torch.eye(8).to_sparse()
        self.positions = torch.arange(8)

    def forward(self, x):
        y = self.lin(x)
        if self.table is None or self.table.dtype != y.dtype:
            self.table = torch.linspace(0, 1, 8, dtype=y.dtype)
        self.freqs = self.freqs * torch.polar(torch.ones(8), torch.ones(8))  # a new complex object per call
        self.sparse_mask = self.sparse_mask.to(y.dtype)
        return y + self.table + self.freqs.real.to(y.dtype) + torch.sparse.mm(self.sparse_mask.float(), y.float().t()).t().to(y.dtype)


class TestPlainCaches:
    @pytest.mark.parametrize("name,machine", CASES)
    def test_plain_tensor_attributes_of_every_kind_are_put_back(self, name, machine):
        model = _Cached()
        before = {k: v for k, v in vars(model).items() if isinstance(v, torch.Tensor) or v is None}
        with mixprec.apply(model, _policy(name, machine)):
            model(X)
        for key, value in before.items():
            assert getattr(model, key) is value, key  # the same object (or None) as before apply


class TestTunerKey:
    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_the_tuners_model_key_reads_every_kind(self, seed):
        from mixprec.tuning.evaluators import _fingerprint

        assert _fingerprint({"": EveryKind(seed)}) == _fingerprint({"": EveryKind(seed)})
        assert _fingerprint({"": EveryKind(seed)}) != _fingerprint({"": EveryKind(seed + 1)})
