"""Tensors a model caches as plain attributes, outside its parameters and buffers.

Real models keep tables they fill lazily as plain attributes: ESPnet's relative
positional encoding (``self.pe``, re-made in the dtype of the first input it sees),
masks, rotary tables. Filled during a 16-bit run, they would carry 16-bit values into
the next fp32 run after revert. :class:`PlainTensors` records each module's plain
floating-tensor attributes when a policy is applied; :meth:`PlainTensors.restore`
puts every one back as it was (the same object, ``None``, or no attribute at all) and
names any the model changed in place, which cannot be undone.
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch import nn

__all__ = ["PlainTensors"]

logger = logging.getLogger("mixprec")

_MISSING = object()


def _mark(tensor: torch.Tensor) -> int | torch.Tensor:
    """How a later in-place change is recognised: the version counter, or for an inference
    tensor (made under ``torch.inference_mode``, which keeps no version) a copy."""
    return tensor.clone() if tensor.is_inference() else tensor._version


def _plain(module: nn.Module) -> dict[str, torch.Tensor]:
    """Plain tensor attributes whose values a run's dtype can change: floating (dense or sparse) and
    complex ones (rotary ``freqs_cis``). Integer and bool ones (positions, masks) do not depend on it."""
    return {name: value for name, value in vars(module).items()
            if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())}


class PlainTensors:
    """The plain floating-tensor attributes of every module of some components, at one moment."""

    def __init__(self, components: dict[str, nn.Module]) -> None:
        self._modules: list[tuple[str, nn.Module, dict[str, tuple[object, int | torch.Tensor]]]] = []
        seen: set[int] = set()
        for cname, root in components.items():
            for name, module in root.named_modules():
                if id(module) in seen:
                    continue
                seen.add(id(module))
                qualname = ".".join(p for p in (cname, name) if p)
                values = {attr: (tensor, _mark(tensor)) for attr, tensor in _plain(module).items()}
                # Attributes that hold None now may be filled by the run (a lazy cache).
                values.update({attr: (None, 0) for attr, value in vars(module).items() if value is None and attr not in values})
                self._modules.append((qualname, module, values))

    def restore(self) -> list[str]:
        """Put every plain floating-tensor attribute back; returns the names that changed.

        Warns naming the tensors the model modified in place (their values cannot be
        restored: reload the model, or keep such caches as buffers). Inference tensors
        keep no version counter; they were copied, and are put back from the copy.
        """
        changed: list[str] = []
        in_place: list[str] = []
        for qualname, module, values in self._modules:
            def where(attr: str) -> str:
                return f"{qualname}.{attr}" if qualname else attr

            for attr, (before, mark) in values.items():
                if not isinstance(before, torch.Tensor):
                    continue
                if isinstance(mark, torch.Tensor):
                    if not torch.equal(before, mark):
                        with torch.inference_mode():
                            before.copy_(mark)
                        changed.append(where(attr))
                elif before._version != mark:
                    in_place.append(where(attr))
            now = _plain(module)
            for attr, tensor in now.items():
                before = values.get(attr, (_MISSING, 0))[0]
                if tensor is before:
                    continue
                changed.append(where(attr))
                if before is _MISSING:
                    delattr(module, attr)
                else:
                    setattr(module, attr, before)
            for attr, (before, _) in values.items():
                if isinstance(before, torch.Tensor) and attr not in now and attr not in vars(module):
                    setattr(module, attr, before)  # the run deleted it: put it back
                    changed.append(where(attr))
        if changed:
            logger.info("revert: restored the plain tensor attributes the applied run changed or added: %s",
                        ", ".join(dict.fromkeys(changed)))
        if in_place:
            warnings.warn(f"revert cannot restore {', '.join(in_place)}: the model changed these plain tensor attributes in "
                          "place during the applied run, so they may hold values computed in 16 bits; reload the model "
                          "for bit-exact fp32 results", stacklevel=3)
        return list(dict.fromkeys(changed))
