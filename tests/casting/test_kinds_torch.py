"""Every kind of tensor torch has, through ``apply`` + a run + ``revert``: each works (cast or
left, put back bit-exactly) or is refused up front with an ``ApplyError`` naming it, and nothing
changed (the table in :mod:`mixprec.casting.kinds`). Tensor modes: ``test_kinds_modes.py``."""

from __future__ import annotations

import warnings
from typing import Callable

import pytest
import torch
from torch import nn

import mixprec
from kinds_torch_models import POLICIES, X, Holder, buffer, changed, param, parts, state
from mixprec.casting.kinds import digest, kind, sample, stored_bytes
from mixprec.casting.targets import DTYPES

COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


@pytest.fixture(autouse=True)
def _quiet_torch_notes():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*(Sparse|sparse|quantiz|nested|Nested|mkldnn).*")
        yield



def _inference_model(m: Holder) -> None:
    with torch.inference_mode():
        m.lin = nn.Linear(8, 8)


def _aliased(m: Holder) -> None:
    base = torch.randn(16)
    m.first = nn.Parameter(base[:8])
    m.register_buffer("overlap", base[4:12])  # shares storage with the parameter


def _non_leaf(m: Holder) -> None:
    m.register_buffer("derived", torch.randn(8, requires_grad=True) * 2)


def _hooked(m: Holder) -> None:
    m.lin.weight.register_hook(lambda g: g * 1)
    m.lin.weight.register_post_accumulate_grad_hook(lambda p: None)


def _dual(m: Holder) -> None:
    import torch.autograd.forward_ad as fwad

    m.register_buffer("dual", fwad.make_dual(torch.randn(8), torch.ones(8)))


def _two_tensor() -> torch.Tensor:
    two = pytest.importorskip("torch.testing._internal.two_tensor")
    return two.TwoTensor(torch.randn(8, 8), torch.randn(8, 8))


def _nested_jagged() -> torch.Tensor:
    return torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)


#: Kinds apply works on: name -> how the holder gets one.
WORKS = {
    "inference tensors": _inference_model,
    "neg bit": param("negated", lambda: torch.randn(8, 8, dtype=torch.complex64).conj().imag),
    "conj bit (complex)": buffer("conjugated", lambda: torch.randn(8, dtype=torch.complex64).conj()),
    "transposed view": param("transposed", lambda: torch.randn(8, 16).t()),
    "expanded view": param("expanded", lambda: torch.randn(8, 1).expand(8, 8)),
    "views sharing storage": _aliased,
    "requires_grad non-leaf buffer": _non_leaf,
    "sparse CSC": buffer("csc", lambda: torch.eye(8).to_sparse_csc()),
    "sparse BSR": buffer("bsr", lambda: torch.eye(8).to_sparse_bsr((2, 2))),
    "nested, strided": buffer("nested", lambda: torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])),
    "nested, jagged": buffer("jagged", _nested_jagged),
    "quantized per channel": buffer("qc", lambda: torch.quantize_per_channel(
        torch.randn(4, 8), torch.full((4,), 0.1), torch.zeros(4, dtype=torch.long), 0, torch.qint8)),
    "float64": lambda m: m.register_buffer("wide", torch.randn(8, dtype=torch.float64)),
    "fp8 already": buffer("f8", lambda: torch.randn(8).to(torch.float8_e4m3fn)),
    "zero tensor": buffer("zero", lambda: torch._efficientzerotensor(8)),
    "__torch_dispatch__ wrapper": buffer("two", _two_tensor),
    "__torch_dispatch__ wrapper parameter": lambda m: setattr(m, "two", nn.Parameter(_two_tensor())),
    "forward-AD dual": _dual,
    "tensor hooks": _hooked,
}


def _cast_ok(model: Holder, policy: mixprec.Policy, applied: mixprec.Applied) -> None:
    storage = {p.qualname: DTYPES[p.storage] for p in applied.plans}
    if policy.rules and policy.rules[0].storage == "fp8":
        assert model.lin.weight.dtype == torch.float8_e4m3fn
    else:
        assert model.lin.weight.dtype == storage["lin"]


class TestKindsThatWork:
    @pytest.mark.parametrize("policy", sorted(POLICIES))
    @pytest.mark.parametrize("case", sorted(WORKS))
    def test_apply_runs_and_reverts_bit_exactly(self, case, policy):
        import torch.autograd.forward_ad as fwad

        with fwad.dual_level():
            model = Holder(WORKS[case])
            before = state(model)
            with torch.no_grad():
                reference = model(X)
            pol = POLICIES[policy]()
            with mixprec.apply(model, pol) as applied, torch.no_grad():
                _cast_ok(model, pol, applied)
                for name, t in [*model.named_parameters(), *model.named_buffers()]:
                    assert t.is_inference() == before[name][5], name  # an inference tensor stays one, no other becomes one
                    if t.layout in COMPRESSED:  # left: its dtype and its values' dtype agree
                        assert t.dtype == t.values().dtype == before[name][3], name
                assert torch.isfinite(model(X).float()).all()
            assert changed(before, model) == []
            with torch.no_grad():
                assert torch.equal(model(X), reference)

    def test_inference_tensors_written_through_data_are_followed(self):
        """An inference tensor has no version counter: a write through .data is found by the sample."""
        model = Holder(_inference_model)
        new = torch.randn(8, 8)
        with pytest.warns(UserWarning, match="changed in place"):
            with mixprec.apply(model, POLICIES["bf16"]()):
                model.lin.weight.data = new.to(torch.bfloat16)
        # the app's values, upcast (read through .data: the app left a normal tensor in a parameter without a counter)
        assert model.lin.weight.dtype == torch.float32 and torch.equal(model.lin.weight.data, new.to(torch.bfloat16).float())

    def test_hooks_fire_under_the_policy_and_after_revert(self):
        model = Holder(lambda m: None)
        seen: list[torch.dtype] = []
        model.lin.weight.register_hook(lambda g: seen.append(g.dtype))
        model.lin.weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.dtype))
        with pytest.warns(UserWarning, match="revert dropped the gradients"):
            with mixprec.apply(model, POLICIES["bf16"]()):
                model(X).float().sum().backward()
        assert seen == [torch.bfloat16, torch.bfloat16]
        model(X).sum().backward()
        assert seen[2:] == [torch.float32, torch.float32] and model.lin.weight.grad.dtype == torch.float32

    @pytest.mark.parametrize("policy", sorted(POLICIES))
    def test_dtensor_on_a_one_process_cpu_group(self, policy):
        dist = pytest.importorskip("torch.distributed")
        if not dist.is_available() or not dist.is_gloo_available():
            pytest.skip("this torch has no gloo backend: a DTensor needs a device mesh, which needs a process group")
        if dist.is_initialized():
            pytest.skip("a process group is already initialised in this process")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
        try:
            mesh = init_device_mesh("cpu", (1,))
            model = Holder(lambda m: None)
            model.lin.weight = nn.Parameter(distribute_tensor(model.lin.weight.detach(), mesh, [Shard(0)]))
            model.lin.bias = nn.Parameter(distribute_tensor(model.lin.bias.detach(), mesh, [Replicate()]))
            before = state(model)
            with mixprec.apply(model, POLICIES[policy]()):
                assert model.lin.weight.dtype != torch.float32 and type(model.lin.weight).__name__ == "DTensor"
                model.lin(distribute_tensor(X.to(torch.bfloat16), mesh, [Replicate()]))
            assert changed(before, model) == []
        finally:
            dist.destroy_process_group()

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
    @pytest.mark.parametrize("policy", sorted(POLICIES))
    def test_a_model_on_the_gpu(self, policy):
        model = Holder(lambda m: m.register_buffer("wide", torch.randn(8, dtype=torch.float64))).cuda()
        before = state(model)
        with mixprec.apply(model, POLICIES[policy]()):
            assert torch.isfinite(model(X.cuda()).float()).all()
        assert changed(before, model) == []


def _mkldnn_param(m: Holder) -> None:
    m.packed = nn.Parameter(torch.randn(8, 8).to_mkldnn())


def _fake(m: Holder) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        m.register_buffer("traced", torch.randn(8))


def _escaped(transform: str) -> Callable[[Holder], None]:
    def make(m: Holder) -> None:
        kept = {}

        def body(x):
            kept["t"] = x * 1
            return x.sum() if transform == "grad" else x

        getattr(torch.func, transform)(body)(torch.randn(2, 8))
        m.register_buffer("escaped", kept["t"])
    return make


#: Kinds apply refuses: name -> (how the holder gets one, the tensor's name, words naming its kind).
REFUSED = {
    "mkldnn buffer": (buffer("packed", lambda: torch.randn(8, 8).to_mkldnn()), "packed", "mkldnn layout"),
    "mkldnn parameter": (_mkldnn_param, "packed", "mkldnn layout"),
    "fake tensor": (_fake, "traced", "fake tensor"),
    "escaped from grad": (_escaped("grad"), "escaped", "functorch"),
    "escaped from vmap": (_escaped("vmap"), "escaped", "functorch"),
}


class TestKindsRefused:
    @pytest.mark.parametrize("policy", sorted(POLICIES))
    @pytest.mark.parametrize("case", sorted(REFUSED))
    def test_refused_up_front_naming_tensor_and_kind_and_nothing_changes(self, case, policy):
        make, name, words = REFUSED[case]
        model = Holder(make)
        lin = {n: (id(t), t.dtype, t.clone()) for n, t in model.lin.named_parameters()}
        odd = model.get_parameter(name) if name in dict(model.named_parameters()) else model.get_buffer(name)
        odd_before = (id(odd), odd.dtype, odd.layout)
        with pytest.raises(mixprec.ApplyError, match=rf"(?s){words}.*'{name}'|'{name}'.*{words}") as err:
            mixprec.apply(model, POLICIES[policy]())
        assert "nothing was changed" in str(err.value)
        for n, t in model.lin.named_parameters():
            assert (id(t), t.dtype) == lin[n][:2] and torch.equal(t, lin[n][2]), n
        now = model.get_parameter(name) if name in dict(model.named_parameters()) else model.get_buffer(name)
        assert (id(now), now.dtype, now.layout) == odd_before
        assert not any(m.__dict__.get("_mixprec_applied") for m in model.modules())

    def test_an_mkldnn_tensor_the_policy_keeps_is_left_and_sampled(self):
        model = Holder(buffer("packed", lambda: torch.randn(8, 8).to_mkldnn()))
        before = state(model)
        with mixprec.apply(model, mixprec.Policy(rules=(mixprec.Rule("lin", storage="bf16"),))):
            assert model.lin.weight.dtype == torch.bfloat16 and model.packed.layout == torch._mkldnn
            model(X)
        assert changed(before, model) == []


def _ao_dynamic() -> nn.Module:
    inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    return torch.ao.quantization.quantize_dynamic(inner, {nn.Linear}, dtype=torch.qint8)


def _ao_static() -> nn.Module:
    model = nn.Sequential(torch.ao.quantization.QuantWrapper(nn.Linear(8, 8)), nn.Linear(8, 8)).eval()
    model[0].qconfig = torch.ao.quantization.get_default_qconfig("x86")
    torch.ao.quantization.prepare(model, inplace=True)
    model(X)  # calibration
    return torch.ao.quantization.convert(model, inplace=True)


def _ao_qat() -> nn.Module:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).train()
    model.qconfig = torch.ao.quantization.get_default_qat_qconfig("x86")
    torch.ao.quantization.prepare_qat(model, inplace=True)
    model(X)
    return model.eval()


class TestTorchAo:
    """Models quantized with torch.ao: packed 8-bit weights (left), fake-quantize observers (cast)."""

    @pytest.mark.parametrize("policy", sorted(POLICIES))
    @pytest.mark.parametrize("build", [_ao_dynamic, _ao_static, _ao_qat], ids=["dynamic", "static", "qat-prepared"])
    def test_apply_runs_and_reverts_bit_exactly(self, build, policy):
        if "x86" not in torch.backends.quantized.supported_engines:
            pytest.skip("this torch has no x86 quantized engine")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = build()
        before = state(model)
        with torch.no_grad():
            reference = model(X)
            with mixprec.apply(model, POLICIES[policy]()):
                assert torch.isfinite(model(X).float()).all()
            assert changed(before, model) == [] and torch.equal(model(X), reference)


def _dtype_tensor(dtype: torch.dtype) -> torch.Tensor:
    values = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    if "torch.q" in str(dtype):
        return torch.quantize_per_tensor(values, 0.1, 0, dtype)
    return values.to(dtype) if _converts(dtype) else torch.zeros(4, 8, dtype=dtype)


def _converts(dtype: torch.dtype) -> bool:
    try:
        torch.zeros(1).to(dtype).to(torch.float32)
    except NotImplementedError:
        return False
    return True


def _raw(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes, for any dtype."""
    return t.int_repr().view(torch.uint8) if t.is_quantized else t.detach().view(torch.uint8).clone()


def _layout_tensor(layout: torch.layout) -> torch.Tensor:
    dense = torch.randn(8, 8, generator=torch.Generator().manual_seed(3)).relu()
    if layout == torch.strided:
        return dense
    if layout == torch._mkldnn:
        return dense.to_mkldnn()
    if layout == torch.jagged:
        return torch.nested.nested_tensor([dense[:3], dense[3:]], layout=torch.jagged)
    if layout in (torch.sparse_coo, *COMPRESSED):
        return dense.to_sparse(layout=layout, blocksize=(2, 2) if layout in (torch.sparse_bsr, torch.sparse_bsc) else None)
    raise AssertionError(f"torch has a layout these tests do not know: {layout}; add it to the kinds table and here")


class TestEveryLayout:
    """A buffer of every layout torch has: cast (strided, COO, jagged), left (compressed sparse) or,
    where the policy would cast it, refused up front (mkldnn)."""

    @pytest.mark.parametrize("policy", sorted(POLICIES))
    @pytest.mark.parametrize("layout", sorted({v for v in vars(torch).values() if isinstance(v, torch.layout)}, key=str),
                             ids=str)
    def test_apply_run_revert_or_refusal(self, layout, policy):
        model = Holder(lambda m: m.register_buffer("odd", _layout_tensor(layout)))
        before = state(model)
        if layout == torch._mkldnn:
            with pytest.raises(mixprec.ApplyError, match=r"mkldnn layout.*\(first: 'odd'\).*nothing was changed.*to_dense"):
                mixprec.apply(model, POLICIES[policy]())
        else:
            with mixprec.apply(model, POLICIES[policy]()), torch.no_grad():
                assert (model.odd.dtype == torch.float32) == (layout in COMPRESSED)
                if layout in COMPRESSED:
                    assert model.odd.values().dtype == torch.float32
                assert torch.isfinite(model(X).float()).all()
        assert changed(before, model) == []


class TestEveryDtype:
    """A buffer of every dtype torch has, next to cast weights: floating ones cast, the rest left
    (bit-packed floats too: torch converts them to nothing)."""

    @pytest.mark.parametrize("policy", sorted(POLICIES))
    @pytest.mark.parametrize("dtype", sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str), ids=str)
    def test_apply_run_revert_or_refusal(self, dtype, policy):
        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
        model.register_buffer("odd", _dtype_tensor(dtype))
        weights = {n: t.clone() for n, t in model.named_parameters()}
        raw, odd = _raw(model.odd), model.odd
        with mixprec.apply(model, POLICIES[policy]()):
            if dtype.is_floating_point and _converts(dtype):  # cast to its module's storage dtype
                assert model.odd.dtype in (torch.bfloat16, torch.float16, torch.float32)
            else:
                assert model.odd.dtype == dtype
            with torch.no_grad():
                assert torch.isfinite(model(X).float()).all()
        assert model.odd is odd and model.odd.dtype == dtype and torch.equal(_raw(model.odd), raw)
        assert all(torch.equal(t, weights[n]) and t.dtype == torch.float32 for n, t in model.named_parameters())


def _odd(model: Holder) -> torch.Tensor:
    """The holder's tensor of the kind under test."""
    return next(t for n, t in [*model.named_parameters(), *model.named_buffers()] if not n.startswith(("lin.", "inp.")))


class TestKindHelpers:
    @pytest.mark.parametrize("case", ["neg bit", "conj bit (complex)", "nested, strided", "nested, jagged",
                                      "quantized per channel", "zero tensor", "__torch_dispatch__ wrapper"])
    def test_every_kind_is_sampled_counted_and_its_digest_sees_a_change(self, case):
        model = Holder(WORKS[case])
        t = _odd(model)
        assert stored_bytes(t) == sum(p.numel() * p.element_size() for p in parts(t))
        assert sample(t).dtype == torch.float64 and kind(t) in ("floating", "complex", "quantized")
        before = digest(t)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            other = _odd(Holder(WORKS[case]))
        assert (digest(other) != before) == (case != "zero tensor")  # zeros are zeros

    def test_bit_packed_dtypes_are_sampled_by_their_bytes(self):
        packed = torch.arange(8, dtype=torch.int16).view(torch.bits16)
        assert torch.equal(sample(packed), torch.arange(8, dtype=torch.float64))
        assert digest(packed) != digest((torch.arange(8, dtype=torch.int16) + 1).view(torch.bits16))
        assert stored_bytes(torch.zeros(4, 8, dtype=torch.float4_e2m1fn_x2)) == 32

    def test_mkldnn_and_fake_tensors_are_sampled(self):
        packed = torch.arange(64.0).reshape(8, 8).to_mkldnn()
        assert torch.equal(sample(packed, 64), torch.arange(64.0, dtype=torch.float64))
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            fake = torch.randn(8)
        assert kind(fake) == "meta" and stored_bytes(fake) == 0 and sample(fake).numel() == 0
