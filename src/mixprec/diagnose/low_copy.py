"""The copy of a module (and its subtree) that the profile runs to measure its own error:
weights rounded to the policy's storage dtype, arithmetic in its compute dtype.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from mixprec.casting.fp8 import Fp8Weight, dequantise, is_fp8, quantise
from mixprec.casting.fp8plan import fp8_eligible
from mixprec.casting.hooks import cast_floats, own_tensors
from mixprec.casting.kinds import copy_module, stored_bytes
from mixprec.casting.targets import DTYPES
from mixprec.policy import ModulePlan

__all__ = ["LowCopy", "module_tensors", "min_ndim"]


def module_tensors(module: nn.Module) -> list[torch.Tensor]:
    """A module's own parameters and buffers (not those of its children)."""
    return [t for t in list(module._parameters.values()) + list(module._buffers.values()) if t is not None]


_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
                "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")


class LowCopy:
    """A private copy of a module (and its subtree) as the policy stores and computes it.

    Every floating parameter and buffer is rounded to its module's storage dtype and
    kept there (an fp8 weight: quantised with its scales and kept dequantised); for the call each module's tensors are cast to that module's compute
    dtype (bf16 storage with fp32 compute: rounded weights, fp32 arithmetic), as are
    the floating inputs. Inside a block, a module computing in another dtype than its
    parent gets its inputs cast to its dtype and its outputs cast back to its parent's.
    """

    def __init__(self, module: nn.Module, plan: ModulePlan, plans: dict[int, ModulePlan], hook_ids: set[int],
                 fp8_read: dict[int, str] | None = None):
        def plan_of(original: nn.Module, parent: ModulePlan) -> ModulePlan:
            return plans.get(id(original)) or parent

        self.casts: list[tuple[torch.Tensor, torch.dtype]] = []
        with torch.inference_mode(False), torch.no_grad():
            clone = copy_module(module)  # sparse parameters too
            sub_plans: dict[int, ModulePlan] = {id(clone): plan}
            for (name, original), sub in zip(module.named_modules(), clone.modules()):
                for table in _HOOK_TABLES:  # the profile's own hooks were copied along
                    hooks = getattr(sub, table, None)
                    for hook_id in [k for k in hooks if k in hook_ids] if hooks else ():
                        del hooks[hook_id]
                parent = sub_plans.get(id(_parent_of(clone, name)), plan) if name else plan
                own_plan = sub_plans[id(sub)] = plan_of(original, parent) if name else plan
                storage, compute = DTYPES[own_plan.storage], DTYPES[own_plan.compute_dtype]
                originals = dict(own_tensors(original))
                for key, t in own_tensors(sub):
                    if not t.is_floating_point():
                        continue
                    t.requires_grad_(False)
                    if is_fp8(storage):
                        # as apply stores it: an eligible weight in fp8 with its scales (held here
                        # already dequantised into the compute dtype), everything else in that dtype
                        source = originals.get(key)
                        quantised = (quantise(t, storage) if fp8_eligible(sub, key, t)
                                     and id(source) not in (fp8_read or {}) else None)
                        t.data = (dequantise(quantised[0], Fp8Weight(quantised[1], storage), compute)
                                  if quantised is not None else t.data.to(compute))
                        continue
                    t.data = t.data.to(storage)
                    if compute != storage:
                        self.casts.append((t, compute))
                if name and own_plan.compute_dtype != parent.compute_dtype:
                    sub.register_forward_pre_hook(_cast_inputs(DTYPES[own_plan.compute_dtype], min_ndim(sub)),
                                                  with_kwargs=True)
                    sub.register_forward_hook(_cast_output(DTYPES[parent.compute_dtype]))
        self.module = clone
        self.compute = DTYPES[plan.compute_dtype]
        self.min_ndim = min_ndim(module)
        self.nbytes = sum(stored_bytes(t) for sub in clone.modules() for t in module_tensors(sub))

    def __call__(self, args: Any, kwargs: Any) -> Any:
        saved = []
        for t, dtype in self.casts:
            saved.append((t, t.data))
            t.data = t.data.to(dtype)
        try:
            return self.module(*cast_floats(args, self.compute, min_ndim=self.min_ndim),
                               **cast_floats(kwargs, self.compute, min_ndim=self.min_ndim))
        finally:
            for t, data in saved:
                t.data = data


def min_ndim(module: nn.Module) -> int:
    """torch's own layers need every floating input in their dtype; other modules keep
    0-d/1-d floats (timesteps, scales) as they came, as apply's boundaries do."""
    return 0 if type(module).__module__.startswith("torch.nn.") else 2


def _parent_of(root: nn.Module, name: str) -> nn.Module:
    return root.get_submodule(name.rpartition(".")[0]) if "." in name else root


def _cast_inputs(dtype: torch.dtype, min_ndim: int) -> Callable[..., Any]:
    def hook(module: nn.Module, args: Any, kwargs: Any) -> Any:
        return cast_floats(args, dtype, min_ndim=min_ndim), cast_floats(kwargs, dtype, min_ndim=min_ndim)
    return hook


def _cast_output(dtype: torch.dtype) -> Callable[..., Any]:
    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        return cast_floats(output, dtype)
    return hook
