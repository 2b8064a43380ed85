"""What every real-model combination checks, shared by the test files of this folder.

One combination is (model, policy, probe). :func:`check_combination`:

1. takes the model's fp32 output, recorded once per module by the model's fixture
   (the fp32 run happens *before* any snapshot: some models fill buffers lazily on
   their first call);
2. snapshots every parameter and buffer (dtype, device, requires_grad, exact values),
   every module's forward hooks, the global hooks, the torch-function mode stack and
   torch's numeric flags (``mixprec.device.backends.snapshot()``);
3. ``with mixprec.apply(target, policy):`` checks that the weights are stored as the
   resolved plan says and the policy's numerics are in force, then runs the model end
   to end (and the model's optional extra checks inside the block);
4. after the block checks that the revert is bit-exact (``torch.equal`` and same dtype
   for every tensor), that no hook, patch or mode is left, and that the flags equal
   the snapshot; this is checked even when the run raised, then the error is re-raised;
5. compares the output with fp32 with a bound chosen by the precision *tier* the
   policy resolves to on this hardware (see :data:`TIERS`).
"""

from __future__ import annotations

import math
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

import mixprec
from mixprec import FallbackStore, Policy, Rule
from mixprec.casting.fp8 import FP8_DTYPES
from mixprec.casting.fp8plan import fp8_layer
from mixprec.device import backends
from mixprec.diagnose.dtype_errors import is_dtype_error

__all__ = [
    "POLICIES", "PROBES", "REPEATS", "TIERS", "Case", "combos", "make_policy", "expected_tier",
    "check_combination", "plan_problems", "sqnr_db", "compare_waveform", "compare_generation",
    "check_fp32_after_revert", "check_pins_own_weights", "output_differences", "GUARDED", "check_guarded",
]

#: Policies every model runs under. The presets are resolved against the probe.
POLICIES: tuple[str, ...] = ("quality", "balanced", "fast", "memory", "bf16-native", "fp16-storage-fp32-compute", "fp8")
#: "measured": this machine's probe; "bf16-fast": this machine with bf16 measured fast.
PROBES: tuple[str, ...] = ("measured", "bf16-fast")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

#: What a correct run of each tier may differ from fp32 by.
#:
#: * ``exact``: fp32 weights, fp32 compute, matmul precision "highest": bit-identical.
#: * ``fp32-math``: fp32 weights and compute, reduced float32 matmul precision ("high" /
#:   "medium"): at most a few ulps of drift per matmul on a CPU.
#: * ``rounded-weights``: 16-bit *stored* weights, fp32 compute: only the weights are
#:   rounded (bf16: ~3 significant digits).
#: * ``16bit-compute``: activations in bf16/fp16 too.
#: * ``fp8-weights``: 8-bit weights with a scale per output channel, bf16 compute (3
#:   mantissa bits: the tiny random T5 measured 0.7 std of logit error in one forward,
#:   the same as rounding its Linear weights to fp8 by hand and computing in fp32).
#:
#: Waveforms and images: minimum SQNR in dB (a NaN, a wrong scale or garbage gives
#: <= 0 dB; the correct runs measured here give 20-60 dB, see the report). Token
#: models: maximum error of the per-step logits, relative to the spread (std) of the
#: fp32 logits, on the steps with the same prefix (random logits: error ~3 std).
TIERS: dict[str, dict[str, float]] = {
    "exact": {"sqnr_db": math.inf, "logit_err": 0.0},
    "fp32-math": {"sqnr_db": 30.0, "logit_err": 0.05},
    "rounded-weights": {"sqnr_db": 20.0, "logit_err": 0.2},
    "16bit-compute": {"sqnr_db": 12.0, "logit_err": 0.35},
    "fp8-weights": {"sqnr_db": 6.0, "logit_err": 1.5},
}


def make_policy(name: str, hw) -> Policy:
    if name in mixprec.PRESETS:
        return mixprec.preset(name, hardware=hw)
    if name == "bf16-native":
        return Policy(rules=(Rule("*", storage="bf16"),))
    if name == "fp16-storage-fp32-compute":
        return Policy(rules=(Rule("*", storage="fp16", compute="fp32"),))
    if name == "fp8":
        return Policy(rules=(Rule("*", storage="fp8"),))
    raise KeyError(name)


def expected_tier(name: str, hw) -> str:
    """The tier a policy should resolve to on ``hw``, from the preset table in docs/policies.md."""
    fast16 = [d for d in ("bf16", "fp16") if hw.dtypes[d].klass == "fast"]
    if name == "quality":
        return "exact"
    if name in ("balanced", "fast"):
        return "16bit-compute" if fast16 else "fp32-math"
    if name == "memory":
        # 16-bit weights everywhere; native compute only where that type is not emulated.
        return "rounded-weights" if hw.dtypes["bf16"].emulated else "16bit-compute"
    if name == "bf16-native":
        return "16bit-compute"
    if name == "fp16-storage-fp32-compute":
        return "rounded-weights"
    if name == "fp8":
        return "fp8-weights"
    raise KeyError(name)


#: Combinations that repeat another one exactly: these policies do not depend on the
#: probe (quality is fp32 everywhere; the two explicit policies name their dtypes), so
#: their "bf16-fast" run resolves to the policy of their "measured" run.
REPEATS: frozenset[tuple[str, str]] = frozenset(
    (policy, "bf16-fast") for policy in ("quality", "bf16-native", "fp16-storage-fp32-compute", "fp8"))


def combos(heavy: set[tuple[str, str]] = frozenset()) -> list:
    """Every (policy, probe) pair as pytest params; ``heavy`` ones and :data:`REPEATS`
    are marked ``heavy`` (run with MIXPREC_HEAVY=1)."""
    out = []
    for policy in POLICIES:
        for probe in PROBES:
            marks = (pytest.mark.heavy,) if (policy, probe) in REPEATS or (policy, probe) in heavy else ()
            out.append(pytest.param(policy, probe, marks=marks, id=f"{policy}-{probe}"))
    return out


@dataclass
class Case:
    """A built model, how to run it, and its fp32 output.

    Attributes:
        target: what is passed to ``mixprec.apply`` (a model, or a pipeline object).
        modules: every ``nn.Module`` whose tensors and hooks are checked.
        run: runs the model end to end (seeded inside when it samples noise).
        compare: (fp32 output, output, tier) -> metrics; asserts the bound.
        reference: the fp32 output, recorded before any snapshot.
        inside: optional extra checks run inside the ``apply`` block: (case, tier) ->
            metrics (for example decoding the fp32 run's codes with the applied policy).
    """

    target: Any
    modules: dict[str, nn.Module]
    run: Callable[[], Any]
    compare: Callable[[Any, Any, str], dict[str, Any]]
    reference: Any = None
    inside: Callable[["Case", str], dict[str, Any]] | None = None
    state: dict[str, Any] = field(default_factory=dict)

    def record_reference(self) -> "Case":
        with torch.no_grad():
            self.reference = self.run()
        return self


# --- snapshots ---------------------------------------------------------------------

def tensor_state(modules: dict[str, nn.Module]) -> dict[str, tuple]:
    state = {}
    for cname, root in modules.items():
        items = list(root.named_parameters(remove_duplicate=False)) + list(root.named_buffers(remove_duplicate=False))
        for name, t in items:
            state[f"{cname}:{name}"] = (t.dtype, t.device, t.requires_grad, t.detach().clone())
    return state


def state_differences(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    problems = []
    if before.keys() != after.keys():
        problems.append(f"tensor names changed: lost {sorted(before.keys() - after.keys())[:5]}, "
                        f"new {sorted(after.keys() - before.keys())[:5]}")
    for key in before.keys() & after.keys():
        (d0, dev0, g0, v0), (d1, dev1, g1, v1) = before[key], after[key]
        if (d0, dev0, g0) != (d1, dev1, g1):
            problems.append(f"{key}: {d0}/{dev0}/grad={g0} became {d1}/{dev1}/grad={g1}")
        elif v0.layout != v1.layout:
            problems.append(f"{key}: layout {v0.layout} became {v1.layout}")
        elif v0.is_meta:  # a placeholder whose values an offload hook keeps (checked by the test that offloads)
            if v0.shape != v1.shape:
                problems.append(f"{key}: meta placeholder shape {tuple(v0.shape)} became {tuple(v1.shape)}")
        elif v0.layout != torch.strided:  # whisper's alignment_heads: a sparse buffer (no torch.equal kernel)
            if not torch.equal(v0.to_dense(), v1.to_dense()):
                problems.append(f"{key}: values of a {v0.layout} tensor changed")
        elif not torch.equal(v0, v1):
            problems.append(f"{key}: values changed (max abs diff {(v0.double() - v1.double()).abs().max().item():.3g})")
    return sorted(problems)


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
               "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called", "_backward_hooks")


def hook_state(modules: dict[str, nn.Module]) -> dict[str, Any]:
    from torch.nn.modules import module as module_mod

    state: dict[str, Any] = {}
    for cname, root in modules.items():
        for name, m in root.named_modules(remove_duplicate=False):
            entry = tuple((d, tuple(getattr(m, d, {}).keys())) for d in _HOOK_DICTS)
            patched = tuple(k for k in ("_apply", "_mixprec_applied") if k in m.__dict__)
            state[f"{cname}:{name}"] = (entry, patched)
    state["<global hooks>"] = tuple(len(getattr(module_mod, g, {})) for g in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_forward_hooks_always_called"))
    state["<torch function modes>"] = torch._C._len_torch_function_stack()
    return state


def hook_differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return sorted(f"{k}: {before.get(k)} -> {after.get(k)}" for k in before.keys() | after.keys() if before.get(k) != after.get(k))


# --- the combination ------------------------------------------------------------------

def stored_dtypes(applied) -> set[torch.dtype]:
    return {t.dtype for plan in applied.plans
            for t in list(plan.module._parameters.values()) + list(plan.module._buffers.values())
            if t is not None and t.is_floating_point()}


def float_dtypes(obj: Any, seen: set[int] | None = None) -> set[torch.dtype]:
    """Dtypes of the floating tensors in an output (tensors, tuples, lists, dicts, ModelOutputs)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return set()
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return {obj.dtype} if obj.is_floating_point() else set()
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return set().union(*(float_dtypes(o, seen) for o in obj)) if obj else set()
    return set()


def plan_problems(applied, tier: str, policy_name: str) -> list[str]:
    """Inside the block: every module's own floating tensors are stored as planned."""
    wrong = []
    storages = set()
    fp8 = applied._fp8.stored if applied._fp8 is not None else {}
    for plan in applied.plans:
        for key, t in list(plan.module._parameters.items()) + list(plan.module._buffers.items()):
            if plan.storage in FP8_DTYPES:  # its eligible weights in fp8, the rest in its compute dtype
                stored_as = fp8.get(f"{plan.qualname}.{key}".lstrip("."))
                want = FP8_DTYPES[stored_as] if stored_as else DTYPES[plan.compute_dtype]
            else:
                want = DTYPES[plan.storage]
            if t is not None and t.is_floating_point():
                storages.add(t.dtype)
                if t.dtype != want:
                    wrong.append(f"{plan.qualname or '(root)'}.{key}: {t.dtype}, planned {plan.storage}")
    problems = [f"{len(wrong)} tensors not stored as planned, e.g. {wrong[:5]}"] if wrong else []
    if tier in ("exact", "fp32-math") and not storages <= {torch.float32}:
        problems.append(f"{policy_name} should keep fp32 weights here, found {storages}")
    if tier not in ("exact", "fp32-math") and not storages & {torch.bfloat16, torch.float16}:
        problems.append(f"{policy_name} stored no weight in 16 bits: {storages}")
    if policy_name == "fp8" and not fp8 and any(fp8_layer(p.module) and p.module._parameters.get("weight") is not None
                                                for p in applied.plans):
        problems.append("fp8 stored no weight in fp8")
    # The explicit policies store everything in their type, except the modules the model
    # itself declares must stay fp32 (T5's "wo" and a force_upcast VAE under fp16).
    declared = {id(t) for p in applied.plans if p.declared for t in p.module.parameters(recurse=False)}
    undeclared = {t.dtype for p in applied.plans for t in p.module.parameters(recurse=False)
                  if t.is_floating_point() and id(t) not in declared}
    if policy_name == "bf16-native" and undeclared != {torch.bfloat16}:
        problems.append(f"bf16-native: weights stored as {undeclared}")
    if policy_name == "fp8" and not undeclared <= {torch.bfloat16, *FP8_DTYPES.values()}:
        problems.append(f"fp8: weights stored as {undeclared}")
    if policy_name == "fp16-storage-fp32-compute" and undeclared != {torch.float16}:
        problems.append(f"fp16-storage-fp32-compute: weights stored as {undeclared}")
    if tier in ("exact", "fp32-math", "rounded-weights"):
        native16 = [p.qualname for p in applied.plans if p.compute_dtype != "fp32"]
        if native16:
            problems.append(f"{policy_name} computes in 16 bits on {native16[:3]} (tier {tier})")
    return problems


def tmp_store() -> Path:
    """A fresh fallback store, so no combination inherits another's pins."""
    return Path(tempfile.mkdtemp(prefix="mixprec-realmodels-")) / "fallbacks.json"


def check_combination(case: Case, policy_name: str, hw, record_property, *, guard: bool = False) -> dict[str, Any]:
    """Run one (model, policy, probe) combination; see the module docstring.

    With ``guard=True`` the run is watched from the start by
    ``mixprec.guard(on_nonfinite="fallback")`` (a fresh fallback store), as an app would
    run it; any pin it makes must be narrower than a component.
    """
    assert case.reference is not None, "the fixture must record the fp32 output first"
    policy = make_policy(policy_name, hw)
    tier = expected_tier(policy_name, hw)
    tensors_before = tensor_state(case.modules)
    hooks_before = hook_state(case.modules)
    flags_before = backends.snapshot()

    metrics: dict[str, Any] = {"tier": tier}
    error: BaseException | None = None
    planned: list[str] = []
    stored: set[torch.dtype] = set()
    out = None
    with torch.no_grad():
        try:
            with mixprec.apply(case.target, policy) as applied:
                # Checked after the run, so that a run that raises reports its own error.
                planned = plan_problems(applied, tier, policy_name)
                stored = stored_dtypes(applied)
                if policy.numerics is not None and torch.get_float32_matmul_precision() != policy.numerics.matmul:
                    planned.append(f"matmul precision {torch.get_float32_matmul_precision()!r} inside the block, "
                                   f"policy says {policy.numerics.matmul!r}")
                watcher = None
                if guard:
                    watcher = mixprec.guard(applied, on_nonfinite="fallback", store=FallbackStore(tmp_store()), hardware=hw)
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        out = case.run()
                    if watcher is not None:
                        watcher.remove()
                        metrics["guard pins"] = sorted(watcher.pins) or "none"
                        if any(m in applied.components or m == "" for m in watcher.pins):
                            planned.append(f"guard fallback pinned a whole component: {sorted(watcher.pins)}")
                except RuntimeError as exc:
                    if watcher is not None:
                        watcher.remove()
                        raise  # the guard was already watching and could not fix it
                    if not is_dtype_error(exc):
                        raise
                    # The model's own code reads a weight's dtype (VITS builds its attention
                    # mask in embed_tokens.weight.dtype): the guard's fallback must find a pin
                    # narrower than the whole component, and the run must then succeed.
                    metrics["apply alone"] = f"raised {str(exc).splitlines()[0]}"
                    fallback = mixprec.guard(applied, on_nonfinite="fallback", store=FallbackStore(tmp_store()))
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        out = case.run()
                    fallback.remove()
                    metrics["guard pins"] = sorted(fallback.pins)
                    wide = [m for m in fallback.pins if m in applied.components or m == ""]
                    if wide or not fallback.pins:
                        planned.append(f"guard fallback pinned {sorted(fallback.pins) or 'nothing'}: expected a module narrower than a component")
                if case.inside is not None:
                    metrics.update(case.inside(case, tier))
        except BaseException as exc:  # checked below, then re-raised
            error = exc

    problems = state_differences(tensors_before, tensor_state(case.modules))
    problems += hook_differences(hooks_before, hook_state(case.modules))
    flags_after = backends.snapshot()
    if flags_after != flags_before:
        problems.append(f"torch numeric flags not restored: {flags_before} -> {flags_after}")
    if error is not None:
        record_property("metrics", f"{tier}: raised {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                        + f" [model code: {innermost_frame(error, _MODEL_CODE)}; innermost: {innermost_frame(error)}]"
                        + (f"; revert problems: {len(problems)}" if problems else "; revert clean")
                        + (f"; plan problems: {planned}" if planned else ""))
        if problems:
            raise AssertionError(f"revert after the run raised {type(error).__name__} is not clean: {problems[:8]}") from error
        raise error
    assert not problems, f"revert is not bit-exact / hooks or flags left over ({len(problems)}): {problems[:8]}"
    if planned:
        record_property("metrics", f"{tier}: plan problems: {planned}")
    assert not planned, f"inside the apply block: {planned}"

    try:
        # The caller gets fp32 or the 16-bit type the policy stores in; never another one.
        allowed = {torch.float32} | stored
        wrong = float_dtypes(out) - allowed
        assert not wrong, f"output has {sorted(map(str, wrong))} tensors; the policy stores {sorted(map(str, stored))}"
        metrics.update(case.compare(case.reference, out, tier))
    except AssertionError as exc:
        metrics["failed"] = str(exc).splitlines()[0]
        raise
    finally:
        record_property("metrics", ", ".join(f"{k}={_fmt(v)}" for k, v in metrics.items()))
    return metrics


def output_differences(ref: Any, out: Any, path: str = "output") -> list[str]:
    """Where two outputs differ, bit for bit: tensors (values and dtype), numpy arrays,
    dicts, sequences, dataclasses and plain objects' attributes; floats equal when both
    are NaN."""
    import dataclasses

    import numpy as np

    if isinstance(ref, torch.Tensor) or isinstance(out, torch.Tensor):
        if not (isinstance(ref, torch.Tensor) and isinstance(out, torch.Tensor)):
            return [f"{path}: {type(ref).__name__} vs {type(out).__name__}"]
        if ref.dtype != out.dtype or ref.shape != out.shape:
            return [f"{path}: {ref.dtype}{tuple(ref.shape)} vs {out.dtype}{tuple(out.shape)}"]
        return [] if torch.equal(ref, out) or (ref.is_floating_point() and torch.equal(ref.isnan(), out.isnan())
                                              and torch.equal(ref.nan_to_num(), out.nan_to_num())) else [f"{path}: values differ"]
    if isinstance(ref, np.ndarray):
        return [] if isinstance(out, np.ndarray) and np.array_equal(ref, out, equal_nan=ref.dtype.kind == "f") else [f"{path}: arrays differ"]
    if type(ref) is not type(out):
        return [f"{path}: {type(ref).__name__} vs {type(out).__name__}"]
    if isinstance(ref, dict):
        if ref.keys() != out.keys():
            return [f"{path}: keys {sorted(map(str, ref))} vs {sorted(map(str, out))}"]
        return [d for k in ref for d in output_differences(ref[k], out[k], f"{path}[{k!r}]")]
    if isinstance(ref, (list, tuple)):
        if len(ref) != len(out):
            return [f"{path}: length {len(ref)} vs {len(out)}"]
        return [d for i, (a, b) in enumerate(zip(ref, out)) for d in output_differences(a, b, f"{path}[{i}]")]
    if isinstance(ref, float):
        return [] if ref == out or (math.isnan(ref) and math.isnan(out)) else [f"{path}: {ref!r} vs {out!r}"]
    if dataclasses.is_dataclass(ref):
        return [d for f in dataclasses.fields(ref)
                for d in output_differences(getattr(ref, f.name), getattr(out, f.name), f"{path}.{f.name}")]
    if isinstance(ref, (str, bytes, int, bool, type(None))):
        return [] if ref == out else [f"{path}: {ref!r} vs {out!r}"]
    if hasattr(ref, "__dict__"):
        return output_differences(vars(ref), vars(out), path)
    return [] if ref == out else [f"{path}: {ref!r} vs {out!r}"]


def check_fp32_after_revert(case: Case) -> None:
    """The first run after a revert equals the fp32 run recorded before any apply, bit for bit."""
    with torch.no_grad():
        out = case.run()
    diffs = output_differences(case.reference, out)
    assert not diffs, f"the fp32 run after revert differs from the one before apply ({len(diffs)}): {diffs[:5]}"


def check_pins_own_weights(case: Case, metrics: dict[str, Any]) -> list[str]:
    """Each module the guard pinned (``metrics["guard pins"]``) owns floating weights itself
    (parameters, or buffers such as a codebook): no pin is a container or block wider than
    the module that failed. Returns the pins."""
    pins = metrics.get("guard pins", "none")
    pins = [] if pins == "none" else list(pins)
    roots = case.target if isinstance(case.target, dict) else {"": case.target}
    wide = []
    for name in pins:
        key, _, rest = name.partition(".") if "" not in roots else ("", "", name)
        try:
            module = roots[key].get_submodule(rest) if key in roots else None
        except AttributeError:
            module = None
        owned = [t for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]
                 if t.is_floating_point()] if module is not None else []
        if not owned:  # a codebook held as a buffer (EnCodec's ``embed``) is a weight too
            wide.append(f"{name} ({type(module).__name__ if module is not None else 'not found'})")
    assert not wide, f"the guard pinned modules that own no weights themselves (containers or blocks): {wide}"
    return pins


_MODEL_CODE = ("/transformers/", "/diffusers/")


def innermost_frame(error: BaseException, parts: tuple[str, ...] = ()) -> str:
    """``file:line`` of the innermost traceback frame (whose path contains one of ``parts``)."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        if not parts or any(p in frame.filename for p in parts):
            path = frame.filename
            for marker in ("site-packages/", "/work/main/"):
                if marker in path:
                    path = path.split(marker, 1)[1]
            return f"{path}:{frame.lineno} ({frame.name})"
    return "none"


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# --- comparisons ----------------------------------------------------------------------

def sqnr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    ref, out = ref.double(), out.double()
    noise = (ref - out).pow(2).sum().item()
    signal = ref.pow(2).sum().item()
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def check_float_output(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert isinstance(out, torch.Tensor), f"{what}: expected a tensor, got {type(out).__name__}"
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)}, fp32 run gave {tuple(ref.shape)}"
    assert out.dtype in (torch.float32, torch.bfloat16, torch.float16), f"{what}: dtype {out.dtype}"
    bad = (~torch.isfinite(out)).sum().item()
    assert bad == 0, f"{what}: {bad} of {out.numel()} values are not finite"


def compare_waveform(ref: torch.Tensor, out: torch.Tensor, tier: str, what: str = "waveform",
                     allowed_dtypes: tuple[torch.dtype, ...] | None = None) -> dict[str, Any]:
    """Same shape, finite, and SQNR vs fp32 at least the tier's bound (exact: bit-identical)."""
    check_float_output(out, ref, what)
    if allowed_dtypes is not None:
        assert out.dtype in allowed_dtypes, f"{what}: dtype {out.dtype}, expected one of {allowed_dtypes}"
    sqnr = sqnr_db(ref, out)
    max_abs = (ref.double() - out.double()).abs().max().item()
    metrics = {f"{what}_sqnr_db": sqnr, f"{what}_max_abs": max_abs, f"{what}_dtype": str(out.dtype).replace("torch.", "")}
    if tier == "exact":
        assert out.dtype == ref.dtype and torch.equal(out, ref), f"{what}: quality (fp32) run differs from fp32: max abs {max_abs:.3g}"
    else:
        bound = TIERS[tier]["sqnr_db"]
        assert sqnr >= bound, f"{what}: SQNR {sqnr:.1f} dB vs fp32 < {bound} dB ({tier}); max abs error {max_abs:.3g}"
    return metrics


def logits_of(gen_out, attr: str = "logits") -> torch.Tensor:
    """(steps, rows, vocab) float32 ``logits`` (raw) or ``scores`` (processed) of a
    ``return_dict_in_generate`` output."""
    logits = getattr(gen_out, attr, None)
    assert logits, f"generate returned no per-step {attr}"
    return torch.stack([l.float() for l in logits])


def compare_generation(ref, out, tier: str, *, vocab_size: int, tokens_ref: torch.Tensor | None = None,
                       tokens_out: torch.Tensor | None = None, attr: str = "logits") -> dict[str, Any]:
    """Greedy generation vs fp32.

    Tokens: same shape, valid ids; agreement is reported (random-weight models have
    near-tied logits, so one flipped token changes the rest of a greedy sequence).
    Logits: finite, and on every step up to and including the first divergence (same
    prefix, so the same computation) within the tier's bound relative to the spread of
    the fp32 logits. The flipped token at the first divergence must have been within
    twice that error of the fp32 choice (a near tie), not an arbitrary token.
    ``attr="scores"`` compares the processed scores greedy search picks from (needed
    where a logits processor such as classifier-free guidance combines rows).
    """
    tokens_ref = ref.sequences if tokens_ref is None else tokens_ref
    tokens_out = out.sequences if tokens_out is None else tokens_out
    assert tokens_out.shape == tokens_ref.shape, f"tokens: shape {tuple(tokens_out.shape)} vs fp32 {tuple(tokens_ref.shape)}"
    assert not tokens_out.is_floating_point(), tokens_out.dtype
    assert int(tokens_out.min()) >= 0 and int(tokens_out.max()) <= vocab_size, "token ids out of the vocabulary"
    l_ref, l_out = logits_of(ref, attr), logits_of(out, attr)
    assert l_out.shape == l_ref.shape, f"logits: shape {tuple(l_out.shape)} vs fp32 {tuple(l_ref.shape)}"
    bad = (torch.isnan(l_out) | torch.isposinf(l_out)).sum().item()
    assert bad == 0, f"{attr}: {bad} of {l_out.numel()} values are NaN or +inf"
    masked = torch.isneginf(l_ref)  # tokens a logits processor excluded
    assert torch.equal(masked, torch.isneginf(l_out)), f"{attr}: different tokens masked than in the fp32 run"
    l_ref, l_out = l_ref.masked_fill(masked, 0.0), l_out.masked_fill(masked, 0.0)

    steps = l_ref.shape[0]
    chosen_ref, chosen_out = l_ref.argmax(-1), l_out.argmax(-1)  # (steps, rows): greedy picks
    agree = (tokens_out == tokens_ref).float().mean().item()
    step_diverged = (chosen_ref != chosen_out).any(dim=1)
    first = int(step_diverged.nonzero()[0, 0]) if step_diverged.any() else steps
    upto = min(first + 1, steps)
    scale = l_ref[:upto].std().item()
    err = (l_out[:upto] - l_ref[:upto]).abs().max().item() / scale
    metrics = {"token_agreement": agree, "first_divergence": first if first < steps else "none",
               "steps": steps, "logit_err_rel": err}
    if tier == "exact":
        assert torch.equal(tokens_out, tokens_ref) and torch.equal(l_out, l_ref), \
            f"quality (fp32) run differs from fp32: agreement {agree:.2f}, logit error {err:.3g} std"
        return metrics
    bound = TIERS[tier]["logit_err"]
    assert err <= bound, f"logits differ from fp32 by {err:.3f} std (> {bound}, {tier}) on the {upto} steps with the fp32 prefix"
    if first < steps:
        rows = (chosen_ref[first] != chosen_out[first]).nonzero()[:, 0]
        gap = (l_ref[first, rows, chosen_ref[first, rows]] - l_ref[first, rows, chosen_out[first, rows]]).max().item()
        assert gap <= 2 * err * scale + 1e-6, f"step {first}: picked a token {gap / scale:.3f} std below the fp32 choice"
        metrics["flip_gap_rel"] = gap / scale
    return metrics


#: The (policy, probe) pairs the real apps run under the guard: 16-bit compute, 16-bit storage
#: with fp32 compute, and two presets.
GUARDED = [("bf16-native", "measured"), ("fp16-storage-fp32-compute", "measured"), ("fast", "bf16-fast"),
           ("memory", "measured"), ("fp8", "measured")]


def check_guarded(case: Case, policy: str, hw: Any, record_property: Callable[..., None]) -> None:
    """One guarded combination: it runs (:func:`check_combination`), every pin owns weights
    itself, and the first fp32 run after revert equals the one before apply."""
    metrics = check_combination(case, policy, hw, record_property, guard=True)
    check_pins_own_weights(case, metrics)
    check_fp32_after_revert(case)
