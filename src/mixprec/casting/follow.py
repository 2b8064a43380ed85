"""Weights the app changes after a policy is applied: followed, so that ``revert`` and a
re-apply (the guard's fallback) start from them, never from stale originals.

Three ways an app changes weights under an applied policy:

* ``model.load_state_dict(state)`` copies the loaded values into the cast tensors, which
  rounds them to 16 bits. Hooks on every module see the state before the copy; for each
  cast tensor the copy reached, the loaded value at its original precision becomes the
  original that ``revert`` puts back and a re-apply casts again.
  ``load_state_dict(..., assign=True)`` would swap the cast tensors for the loaded ones;
  it is refused before anything is loaded into the applied model.
* Replacing a parameter (``module.weight = nn.Parameter(w)``): the new object is the
  app's. ``revert`` leaves it as the app set it, and a re-apply casts it afresh.
* Changing a cast parameter in place (``weight.copy_(w)``, an optimizer step): its
  values exist only in 16 bits; they become the original, upcast, with a warning.
  A write through ``weight.data`` moves no version counter; it is recognised by a
  sample of the values (:func:`~mixprec.casting.kinds.digest`, 4,096 evenly spaced
  values) taken when the weight was cast: a change to the whole weight, or to any
  sampled value, is followed the same way.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
from torch import nn

from mixprec.casting.fp8 import stored_value
from mixprec.casting.kinds import digest
from mixprec.casting.targets import ApplyError

__all__ = ["WeightChanges", "replaced_by_app"]


def replaced_by_app(current: torch.Tensor, tracked: torch.Tensor) -> bool:
    """Whether a parameter slot holding ``current`` instead of ``tracked`` was set by the app.

    With ``torch.__future__.set_overwrite_module_params_on_conversion(True)``, ``.half()``
    and ``.to()`` make new Parameter objects themselves: those are conversions of the same
    weights, not the app's own values.
    """
    return current is not tracked and not torch.__future__.get_overwrite_module_params_on_conversion()


def _digest(t: torch.Tensor) -> tuple[torch.dtype, torch.device, bytes]:
    return t.dtype, t.device, digest(t)


def _written(t: torch.Tensor, before: tuple[torch.dtype, torch.device, bytes] | None) -> bool:
    """Whether ``t``'s values changed with no version counter to say so (a write through ``.data``).

    A new dtype or device is the app converting the model (``.half()``, ``.to()``), not a write.
    """
    if before is None or (t.dtype, t.device) != before[:2]:
        return False
    return digest(t) != before[2]


class WeightChanges:
    """Keeps the originals of one applied model in step with the app's weight changes.

    Args:
        originals: ``id`` of each cast tensor -> the tensor, as the applied model holds it.
        locations: ``id`` -> the (module, ``"p:name"``/``"b:name"``) slots holding it.
        follow: called with (``id``, new original at full precision) for every change followed.
    """

    def __init__(self, originals: dict[int, torch.Tensor], locations: dict[int, list[tuple[nn.Module, str]]],
                 follow: Callable[[int, torch.Tensor], None]):
        self.originals = originals
        self.locations = locations
        self.follow = follow
        # Inference tensors (made under torch.inference_mode) have no version counter, whatever
        # data the app puts in them later: only the sample below sees their writes.
        self.uncounted = {key for key, t in originals.items() if t.is_inference()}
        self.versions = {key: self._version(key, t) for key, t in originals.items()}
        # What each cast parameter held, for writes through .data (which move no version counter).
        self.digests = {key: _digest(t) for key, t in originals.items()
                        if any(slot.startswith("p:") for _, slot in locations.get(key, ()))}
        self._loading: dict[int, tuple[torch.Tensor, int | None]] = {}

    def _version(self, key: int, t: torch.Tensor) -> int | None:
        return None if key in self.uncounted else t._version

    def install(self, components: dict[str, nn.Module]) -> list[Any]:
        """Load hooks on every module of the components; returns their handles."""
        slots: dict[int, list[tuple[str, int]]] = {}
        for key, where in self.locations.items():
            for module, slot in where:
                slots.setdefault(id(module), []).append((slot, key))
        handles: list[Any] = []
        seen: set[int] = set()
        for root in components.values():
            for module in root.modules():
                if id(module) in seen:
                    continue
                seen.add(id(module))
                own = slots.get(id(module), [])
                handles.append(module._register_load_state_dict_pre_hook(self._pre_hook(own), with_module=True))
                if own:
                    handles.append(module.register_load_state_dict_post_hook(self._post_hook(own)))
        return handles

    def _pre_hook(self, own: list[tuple[str, int]]):
        def hook(module, state_dict, prefix, local_metadata, *args):
            if local_metadata.get("assign_to_params_buffers"):
                raise ApplyError(
                    f"load_state_dict(..., assign=True) reached {type(module).__name__} {prefix.rstrip('.') or '(root)'!r}, "
                    "whose tensors a mixprec policy has cast: assigning would swap them for uncast ones; nothing was "
                    "loaded into the applied model. Load without assign=True (mixprec keeps the loaded values at "
                    "full precision for revert), or revert() first, load, then apply again")
            for slot, key in own:
                name = prefix + slot[2:]
                if name in state_dict and isinstance(state_dict[name], torch.Tensor):
                    tensor = self.originals[key]
                    self._loading[key] = (state_dict[name], self._version(key, tensor))
        return hook

    def _post_hook(self, own: list[tuple[str, int]]):
        def hook(module, incompatible_keys):
            for slot, key in own:
                if key not in self._loading:
                    continue
                loaded, before = self._loading.pop(key)
                tensor = self.originals[key]
                table = module._parameters if slot.startswith("p:") else module._buffers
                if table.get(slot[2:]) is not tensor:
                    continue
                after = self._version(key, tensor)
                if before is not None and after == before:
                    continue  # not copied (a shape mismatch, reported by torch)
                self.follow(key, loaded.detach())
                self.versions[key] = self._version(key, tensor)  # following may store it anew (fp8 with a new scale)
                if key in self.digests:
                    self.digests[key] = _digest(tensor)
        return hook

    def sync(self, original_dtypes: dict[int, torch.dtype]) -> list[str]:
        """Follow cast parameters changed in place since they were cast; returns their names.

        Their current (16-bit) values become the originals, in ``original_dtypes[key]``.
        """
        changed = []
        for key, tensor in self.originals.items():
            where = self.locations.get(key, ())
            if not any(slot.startswith("p:") for _, slot in where):
                continue  # buffers (running statistics) are the model's own business, put back as they were
            now = self._version(key, tensor)
            if (now is None or now == self.versions.get(key)) and not _written(tensor, self.digests.get(key)):
                continue
            self.follow(key, stored_value(tensor).to(original_dtypes[key]))
            self.versions[key] = now
            self.digests[key] = _digest(tensor)
            module, slot = where[0]
            changed.append(f"{type(module).__name__}.{slot[2:]}")
        if changed:
            warnings.warn(f"{len(changed)} cast parameter(s) were changed in place after the policy was applied "
                          f"({', '.join(changed[:4])}{', ...' if len(changed) > 4 else ''}): their current reduced-precision values "
                          "become the originals. To keep full precision, change weights with load_state_dict (which "
                          "mixprec follows), or revert, change them, and apply again", stacklevel=4)
        return changed
