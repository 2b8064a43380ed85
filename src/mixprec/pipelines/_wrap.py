"""Wrap an existing multi-module object (e.g. a diffusers pipeline) as a :class:`Pipeline`."""

from __future__ import annotations

import numbers
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

__all__ = ["WrappedPipeline", "discover_components", "infer_output_kind", "wrap"]

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

    When :func:`wrap` could not tell the output kind from the object, it is
    inferred from the first run's output (see :func:`infer_output_kind`);
    reading :attr:`output_kind` before any run makes one run on
    ``example_inputs(1, 0)`` to find out.

    Attributes:
        obj: The wrapped object; its modules are the components (shared, not copied).
    """

    def __init__(
        self,
        obj: object,
        *,
        name: str,
        output_kind: str | None,
        run: Callable[[Any, Any], Any] | None,
        example_inputs: Callable[[int, int], Any] | None,
        sample_rate: int | None,
        sensitive: tuple[str, ...],
    ) -> None:
        self.name = name
        self.sample_rate = sample_rate
        self.sensitive = tuple(sensitive)
        self.obj = obj
        self._run_fn = run
        self._inputs_fn = example_inputs
        self._inferring = False
        components = discover_components(obj)
        # Pipeline.__init__ validates the kind; an undecided one is checked when inferred.
        self._kind: str | None = output_kind or "embedding"
        super().__init__(components, device=_first_device(components))
        self._kind = output_kind

    @property
    def output_kind(self) -> str:  # type: ignore[override]
        """``"audio"``, ``"image"`` or ``"embedding"``; inferred by a run if :func:`wrap` could not tell."""
        if self._kind is None:
            self._infer_by_running()
        assert self._kind is not None
        return self._kind

    @property
    def output_kind_known(self) -> bool:
        """Whether the output kind is decided (given, read from the object, or seen in a run)."""
        return self._kind is not None

    def _infer_by_running(self) -> None:
        if self._inputs_fn is None:
            raise ValueError(
                f"cannot tell the output kind of wrapped pipeline {self.name!r} from its "
                f"{type(self.obj).__name__} object and it has not run yet; pass "
                "output_kind='audio' | 'image' | 'embedding' to wrap(), or example_inputs= "
                "so that it can be inferred from one run"
            )
        if self._inferring:  # pragma: no cover - a run that reads output_kind before returning
            raise ValueError(f"output kind of wrapped pipeline {self.name!r} read while inferring it")
        self._inferring = True
        try:
            self.run(self.example_inputs(1, 0))
        finally:
            self._inferring = False

    def _example_inputs(self, batch: int, seed: int) -> Any:
        if self._inputs_fn is None:
            raise NotImplementedError(
                f"wrapped pipeline {self.name!r} has no example inputs; "
                "pass example_inputs= to wrap(), or give the wrapped object an "
                "example_inputs(batch, seed) method"
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
            if self._kind is None:
                self._kind = _KIND_OF_OUTPUT.get(type(result)) or next(
                    (k for t, k in _KIND_OF_OUTPUT.items() if isinstance(result, t)), None
                )
                if self._kind is None:
                    raise ValueError(
                        f"run of wrapped pipeline {self.name!r} returned a "
                        f"{type(result).__name__}, which is none of AudioOutput, ImageOutput, "
                        "EmbeddingOutput; pass output_kind= to wrap()"
                    )
                if self._kind == "audio" and not self.sample_rate:
                    self.sample_rate = int(getattr(result, "sample_rate", 0) or 0) or None
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
        if self._kind is None:
            self._kind = infer_output_kind(
                output, sample_rate=self.sample_rate, name=self.name
            )
        if self._kind == "audio":
            if output.dim() == 1:  # one waveform: (samples,) -> (1, samples)
                output = output.unsqueeze(0)
            return AudioOutput(output=output, sample_rate=int(self.sample_rate or 0))
        return _OUTPUT_TYPES[self._kind](output=output)

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={v:,}" for k, v in self.parameter_counts().items())
        kind = self._kind or "output kind not yet inferred"
        return f"<{type(self).__name__} {self.name!r} {kind} on {self.device}: {parts}>"


def infer_output_kind(
    output: torch.Tensor, *, sample_rate: int | None = None, name: str = "wrapped"
) -> str:
    """Tell a pipeline's output kind from one output tensor.

    * 4-D with 1, 3 or 4 channels in dimension 1 -> ``"image"``;
    * 1-D, or 2-D ``(batch, samples)``, when a sample rate is known -> ``"audio"``;
    * 2-D ``(batch, dim)`` otherwise -> ``"embedding"``.

    Args:
        output: The main output tensor of one run.
        sample_rate: The sample rate, if one is known (makes 1-D/2-D audio).
        name: Pipeline name for the error message.

    Raises:
        ValueError: When the shape does not tell (e.g. 3-D, 1-D without a sample
            rate); the message names the shape and what to pass to ``wrap()``.
    """
    shape = tuple(output.shape)
    if output.dim() == 4 and shape[1] in (1, 3, 4):
        return "image"
    if output.dim() in (1, 2) and sample_rate:
        return "audio"
    if output.dim() == 2:
        return "embedding"
    if output.dim() == 1:
        missing = "sample_rate= (if it is a waveform) or output_kind="
    elif output.dim() == 4:
        missing = (f"output_kind= (a 4-D output is an image only with 1, 3 or 4 channels in "
                   f"dimension 1, got {shape[1]})")
    else:
        missing = "output_kind='audio' | 'image' | 'embedding' (and sample_rate= for audio)"
    raise ValueError(
        f"cannot tell the output kind of wrapped pipeline {name!r} from its first output, "
        f"a {output.dim()}-D tensor of shape {shape}; pass {missing} to wrap()"
    )


_KIND_OF_OUTPUT: dict[type[PipelineOutput], str] = {v: k for k, v in _OUTPUT_TYPES.items()}


def _positive_int(value: Any) -> int | None:
    """``value`` as an int if it is a positive integer (NumPy integers included), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value) if value > 0 else None


def _attribute_sample_rate(obj: object) -> int | None:
    """The rate in ``obj.sample_rate`` / ``obj.sr`` / ``obj.sampling_rate``, if a positive int."""
    for attr in ("sample_rate", "sr", "sampling_rate"):
        rate = _positive_int(getattr(obj, attr, None))
        if rate:
            return rate
    return None


def _vocoder_sample_rate(vocoder: object) -> int | None:
    rate = _attribute_sample_rate(vocoder)
    if rate:
        return rate
    config = getattr(vocoder, "config", None)
    for attr in ("sampling_rate", "sample_rate"):
        rate = _positive_int(getattr(config, attr, None))
        if rate:
            return rate
    return None


def _find_vocoder(obj: object) -> object | None:
    source = getattr(obj, "components", None)
    if isinstance(source, Mapping) and "vocoder" in source:
        return source["vocoder"]
    if isinstance(obj, nn.Module):
        return obj._modules.get("vocoder")
    try:
        return vars(obj).get("vocoder")
    except TypeError:
        return None


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

    What is not given is inferred, in this order:

    1. an object with a positive int ``sample_rate``, ``sr`` or ``sampling_rate``
       attribute is ``"audio"`` at that rate;
    2. an object with a ``vocoder`` component is ``"audio"``; the rate comes from
       ``sample_rate=``, the object, or the vocoder (its ``sampling_rate`` /
       ``sample_rate`` attribute or ``config.sampling_rate``);
    3. a diffusers pipeline (an object with a ``components`` mapping) without a
       vocoder is ``"image"``;
    4. anything else is decided by the first run's output (see
       :func:`infer_output_kind`): 4-D with 1, 3 or 4 channels is an image,
       ``(batch, dim)`` an embedding, and 1-D or 2-D a waveform when
       ``sample_rate=`` is given.

    Args:
        obj: A diffusers ``DiffusionPipeline``, an ``nn.Module``, or any object
            with ``nn.Module`` attributes (see :func:`discover_components`).
        name: Pipeline name; defaults to the lower-cased class name of ``obj``.
        output_kind: One of ``"audio"``, ``"image"``, ``"embedding"``, or
            ``None`` to infer it (see above).
        run: ``run(obj, inputs, **options)`` performing one generation.  By
            default ``obj(**inputs)`` for mapping inputs, else ``obj(inputs)``.
            A tensor, NumPy array or mapping holding one is turned into a
            :class:`PipelineOutput`; a 1-D waveform becomes ``(1, samples)``.
        example_inputs: ``example_inputs(batch, seed)`` returning inputs; by
            default the object's own ``example_inputs`` method, if it has one.
        sample_rate: Samples per second of audio output; read from the object
            or its vocoder when omitted (see above).
        sensitive: Precision-sensitive module hints (see :class:`Pipeline`).

    Raises:
        ValueError: For an invalid ``output_kind``, audio whose sample rate is
            given nowhere, non-callable ``run``/``example_inputs``, or an object
            without modules.  Each message names what is missing.
    """
    if output_kind is not None and output_kind not in OUTPUT_KINDS:
        raise ValueError(
            f"output_kind must be one of {', '.join(OUTPUT_KINDS)}; got {output_kind!r}"
        )
    if sample_rate is not None and not _positive_int(sample_rate):
        raise ValueError(f"sample_rate must be a positive int, got {sample_rate!r}")
    for label, fn in (("run", run), ("example_inputs", example_inputs)):
        if fn is not None and not callable(fn):
            raise ValueError(f"{label} must be callable or None, got {fn!r}")
    if example_inputs is None and callable(getattr(obj, "example_inputs", None)):
        example_inputs = obj.example_inputs  # type: ignore[attr-defined]
    label = name or type(obj).__name__.lower()
    attr_rate = _attribute_sample_rate(obj)
    vocoder = _find_vocoder(obj)
    if output_kind is None:
        if attr_rate or vocoder is not None:
            output_kind = "audio"
        elif isinstance(getattr(obj, "components", None), Mapping):
            output_kind = "image"
    if output_kind == "audio" and not sample_rate:
        sample_rate = attr_rate or (_vocoder_sample_rate(vocoder) if vocoder is not None else None)
        if not sample_rate:
            why = (f"it has a vocoder ({type(vocoder).__name__}) that states no sampling_rate"
                   if vocoder is not None else "output_kind='audio' was given")
            raise ValueError(
                f"wrapped pipeline {label!r} produces audio ({why}) but its sample rate is "
                "unknown: pass sample_rate= (a positive int), or give the object a "
                "sample_rate or sr attribute"
            )
    return WrappedPipeline(
        obj,
        name=label,
        output_kind=output_kind,
        run=run,
        example_inputs=example_inputs,
        sample_rate=sample_rate,
        sensitive=tuple(sensitive),
    )
