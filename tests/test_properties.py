"""Property-based tests: whatever a user (or a file) hands mixprec, the answer is a clear
mixprec error or success, never another exception; nothing is half-applied; reverts are
bit-exact; the caller's objects are untouched. Example counts are bounded so the suite
stays fast."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixprec
from mixprec.device import backends
from mixprec.config import ConfigError
from mixprec.policy import Policy, PolicyError, Rule

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TREES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_SETTING_NAMES = ["MIXPREC_FLOAT32_MATMUL_PRECISION", "MIXPREC_CONV_TF32", "MIXPREC_FP16_REDUCED_PRECISION_REDUCTION",
                  "MIXPREC_BF16_REDUCED_PRECISION_REDUCTION", "MYAPP_FLOAT32_MATMUL_PRECISION", "MIXPREC_PRESET", "MIXPREC_POLICY",
                  "MIXPREC_FLOAT32_MATMUL_PRECISON"]
_VALUES = st.one_of(st.sampled_from(["highest", "high", "medium", "HIGH ", "true", "0", "yes", "off", "fast", "", "fastest"]),
                    st.text(max_size=40))


@FAST
@given(environ=st.dictionaries(st.sampled_from(_SETTING_NAMES), _VALUES, max_size=5))
def test_init_from_any_environment_applies_all_or_nothing(environ):
    before = backends.snapshot()
    try:
        resolved = mixprec.init(app="MYAPP", environ=environ, search_dir="/nonexistent-dir-for-tests", apply=True)
    except ConfigError as exc:
        assert str(exc).startswith("invalid mixprec configuration; nothing was applied")
        assert backends.snapshot() == before  # nothing half-applied
        return
    try:
        assert resolved.numeric.matmul in ("highest", "high", "medium")
    finally:
        mixprec.restore(resolved.previous)
    assert backends.snapshot() == before


_JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=12)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)
_RULE = st.fixed_dictionaries(
    {"match": st.one_of(st.sampled_from(["*", "a", "a.*", "type:Linear", "type:*Norm", "role:head", "role:x", ""]), _JSONISH)},
    optional={"storage": st.one_of(st.sampled_from(["fp32", "bf16", "fp16", "half", "int8"]), _JSONISH),
              "compute": st.one_of(st.sampled_from(["native", "fp32", "bf16"]), _JSONISH),
              "keep_fp32": st.one_of(st.booleans(), _JSONISH), "upcast_attention": st.one_of(st.booleans(), _JSONISH),
              "output_dtype": st.one_of(st.sampled_from(["fp32", "bf16"]), _JSONISH), "reason": _JSONISH,
              "optional": _JSONISH, "bogus": _JSONISH},
)


@FAST
@given(data=st.fixed_dictionaries({}, optional={"version": st.one_of(st.just(1), _JSONISH), "name": _JSONISH,
                                                 "rules": st.one_of(st.lists(_RULE, max_size=4), _JSONISH),
                                                 "numerics": _JSONISH, "model_declarations": _JSONISH, "extra": _JSONISH}))
def test_policy_from_any_table_is_a_policy_or_a_policy_error(data):
    try:
        policy = Policy.from_dict(data, "generated.toml")
    except PolicyError as exc:
        assert "generated.toml" in str(exc)
        return
    assert Policy.from_toml(policy.to_toml()) == policy
    assert Policy.from_json(policy.to_json()) == policy


@FAST
@given(text=st.one_of(st.text(max_size=30), st.builds(lambda m, o, n: f"{m}{o}{n}",
                                                        st.sampled_from(["sqnr", "snr", "psnr", "cosine", "sqrn", ""]),
                                                        st.sampled_from([">=", ">", "=", "<=", ""]),
                                                        st.sampled_from(["30", "1e999", "-inf", "nan", "0.999", "x"]))))
def test_bounds_parse_to_a_finite_bound_or_a_value_error(text):
    try:
        bound = mixprec.parse_bound(text)
    except ValueError as exc:
        from mixprec._quote import quote

        assert quote(text) in str(exc)  # the text as typed, clipped and with non-ASCII escaped
        return
    assert math.isfinite(bound.value)


# -- apply / revert on generated module trees --------------------------------------------------


class Leaf(torch.nn.Module):
    """Linear + LayerNorm with an integer step buffer and a float scale buffer."""

    def __init__(self, dim: int):
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.register_buffer("steps", torch.arange(3))
        self.register_buffer("scale", torch.full((dim,), 0.5))

    def forward(self, x):
        return self.norm(self.lin(x)) * self.scale + x


class Tree(torch.nn.Module):
    def __init__(self, children: list[torch.nn.Module], tie: bool):
        super().__init__()
        self.blocks = torch.nn.ModuleList(children)
        self.head = torch.nn.Linear(children[0].lin.in_features, children[0].lin.in_features)
        if tie:
            self.head.weight = children[0].lin.weight  # tied weights

    def forward(self, batch):
        x = batch["x"]
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@st.composite
def trees(draw):
    dim = 4
    n = draw(st.integers(1, 4))
    blocks = [Leaf(dim) for _ in range(n)]
    if n > 1 and draw(st.booleans()):
        blocks[-1] = blocks[0]  # a shared submodule, called twice
    tree = Tree(blocks, tie=draw(st.booleans()))
    names = ["*", "blocks", "blocks.0", "blocks.*.norm", "head", "type:LayerNorm", "type:Linear", "role:head"]
    rules = draw(st.lists(st.builds(lambda m, s, c, k: (m, s, c, k), st.sampled_from(names),
                                    st.sampled_from([None, "fp32", "bf16", "fp16"]), st.sampled_from([None, "native", "fp32"]),
                                    st.sampled_from([None, True])), min_size=1, max_size=4))
    return tree, rules


@TREES
@given(case=trees(), keep=st.sampled_from(["cpu", "disk"]))
def test_apply_then_revert_is_bit_exact_on_any_tree(case, keep):
    torch.manual_seed(0)
    tree, raw_rules = case
    rules = []
    for match, storage, compute, pin in raw_rules:
        if storage is None and compute is None and pin is None:
            storage = "bf16"
        rules.append(Rule(match, storage=storage, compute=compute, keep_fp32=pin, optional=True))
    before = {k: (v.dtype, v.clone()) for k, v in list(tree.state_dict(keep_vars=True).items())}
    flags = backends.snapshot()
    x = torch.randn(2, 4)
    batch = {"x": x}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # shared tensors planned in two dtypes warn
        applied = mixprec.apply(tree, Policy(tuple(rules)), keep_original=keep)
    try:
        with torch.no_grad():
            out = tree(batch)
        assert out.dtype == torch.float32
        assert batch["x"] is x and x.dtype == torch.float32  # the caller's objects are untouched
        # A second policy on any part of the applied tree is refused and changes nothing.
        part = tree.blocks[len(tree.blocks) - 1]
        state = {k: (v.dtype, v.clone()) for k, v in tree.state_dict().items()}
        with pytest.raises(mixprec.ApplyError):
            mixprec.apply(part, Policy((Rule("*", storage="fp16"),)))
        assert all(v.dtype == state[k][0] and torch.equal(v, state[k][1]) for k, v in tree.state_dict().items())
    finally:
        applied.revert()
    after = tree.state_dict(keep_vars=True)
    for key, (dtype, value) in before.items():
        assert after[key].dtype == dtype and torch.equal(after[key], value), key
    assert backends.snapshot() == flags
    assert not any(m._forward_hooks or m._forward_pre_hooks or "forward" in m.__dict__ for m in tree.modules())
