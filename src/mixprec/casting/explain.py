"""What a policy does to each module, before or after it is applied: the table
``mixprec explain`` prints (:func:`explain`) and the precision pitfalls it warns about.
"""

from __future__ import annotations

from typing import Any

import torch

from mixprec.casting.fp8 import FP8_DTYPES
from mixprec.casting.fp8plan import Fp8Plan
from mixprec.casting.hooks import own_tensors
from mixprec.casting.kinds import stored_elements
from mixprec.casting.offload import describe_offloaded
from mixprec.casting.targets import DTYPES, components_of
from mixprec.casting.upcast import is_attention_module, sdpa_overflows
from mixprec.policy.roles import dtype_property_source
from mixprec.policy.tree import called_children, first_weight_owner, token_decoder
from mixprec.policy import ModulePlan, Policy, resolve_modules
from mixprec.policy.select import UnmatchedRule, unmatched_rules

__all__ = ["explain", "explain_warnings", "explain_unmatched", "explain_rows", "dtype_read_warnings", "compile_advice"]


def _island_share(plan: ModulePlan, total: int) -> str:
    """What an fp32 island holds, as a figure for its reason: its share of the weights."""
    own = sum(stored_elements(p) for p in plan.module.parameters())
    return f" ({own / total:.2%} of the weights; casts at its edges on every call)" if total and own else ""


def _fp8_storage(plan: ModulePlan, fp8: Fp8Plan) -> tuple[str, str]:
    """What an fp8-planned module actually stores (fp8 for an eligible weight, else its compute
    dtype) and, for a weight kept out of fp8, why."""
    storages = {fp8.tensor_storage(plan, key, t) for key, t in own_tensors(plan.module) if t.is_floating_point()}
    kept = [f"{name.rpartition('.')[2]} kept in {plan.compute_dtype}: {why}" for name, why in fp8.kept.items()
            if name.rpartition(".")[0] == plan.qualname]
    shown = plan.storage if plan.storage in storages else plan.compute_dtype
    return shown, "; ".join(kept)


def explain_rows(plans: list[ModulePlan], policy: Policy, fp8: Fp8Plan | None = None) -> list[dict[str, Any]]:
    """One row per module (see :func:`explain`); ``fp8``: the apply's fp8 plan, where there is one."""
    rows = []
    mixed = any(p.storage != "fp32" for p in plans)
    if fp8 is None and any(p.storage in FP8_DTYPES for p in plans):
        bare = next((p for p in plans if p.qualname == ""), None)  # a bare model: one component, unprefixed names
        roots = {"": bare.module} if bare is not None else {p.qualname: p.module for p in plans if "." not in p.qualname}
        fp8 = Fp8Plan(roots, plans, policy)
    total = sum(stored_elements(p) for p in {id(t): t for plan in plans for t in plan.module.parameters(recurse=False)}.values())
    offloaded = describe_offloaded(p.module for p in plans)
    for plan in plans:
        index = plan.decided_by.get("storage")
        rule = policy.rules[index] if index is not None else None
        attention = ""
        if plan.upcast_attention and is_attention_module(plan.module):
            attention = "upcast"
            dtype = DTYPES[plan.compute_dtype]
            if dtype in (torch.float16, torch.bfloat16) and not sdpa_overflows("cpu", dtype):
                attention = "upcast (SDPA path: not needed here, 16-bit SDPA measured finite; only eager paths upcast)"
        if plan.declared is not None:
            rule_text, reason = f"model: {plan.declared}", "the model's own precision declaration"
        else:
            rule_text = f"#{index} {rule.match}" if rule is not None else "default (fp32)"
            reason = rule.reason if rule is not None else ""
            if mixed and rule is not None and plan.compute_dtype == "fp32" and (rule.keep_fp32 or rule.compute == "fp32"):
                reason += _island_share(plan, total)
        storage = plan.storage
        if fp8 is not None and storage in FP8_DTYPES:
            storage, kept = _fp8_storage(plan, fp8)
            reason = "; ".join(r for r in (reason, kept) if r)
        reason = "; ".join(r for r in (reason, offloaded.get(id(plan.module), "")) if r)
        rows.append({
            "module": plan.qualname or "(root)",
            "type": plan.type_name,
            "storage": storage,
            "compute": plan.compute_dtype,
            "keep_fp32": plan.keep_fp32,
            "attention": attention,
            "output_dtype": plan.output_dtype,
            "rule": rule_text,
            "reason": reason,
        })
    return rows


def dtype_read_warnings(plans: list[ModulePlan]) -> list[str]:
    """Where app code that reads a module's dtype sees a 16-bit type.

    Models commonly define ``self.dtype`` as ``next(self.parameters()).dtype`` and cast
    their inputs to it, sometimes before ops with no 16-bit kernel (``torch.fft``); apps
    cast their own math to it too (a sampler's latents, an ODE solver's state, noise,
    timesteps). For each component and each module it calls directly, warn when the
    module that dtype is read from is stored in a 16-bit type:

    * computing in fp32 from those weights (``compute="fp32"``), the app's code casts to
      16 bits what the policy meant to keep in fp32;
    * computing natively in 16 bits, the app's own math that follows the model's dtype
      runs in 16 bits as well, which the policy does not show.
    """
    by_id = {id(p.module): p for p in plans}
    warnings_out: list[str] = []
    for root in (p for p in plans if "." not in p.qualname):
        reads: dict[bool, list[tuple[str, str, str]]] = {True: [], False: []}  # keyed by "computes in fp32"
        callees = [by_id[id(m)] for m in called_children(root.module) if id(m) in by_id and m._modules]
        for plan in (root, *callees):
            own = dtype_property_source(plan.module)  # the model's own dtype property, if any
            owner = own[1] if own is not None else first_weight_owner(plan.module)
            owner_plan = by_id.get(id(owner)) if owner is not None else None
            if owner_plan is not None and owner_plan.storage != "fp32":
                reads[plan.compute_dtype == "fp32"].append((plan.qualname or "(root)", owner_plan.qualname or "(root)",
                                                            owner_plan.storage))
        who = root.qualname or "(root)"
        for fp32_compute, found in reads.items():
            if not found:
                continue
            storage = found[0][2]
            where = f"{'; '.join(f'{m}.dtype reads {o}' for m, o, _ in found[:4])}{'; ...' if len(found) > 4 else ''}"
            if fp32_compute:
                warnings_out.append(
                    f"{who} computes in fp32 from {storage} weights: code that reads a module's dtype from its first "
                    f"parameter gets {storage} ({where}) and may cast its inputs to it, before ops such as torch.fft that "
                    f"have no 16-bit CPU kernel. Keep the module it reads in fp32 (a keep_fp32 rule) or run under "
                    "mixprec.guard(applied, on_nonfinite='fallback'), which finds it.")
            else:
                warnings_out.append(
                    f"{who} computes in {storage}: code that reads its dtype gets {storage} ({where}), and an app that "
                    f"casts its own math to that dtype (a sampler's latents, an ODE solver's state, noise, timesteps) "
                    f"runs it in {storage} too. Where that math needs fp32, keep it in fp32 in the app, or keep the "
                    "module the dtype is read from in fp32 (a keep_fp32 rule).")
    return warnings_out


def explain(target: Any, policy: Policy) -> list[dict[str, Any]]:
    """For every module: its resolved storage and compute dtype and the rule that decided it."""
    comps, _ = components_of(target)
    plans, _ = resolve_modules(comps, policy)
    return explain_rows(plans, policy)


def explain_warnings(target: Any, policy: Policy) -> list[str]:
    """What :func:`explain` should warn about for ``policy`` on ``target`` (see :func:`dtype_read_warnings`)."""
    comps, _ = components_of(target)
    plans, _ = resolve_modules(comps, policy)
    return dtype_read_warnings(plans)


def explain_unmatched(target: Any, policy: Policy) -> list[UnmatchedRule]:
    """The rules of ``policy`` that match no module of ``target``, with the closest names
    (what :func:`mixprec.apply` warns about; see :func:`mixprec.policy.select.summarise_unmatched`)."""
    comps, _ = components_of(target)
    plans, indices = resolve_modules(comps, policy)
    return unmatched_rules(plans, policy, indices)


def compile_advice(target: Any, policy: Policy, device_type: str) -> list[str]:
    """What compiling does for the components that decode token by token, and where CUDA graphs would pay.

    Under a compile setting, a transformers decoder that compiles whole decodes on a static
    key/value cache (:mod:`mixprec.casting.decode`: one compiled step for every position);
    another decoder keeps its own cache, whose growing length may recompile. Without one,
    on a CUDA device: a decode step launches hundreds of small kernels for one token, so the
    launches, not the arithmetic, are its time, and a 16-bit type alone gains little there;
    replaying the step as a CUDA graph (compile mode ``reduce-overhead``) removes them. On a
    CPU, compiling is offered as something to measure (``mixprec bench --configs fast,fast+compile``).
    """
    from mixprec.casting.decode import StaticDecode

    comps, _ = components_of(target)
    advice = []
    for name, root in comps.items():
        decoder = token_decoder(root)
        if decoder is None:
            continue
        what = f"{name or 'the model'} decodes token by token ({type(decoder).__name__} takes a key/value cache)"
        if policy.compile is not None:
            if StaticDecode.applies(root):
                advice.append(f"{what}: compiled with a static key/value cache, one compiled step for every position "
                              "(its own decoding loop and generate() alike)"
                              + ("; captured as CUDA graphs" if policy.compile.mode == "reduce-overhead" and device_type == "cuda" else ""))
            else:
                advice.append(f"{what}: compiled on the cache it makes itself (not a transformers 5 model that compiles "
                              "whole): a cache that grows by a position per step may recompile")
        elif device_type == "cuda":
            advice.append(f"{what}: each step is launch-bound on a GPU; capture it as CUDA graphs with the policy's "
                          "compile setting mode = \"reduce-overhead\" (mixprec.preset(..., overrides={\"compile\": "
                          "{\"mode\": \"reduce-overhead\"}}), or [compile] in a policy file)")
        elif StaticDecode.applies(root):
            advice.append(f"{what}: compiled, it would decode on a static key/value cache (one compiled step for "
                          "every position); measure it here with `mixprec bench --configs fast,fast+compile`")
    return advice
