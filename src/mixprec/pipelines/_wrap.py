"""Wrap an existing multi-module object (e.g. a diffusers pipeline) as a :class:`Pipeline`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from mixprec.pipelines._base import (
    OUTPUT_KINDS,
    AudioOutput,
    EmbeddingOutput,
    ImageOutput,
    Pipeline,
    PipelineOutput,
)

__all__ = ["WrappedPipeline", "discover_components", "wrap"]

_OUTPUT_TYPES: dict[str, type[PipelineOutput]] = {
    "audio": AudioOutput,
    "image": ImageOutput,
    "embedding": EmbeddingOutput,
}


def discover_components(obj: object) -> dict[str, nn.Module]:
    """Find the ``nn.Module`` parts of ``obj``, in a stable order.

    * an ``nn.Module`` is a single component named ``"model"``;
    * an object with a ``components`` mapping (a diffusers ``DiffusionPipeline``)
      contributes its ``nn.Module`` values in that mapping's order;
    * any other object contributes its public ``nn.Module`` attributes, in
      ``vars(obj)`` (assignment) order.

    The same module object reachable under two names is kept once, under the
    first name.

    Raises:
        ValueError: If no module is found.
    """
    if isinstance(obj, nn.Module):
        return {"model": obj}
    source = getattr(obj, "components", None)
    if isinstance(source, Mapping):
        items = list(source.items())
    else:
        try:
            items = [(k, v) for k, v in vars(obj).items() if not k.startswith("_")]
        except TypeError:
            items = []
    found: dict[str, nn.Module] = {}
    seen: set[int] = set()
    for key, value in items:
        if isinstance(value, nn.Module) and id(value) not in seen:
            seen.add(id(value))
            found[key] = value
    if not found:
        raise ValueError(f"found no torch.nn.Module attributes on {type(obj).__name__} object")
    return found


def _first_device(components: Mapping[str, nn.Module]) -> torch.device:
    for module in components.values():
        for tensor in (*module.parameters(), *module.buffers()):
            return tensor.device
    return torch.device("cpu")


class WrappedPipeline(Pipeline):
    """A :class:`Pipeline` around an arbitrary object; built by :func:`wrap`.

    Attributes:
        obj: The wrapped object; its modules are the components (shared, not copied).
    """

    def __init__(
        self,
        obj: object,
        *,
        name: str,
        output_kind: str,
        run: Callable[[Any, Any], Any] | None,
        example_inputs: Callable[[int, int], Any] | None,
        sample_rate: int | None,
        sensitive: tuple[str, ...],
    ) -> None:
        self.name = name
        self.output_kind = output_kind
        self.sample_rate = sample_rate
        self.sensitive = tuple(sensitive)
        self.obj = obj
        self._run_fn = run
        self._inputs_fn = example_inputs
        components = discover_components(obj)
        super().__init__(components, device=_first_device(components))

    def _example_inputs(self, batch: int, seed: int) -> Any:
        if self._inputs_fn is None:
            raise NotImplementedError(
                f"wrapped pipeline {self.name!r} has no example inputs; "
                "pass example_inputs= to wrap()"
            )
        return self._inputs_fn(batch, seed)

    def _run(self, inputs: Any, **options: Any) -> PipelineOutput:
        if self._run_fn is not None:
            result = self._run_fn(self.obj, inputs, **options)
        elif callable(self.obj):
            if isinstance(inputs, Mapping):
                result = self.obj(**inputs, **options)
            else:
                result = self.obj(inputs, **options)
        else:
            raise NotImplementedError(
                f"{type(self.obj).__name__} is not callable; pass run= to wrap()"
            )
        return self._as_output(result)

    def _as_output(self, result: Any) -> PipelineOutput:
        if isinstance(result, PipelineOutput):
            return result
        tensor = result
        if isinstance(result, Mapping):  # e.g. a diffusers BaseOutput (an OrderedDict)
            tensor = next((v for v in result.values() if _is_array(v)), None)
        elif isinstance(result, (tuple, list)) and result and _is_array(result[0]):
            tensor = result[0]
        if not _is_array(tensor):
            raise ValueError(
                f"run of wrapped pipeline {self.name!r} returned {type(result).__name__}; "
                "expected a tensor, an array, a PipelineOutput, or a mapping holding a tensor"
            )
        output = torch.as_tensor(tensor)
        if self.output_kind == "audio":
            return AudioOutput(output=output, sample_rate=int(self.sample_rate or 0))
        return _OUTPUT_TYPES[self.output_kind](output=output)


def _is_array(value: Any) -> bool:
    return isinstance(value, torch.Tensor) or type(value).__name__ == "ndarray"


def wrap(
    obj: object,
    *,
    name: str | None = None,
    output_kind: str | None = None,
    run: Callable[..., Any] | None = None,
    example_inputs: Callable[[int, int], Any] | None = None,
    sample_rate: int | None = None,
    sensitive: tuple[str, ...] = (),
) -> WrappedPipeline:
    """Wrap ``obj`` into a :class:`Pipeline` whose components are its modules.

    Args:
        obj: A diffusers ``DiffusionPipeline``, an ``nn.Module``, or any object
            with ``nn.Module`` attributes (see :func:`discover_components`).
        name: Pipeline name; defaults to the lower-cased class name of ``obj``.
        output_kind: One of ``"audio"``, ``"image"``, ``"embedding"``.  May be
            omitted for objects with a ``components`` mapping (diffusers), which
            count as ``"audio"`` when they have a ``vocoder`` and ``"image"`` otherwise.
        run: ``run(obj, inputs, **options)`` performing one generation.  By
            default ``obj(**inputs)`` for mapping inputs, else ``obj(inputs)``.
            A tensor, NumPy array or mapping holding one is turned into a
            :class:`PipelineOutput`.
        example_inputs: ``example_inputs(batch, seed)`` returning inputs.
        sample_rate: Required for ``"audio"``.
        sensitive: Precision-sensitive module hints (see :class:`Pipeline`).

    Raises:
        ValueError: For an invalid ``output_kind``, a missing ``sample_rate``,
            non-callable ``run``/``example_inputs``, or an object without modules.
    """
    if output_kind is None and isinstance(getattr(obj, "components", None), Mapping):
        has_vocoder = "vocoder" in obj.components  # type: ignore[attr-defined]
        output_kind = "audio" if has_vocoder else "image"
    if output_kind not in OUTPUT_KINDS:
        raise ValueError(
            f"output_kind must be one of {', '.join(OUTPUT_KINDS)}; got {output_kind!r}"
        )
    if output_kind == "audio" and not sample_rate:
        raise ValueError(
            f"an audio pipeline needs sample_rate= (a positive int), got {sample_rate!r}"
        )
    for label, fn in (("run", run), ("example_inputs", example_inputs)):
        if fn is not None and not callable(fn):
            raise ValueError(f"{label} must be callable or None, got {fn!r}")
    return WrappedPipeline(
        obj,
        name=name or type(obj).__name__.lower(),
        output_kind=output_kind,
        run=run,
        example_inputs=example_inputs,
        sample_rate=sample_rate,
        sensitive=tuple(sensitive),
    )
