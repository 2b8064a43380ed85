"""State a model or the process carries outside its tensors' identity and version counters:
what apply refuses, follows, or revert restores (the table in docs/architecture.md)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import mixprec
from mixprec import NumericSettings, Policy, Rule
from mixprec.device import backends

BF16 = Policy((Rule("*", storage="bf16"),), name="bf16")
FP16 = Policy((Rule("*", storage="fp16"),), name="fp16")
BF16_FP32_COMPUTE = Policy((Rule("*", storage="bf16", compute="fp32"),), name="bf16-storage")
HALF_MLP = Policy((Rule("0", storage="bf16"), Rule("2", storage="fp16")), name="mixed")
POLICIES = {p.name: p for p in (BF16, FP16, BF16_FP32_COMPUTE, HALF_MLP)}
X = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))


def _mlp(seed: int = 0) -> nn.Sequential:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def _messages(record) -> list[str]:
    return [str(w.message) for w in record]


class TestGrads:
    """Revert puts back each cast parameter's ``.grad`` as it was before apply; gradients
    computed under the policy (16-bit, of the 16-bit weights) are dropped with a warning."""

    @pytest.mark.parametrize("policy", sorted(POLICIES))
    @pytest.mark.parametrize("before", ["no grad", "fp32 grad"])
    def test_backward_under_a_policy_leaves_no_16_bit_grad_and_the_next_fp32_backward_is_normal(self, policy, before):
        model, reference = _mlp(), _mlp()
        grads = {}
        if before == "fp32 grad":
            model(X).sum().backward()
            reference(X).sum().backward()
            grads = {n: (p.grad, p.grad.clone()) for n, p in model.named_parameters()}
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            with mixprec.apply(model, POLICIES[policy]):
                model(X).float().sum().backward()
                low = {n for n, p in model.named_parameters() if p.dtype != torch.float32}
                assert low and all(model.get_parameter(n).grad.dtype == model.get_parameter(n).dtype for n in low)
        assert any("revert dropped the gradients computed under the policy" in m for m in _messages(record))
        for name, p in model.named_parameters():
            if name in grads:  # the same object, with the values it had
                assert p.grad is grads[name][0] and torch.equal(p.grad, grads[name][1]), name
            elif name in low:
                assert p.grad is None, name
        model(X).sum().backward()
        reference(X).sum().backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert p.grad.dtype == torch.float32 and torch.equal(p.grad, q.grad), name

    def test_no_backward_under_the_policy_no_warning(self):
        model = _mlp()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with mixprec.apply(model, BF16):
                model(X)


class _Writes(nn.Module):
    """A forward that changes its own weight, the way some apps do."""

    def __init__(self, write):
        super().__init__()
        self.lin = _mlp()[0]
        self.write = write

    def forward(self, x):
        self.write(self.lin.weight)
        return self.lin(x)


def _no_grad(fn):
    def write(w):
        with torch.no_grad():
            fn(w)
    return write


WRITES = {
    "data.mul_": lambda w: w.data.mul_(0.5),
    "data.add_": lambda w: w.data.add_(0.125),
    "data.copy_": lambda w: w.data.copy_(w.data.flip(0)),
    "data.fill_ one row": lambda w: w.data[3].fill_(0.25),
    "data.clamp_": lambda w: w.data.clamp_(-0.1, 0.1),
    "no_grad mul_": _no_grad(lambda w: w.mul_(0.5)),
    "no_grad add_": _no_grad(lambda w: w.add_(0.125)),
}


class TestDataWrites:
    """A write through ``.data`` moves no version counter; it is followed as an in-place
    change is: the 16-bit values become the originals, with the same warning."""

    @pytest.mark.parametrize("write", sorted(WRITES))
    @pytest.mark.parametrize("policy", [BF16, FP16])
    def test_a_weight_written_under_the_policy_keeps_its_history_with_a_warning(self, write, policy):
        model = _Writes(WRITES[write])
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            applied = mixprec.apply(model, policy)
            for _ in range(3):
                model(X)
            written = model.lin.weight.detach().clone()
            applied.revert()
        assert any("changed in place after the policy was applied" in m for m in _messages(record)), _messages(record)
        assert model.lin.weight.dtype == torch.float32
        assert torch.equal(model.lin.weight, written.float())  # the history the app wrote, not the weight before apply

    @pytest.mark.parametrize("policy", [BF16, FP16])
    @pytest.mark.parametrize("convert", ["half", "bfloat16", "float"])
    def test_a_conversion_of_the_model_is_not_a_write(self, policy, convert):
        model = _Writes(lambda w: None)
        original = model.lin.weight.detach().clone()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with mixprec.apply(model, policy):
                getattr(model, convert)()
                model(X.to(model.lin.weight.dtype))
        assert torch.equal(model.lin.weight, original)


class _Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(8, 8)
        self.dec = self.enc  # one module, two names
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.dec(torch.relu(self.enc(x))))


class _SharedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        block = nn.Sequential(nn.Linear(8, 8), nn.GELU())
        self.a = nn.ModuleDict({"block": block})
        self.b = nn.ModuleDict({"block": block})  # a block shared by two parents

    def forward(self, x):
        return self.b["block"](self.a["block"](x))


ALIAS_CASES = [
    (_Shared, "enc", "enc.weight"), (_Shared, "dec", "enc.weight"), (_Shared, "d*", "enc.weight"),
    (_SharedBlock, "a.block.0", "a.block.0.weight"), (_SharedBlock, "b.block.0", "a.block.0.weight"),
    (_SharedBlock, "b", "a.block.0.weight"), (_SharedBlock, "b.block", "a.block.0.weight"),
]


class TestAliases:
    """A rule matches a module under every name it is reachable by."""

    @pytest.mark.parametrize("model_type,name,weight", ALIAS_CASES)
    @pytest.mark.parametrize("field,expected", [({"keep_fp32": True}, torch.float32), ({"storage": "fp16"}, torch.float16)])
    def test_a_rule_naming_any_alias_matches_the_shared_module(self, model_type, name, weight, field, expected):
        model = model_type()
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            with mixprec.apply(model, Policy((Rule("*", storage="bf16"), Rule(name, **field)))) as applied:
                assert model.get_parameter(weight).dtype == expected
                assert torch.isfinite(model(X)).all()
                plans = {p.qualname: p for p in applied.plans}
                shared = plans[weight.rpartition(".")[0]]
                assert shared.aliases  # the other name is known
        assert not [m for m in _messages(record) if "matches no module" in m]

    @pytest.mark.parametrize("first,second", [("enc", "dec"), ("dec", "enc")])
    def test_rules_that_disagree_under_two_names_follow_policy_order(self, first, second):
        model = _Shared()
        policy = Policy((Rule(first, storage="fp16"), Rule(second, storage="bf16")))
        with mixprec.apply(model, policy) as applied:
            assert model.enc.weight.dtype == torch.bfloat16
            assert {p.qualname: p for p in applied.plans}["enc"].decided_by["storage"] == 1
        pinned = Policy((Rule(first, keep_fp32=True), Rule(second, storage="bf16")))
        with mixprec.apply(model, pinned):
            assert model.enc.weight.dtype == torch.float32  # a keep-fp32 pin wins whatever the order


LAZY = {
    "LazyLinear": lambda: nn.Sequential(nn.LazyLinear(4), nn.ReLU()),
    "LazyConv1d": lambda: nn.Sequential(nn.LazyConv1d(4, 3)),
    "LazyBatchNorm1d": lambda: nn.Sequential(nn.Linear(8, 8), nn.LazyBatchNorm1d()),
    "nested": lambda: nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.LazyLinear(2)))),
}
LAZY_INPUTS = {"LazyConv1d": torch.randn(2, 3, 8)}


class TestLazy:
    @pytest.mark.parametrize("kind", sorted(LAZY))
    @pytest.mark.parametrize("policy", [BF16, BF16_FP32_COMPUTE])
    def test_an_uninitialised_lazy_module_is_refused_until_its_first_forward(self, kind, policy):
        model = LAZY[kind]()

        def hooks():  # a lazy module's own initialising hook is among them
            return [(dict(m._forward_hooks), dict(m._forward_pre_hooks), "forward" in vars(m)) for m in model.modules()]

        before = hooks()
        with pytest.raises(mixprec.ApplyError, match=r"uninitialised lazy parameter.*nothing was changed\. Run one forward"):
            mixprec.apply(model, policy)
        assert hooks() == before and not any("_mixprec_applied" in vars(m) for m in model.modules())
        x = LAZY_INPUTS.get(kind, X)
        model(x)  # initialises the parameters
        with mixprec.apply(model, policy):
            model(x)


class TestNumerics:
    """A numeric setting the app changes itself after apply stays as the app set it."""

    FIELDS = [("matmul", "medium", "high"), ("matmul", "high", "highest"), ("conv_tf32", False, True),
              ("fp16_reduced_precision_reduction", False, True), ("bf16_reduced_precision_reduction", False, True)]

    @staticmethod
    def _set(field, value):
        if field == "matmul":
            torch.set_float32_matmul_precision(value)
        elif field == "conv_tf32":
            torch.backends.cudnn.allow_tf32 = value
        else:
            setattr(torch.backends.cuda.matmul, "allow_" + field, value)

    @pytest.mark.parametrize("field,policy_value,app_value", FIELDS)
    def test_revert_keeps_the_apps_own_change_and_says_so(self, field, policy_value, app_value):
        before = backends.current_settings()
        policy = Policy((Rule("*", storage="bf16"),), NumericSettings(**{field: policy_value}), name="p")
        model = _mlp()
        applied = mixprec.apply(model, policy)
        assert getattr(backends.current_settings(), field) == policy_value
        self._set(field, app_value)
        with pytest.warns(UserWarning, match=rf"kept {field}={app_value!r} \(set by the application after it started; "
                                             rf"it set {policy_value!r}"):
            applied.revert()
        after = backends.current_settings()
        assert getattr(after, field) == app_value
        assert after.replace(**{field: getattr(before, field)}) == before  # everything else as before apply

    @pytest.mark.parametrize("field,policy_value,app_value", FIELDS)
    def test_without_a_change_by_the_app_revert_puts_back_exactly(self, field, policy_value, app_value):
        before = backends.snapshot()
        model = _mlp()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with mixprec.apply(model, Policy((Rule("*", storage="bf16"),), NumericSettings(**{field: policy_value}))):
                with mixprec.numerics(**{field: app_value}):  # an owner of its own: ends exactly
                    pass
        assert backends.snapshot() == before

    def test_a_re_apply_keeps_the_numerics_and_the_apps_change_in_force(self):
        policy = Policy((Rule("*", storage="bf16"),), NumericSettings(matmul="medium"), name="p")
        model = _mlp()
        applied = mixprec.apply(model, policy)
        torch.set_float32_matmul_precision("high")
        applied.reapply(Policy(policy.rules + (Rule("0", keep_fp32=True),), policy.numerics, name="p"))
        assert torch.get_float32_matmul_precision() == "high" and model[0].weight.dtype == torch.float32
        with pytest.warns(UserWarning, match="kept matmul='high'"):
            applied.revert()
        assert torch.get_float32_matmul_precision() == "high"


_NO_WEIGHTS = '''
import torch
from torch import nn
from mixprec.pipelines import EmbeddingOutput, Pipeline


class Mix(nn.Module):
    def __init__(self):
        super().__init__()
        {buffers}

    def forward(self, x):
        return torch.tanh(x @ x.transpose(-1, -2))


class NoWeights(Pipeline):
    name = "no-weights"
    output_kind = "embedding"

    def __init__(self):
        super().__init__({"net": Mix()})

    def _example_inputs(self, batch, seed):
        return torch.randn(batch, 8, 8, generator=torch.Generator().manual_seed(seed))

    def _run(self, inputs):
        return EmbeddingOutput(output=self.components["net"](inputs).float().flatten(1))


def build(size="default", seed=0):
    return NoWeights()
'''


class TestNoWeights:
    @pytest.mark.parametrize("buffers,weights", [("pass", "weights none (the model holds no weights)"),
                                                 ('self.register_buffer("steps", torch.arange(4))', "weights 100% of fp32")])
    def test_tune_on_a_model_without_weights_says_so_and_writes_its_policy(self, buffers, weights, tmp_path, clean_env):
        from mixprec.cli import app
        from mixprec.tuning import tuner
        from mixprec.tuning.evaluators import InProcessEvaluator

        (tmp_path / "f.py").write_text(_NO_WEIGHTS.replace("{buffers}", buffers))
        clean_env.chdir(tmp_path)

        class InProcess(InProcessEvaluator):  # the tuner's own search, measured in this process
            def close(self) -> None:
                """Nothing to stop: no worker process."""

        def evaluator(spec, size, *, seeds, repeat, device, progress=None):
            from mixprec.pipelines import get

            pipe = get(spec, size=size)
            return InProcess(pipe, lambda seed: pipe.example_inputs(1, seed), pipe.run, seeds=seeds, repeat=repeat)

        clean_env.setattr(tuner, "WorkerEvaluator", evaluator)
        result = CliRunner().invoke(app, ["tune", "--pipeline", "f.py:build", "--size", "test", "--budget", "8", "--seeds",
                                          "1", "--repeat", "1", "--validation-seeds", "0", "--db", "t.sqlite", "--out", "p.toml"])
        assert result.exit_code == 0, result.output
        output = " ".join(result.output.split())
        assert weights in output, output
        assert "the model holds no floating-point weights" in output
        assert Policy.load(tmp_path / "p.toml")
