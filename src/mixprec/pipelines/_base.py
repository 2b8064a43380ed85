"""The pipeline protocol shared by every reference and wrapped pipeline.

A :class:`Pipeline` is a multi-component model that users actually run: a
text-to-speech stack, a latent diffusion model, a sentence encoder.  The parts
whose numeric precision may later be changed are exposed as ``components``
(an ordered ``dict`` of name -> ``nn.Module``); everything ``run`` computes with
learned parameters lives in one of them.

Subclasses implement :meth:`Pipeline._example_inputs` and
:meth:`Pipeline._run`; the public methods validate arguments, move inputs to the
pipeline's device and enter ``torch.inference_mode()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mixprec._quote import quote

__all__ = [
    "OUTPUT_KINDS",
    "AudioOutput",
    "EmbeddingOutput",
    "ImageOutput",
    "Pipeline",
    "PipelineOutput",
    "check_batch_seed",
    "make_generator",
    "module_dtype",
    "seeded",
    "sized_config",
]

#: The kinds of main output a pipeline may produce.
OUTPUT_KINDS: tuple[str, ...] = ("audio", "image", "embedding")

_COMPONENT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class PipelineOutput:
    """What :meth:`Pipeline.run` returns.

    Attributes:
        output: The main output tensor (waveforms, images or embeddings), on the
            pipeline's device, in float32.
    """

    output: torch.Tensor

    def extras(self) -> dict[str, Any]:
        """Return every field except the main output, by name."""
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "output"
        }


@dataclass
class AudioOutput(PipelineOutput):
    """Waveforms of shape ``(batch, samples)`` in ``[-1, 1]``.

    Attributes:
        sample_rate: Samples per second of ``output``.
        speech_tokens: The discrete tokens the audio was rendered from, if any.
        token_agreement: Under teacher forcing, the fraction of steps where the
            token the model would have chosen equals the forced one; else ``None``.
    """

    sample_rate: int = 24000
    speech_tokens: torch.Tensor | None = None
    token_agreement: float | None = None

    @property
    def waveform(self) -> torch.Tensor:
        """Alias of ``output``."""
        return self.output


@dataclass
class ImageOutput(PipelineOutput):
    """Images of shape ``(batch, 3, height, width)`` with values in ``[0, 1]``."""

    @property
    def images(self) -> torch.Tensor:
        """Alias of ``output``."""
        return self.output


@dataclass
class EmbeddingOutput(PipelineOutput):
    """Embeddings of shape ``(batch, dim)``.

    Attributes:
        sentences: The sentences that were embedded, if the pipeline is textual.
    """

    sentences: tuple[str, ...] = ()

    @property
    def embeddings(self) -> torch.Tensor:
        """Alias of ``output``."""
        return self.output


def check_batch_seed(batch: object, seed: object) -> None:
    """Validate the ``batch`` and ``seed`` arguments of ``example_inputs``.

    Args:
        batch: Must be an ``int`` (not a ``bool``) of at least 1.
        seed: Must be an ``int`` (not a ``bool``); any value, negative included.

    Raises:
        ValueError: If either argument is invalid; the message repeats it.
    """
    if isinstance(batch, bool) or not isinstance(batch, int):
        raise ValueError(f"batch must be an int >= 1, got {batch!r} ({type(batch).__name__})")
    if batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r} ({type(seed).__name__})")


def sized_config(kind: str, sizes: Mapping[str, Any], size: str, overrides: Mapping[str, Any]) -> Any:
    """The config dataclass of ``sizes[size]`` with ``overrides`` applied.

    Raises:
        ValueError: For an unknown size or override name; the message lists the valid ones.
    """
    if size not in sizes:
        raise ValueError(f"unknown {kind} size {quote(size)}; valid sizes: {', '.join(sizes)}")
    fields = {f.name for f in dataclasses.fields(sizes[size])}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown {kind} option(s) {unknown}; valid: {', '.join(sorted(fields))}")
    return dataclasses.replace(sizes[size], **overrides)


def module_dtype(module: nn.Module) -> torch.dtype:
    """Return the dtype of a module's first floating-point parameter (float32 if none)."""
    for param in module.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.float32


def _move(obj: Any, device: torch.device) -> Any:
    """Move every tensor inside dicts, lists, tuples and dataclasses to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {
            f.name: _move(getattr(obj, f.name), device) for f in dataclasses.fields(obj) if f.init
        }
        return dataclasses.replace(obj, **changes)
    if isinstance(obj, dict):
        return {key: _move(value, device) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_move(value, device) for value in obj)
    return obj


class Pipeline:
    """A multi-component model with deterministic example inputs.

    Class attributes a subclass sets:
        name: Registry name, e.g. ``"tts"``.
        output_kind: One of :data:`OUTPUT_KINDS`.
        sample_rate: Samples per second for ``"audio"`` pipelines, else ``None``.
        sensitive: Hints naming precision-sensitive modules: qualified names
            such as ``"vocoder.conv_post"``, shell-style globs such as
            ``"t3.model.layers.*.input_layernorm"``, or ``"type:LayerNorm"`` to
            select every module whose class is called ``LayerNorm``.
        work_option: ``(option, smallest value)``: the config option a run's work
            grows in proportion to (denoising steps, generated tokens) and its
            smallest useful value. A benchmark with a time budget lowers it when even
            one timed run per configuration would not fit; ``None``: never changed.

    Args:
        components: Ordered mapping of component name -> module.  Names are
            Python identifiers; ``"total"`` is reserved.
        device: Device the components are moved to.
    """

    name: str = ""
    output_kind: str = ""
    sample_rate: int | None = None
    sensitive: tuple[str, ...] = ()
    work_option: tuple[str, int] | None = None

    def __init__(
        self, components: Mapping[str, nn.Module], *, device: str | torch.device = "cpu"
    ) -> None:
        if self.output_kind not in OUTPUT_KINDS:
            raise ValueError(
                f"output_kind must be one of {', '.join(OUTPUT_KINDS)}; got {self.output_kind!r}"
            )
        if self.output_kind == "audio" and not self.sample_rate:
            raise ValueError(f"audio pipeline {self.name!r} needs a sample_rate")
        checked: dict[str, nn.Module] = {}
        for key, module in components.items():
            if not isinstance(key, str) or not _COMPONENT_NAME.match(key) or key == "total":
                raise ValueError(
                    f"component name {key!r} must be a Python identifier other than 'total'"
                )
            if not isinstance(module, nn.Module):
                raise ValueError(
                    f"component {key!r} must be a torch.nn.Module, got {type(module).__name__}"
                )
            checked[key] = module
        if not checked:
            raise ValueError(f"pipeline {self.name!r} has no components")
        self._components = checked
        self._device = torch.device("cpu")
        for module in self._components.values():
            module.eval()
        self.to(device)

    # ------------------------------------------------------------------ parts
    @property
    def components(self) -> dict[str, nn.Module]:
        """Ordered ``dict`` of component name -> module (live: ``run`` reads it)."""
        return self._components

    @property
    def device(self) -> torch.device:
        """The device the components live on and ``run`` computes on."""
        return self._device

    def to(self, device: str | torch.device) -> "Pipeline":
        """Move every component to ``device`` and return ``self``."""
        target = torch.device(device)
        for module in self._components.values():
            module.to(target)
        self._device = target
        return self

    def named_modules(self) -> Iterator[tuple[str, nn.Module]]:
        """Yield ``(qualified_name, module)`` over all components, e.g. ``"vocoder.conv_post"``."""
        for comp_name, component in self._components.items():
            for sub_name, module in component.named_modules():
                yield (f"{comp_name}.{sub_name}" if sub_name else comp_name), module

    def resolve_hints(self, hints: tuple[str, ...] | list[str] | None = None) -> list[str]:
        """Return the qualified module names matched by ``hints`` (default: :attr:`sensitive`).

        Args:
            hints: Qualified names, globs, or ``"type:ClassName"`` entries.

        Returns:
            Matching names in :meth:`named_modules` order, without duplicates.
        """
        hints = tuple(self.sensitive if hints is None else hints)
        type_names = {h[len("type:"):] for h in hints if h.startswith("type:")}
        patterns = [h for h in hints if not h.startswith("type:")]
        matched = []
        for qual_name, module in self.named_modules():
            if type(module).__name__ in type_names or any(
                fnmatch.fnmatchcase(qual_name, p) for p in patterns
            ):
                matched.append(qual_name)
        return matched

    def parameter_counts(self) -> dict[str, int]:
        """Return parameters per component plus ``"total"`` (shared tensors counted once)."""
        counts: dict[str, int] = {}
        seen: set[int] = set()
        total = 0
        for comp_name, component in self._components.items():
            counts[comp_name] = sum(p.numel() for p in component.parameters())
            for param in component.parameters():
                if id(param) not in seen:
                    seen.add(id(param))
                    total += param.numel()
        counts["total"] = total
        return counts

    # ------------------------------------------------------------------ use
    def example_inputs(self, batch: int = 1, seed: int = 0) -> Any:
        """Return inputs for :meth:`run`, identical for identical ``(batch, seed)``.

        Args:
            batch: Number of examples, an ``int`` >= 1.
            seed: Seed of every random choice in the inputs (and of the noise
                that ``run`` draws for them).

        Raises:
            ValueError: If ``batch`` or ``seed`` is not a valid int.
        """
        check_batch_seed(batch, seed)
        return self._example_inputs(batch, seed)

    def run(self, inputs: Any, **options: Any) -> PipelineOutput:
        """Run the whole pipeline (loops included) under ``torch.inference_mode()``.

        Args:
            inputs: An object returned by :meth:`example_inputs`; its tensors are
                moved to :attr:`device`.
            **options: Pipeline-specific keyword options.

        Returns:
            A :class:`PipelineOutput` (or subclass) holding the main output tensor.
            Its tensors are inference tensors: read them freely, ``clone()``
            them before modifying them in place outside inference mode.
        """
        inputs = _move(inputs, self._device)
        with torch.inference_mode():
            return self._run(inputs, **options)

    def teacher_forced(self, inputs: Any, reference: PipelineOutput) -> Any:
        """Return ``inputs`` that replay the discrete choices of ``reference``.

        Pipelines that make discrete decisions (e.g. autoregressive token
        choice) or follow a trajectory that amplifies every rounding (e.g. the
        latents of a diffusion loop) override this so that a run under another
        precision follows the same path as the reference run.  The default
        returns ``inputs``.
        """
        del reference
        return inputs

    def _example_inputs(self, batch: int, seed: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define example inputs")

    def _run(self, inputs: Any, **options: Any) -> PipelineOutput:
        raise NotImplementedError(f"{type(self).__name__} does not define run")

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={v:,}" for k, v in self.parameter_counts().items())
        kind = f"{self.name!r} {self.output_kind} on {self._device}"
        return f"<{type(self).__name__} {kind}: {parts}>"


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch's CPU generator inside the block and restore the previous state after.

    Used to initialise weights reproducibly without touching the caller's RNG.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed % (2**63))
        yield


def make_generator(seed: int) -> torch.Generator:
    """Return a CPU ``torch.Generator`` seeded from any Python int (negatives included)."""
    return torch.Generator(device="cpu").manual_seed(seed % (2**63))
