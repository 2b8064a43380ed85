"""One fp32 run of a model, recorded per component, so that each component can be timed alone.

:class:`Recorder` hooks every component's entry methods (``forward`` and the model's own,
on the component and on the children the app calls directly: :func:`~mixprec.policy.tree.entry_methods`,
:func:`~mixprec.policy.tree.called_children`) for the run, as the guard sees them. For each
component it counts the outermost calls and their seconds on the device's clock, and keeps a
sample of them: the first call and calls spread over the run (indices 1, 2, 4, 8, ...: at
most :data:`SAMPLES` kept, the latest replacing the earlier ones), each as the guard records
a call (:class:`~mixprec.diagnose.calls.RecordedCall`: the arguments, deep-copied with the
model's own modules and weights shared, a KV cache's tensors included, and the random state)
with the fp32 output it gave.

During a component's first call the modules it calls directly (its dynamic children, the
layers and blocks its forward runs) are recorded the same way: a component called once for
seconds (a vocoder, a flow decoder) is timed through them, as TensorRT times layers, and
the sum predicts the component (:class:`Unit`).

:func:`replay` runs one recorded call again on a fresh copy of its arguments, cast to the
dtype the candidate computes the unit in (as an entry boundary casts them), from the random
state it started with.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

from mixprec.calibration.trials import detached
from mixprec.casting.hooks import add_method_hook
from mixprec.device.clock import Clock
from mixprec.diagnose.calls import RecordedCall
from mixprec.diagnose.capture import cast_owned, shared_model_memo
from mixprec.diagnose.low_copy import min_ndim
from mixprec.policy.tree import called_children, entry_methods, is_container

__all__ = ["Recorder", "Sample", "Unit", "ComponentRecord", "replay", "SAMPLES"]

#: Recorded calls kept per unit: the first and the latest of those spread over the run.
SAMPLES = 3


@dataclass
class Sample:
    """One recorded call: what it was handed, the random state it started from, what fp32 gave."""

    index: int
    owner: nn.Module
    method: str
    call: RecordedCall
    output: list[torch.Tensor]
    seconds: float


@dataclass
class Unit:
    """What is timed of a component: the component's own calls, or one module it calls directly.

    Attributes:
        name: the component's name, or the module's qualified name.
        calls: its calls in the run (a child's: within the component's first call, scaled to the run).
        seconds: their fp32 seconds on the device clock.
        samples: the recorded calls.
        min_ndim: floating inputs with fewer dimensions keep their dtype (timesteps, scales).
        module: the module whose plan decides the dtype its inputs are cast to.
    """

    name: str
    calls: int
    seconds: float
    samples: list[Sample]
    min_ndim: int
    module: nn.Module


@dataclass
class ComponentRecord:
    """A component's calls in the recorded run, and its dynamic children's in its first call."""

    name: str
    root: nn.Module
    calls: int = 0
    seconds: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    first_seconds: float = 0.0
    children: dict[str, Unit] = field(default_factory=dict)
    #: Recorded calls that could not be copied (their arguments refuse ``deepcopy``).
    uncopied: int = 0

    def whole(self) -> Unit:
        return Unit(self.name, self.calls, self.seconds, self.samples, min_ndim(self.root), self.root)

    def child_units(self) -> list[Unit]:
        """The dynamic children of the first call, scaled from that call to the run (a component
        called 10 times runs its children 10 times)."""
        scale = self.seconds / self.first_seconds if self.first_seconds > 0 else 1.0
        return [Unit(u.name, max(1, round(u.calls * scale)), u.seconds * scale, u.samples, u.min_ndim, u.module)
                for u in self.children.values() if u.samples]

    def children_seconds(self) -> float:
        return sum(u.seconds for u in self.children.values())


def _keep(index: int) -> bool:
    return index == 0 or (index & (index - 1)) == 0


def _store(samples: list[Sample], sample: Sample) -> None:
    """Keep the first call and the latest spread ones (at most :data:`SAMPLES`)."""
    samples.append(sample)
    if len(samples) > SAMPLES:
        del samples[1]


class Recorder:
    """Records a run per component (see the module docstring): use as a context manager around the run."""

    def __init__(self, components: dict[str, nn.Module], clock: Clock):
        self.components, self.clock = components, clock
        self.records = {name: ComponentRecord(name, root) for name, root in components.items()}
        self._memo = shared_model_memo(components)
        self._depth = {name: 0 for name in components}
        self._handles: list[Any] = []

    def _copy(self, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        try:
            return copy.deepcopy((args, kwargs), dict(self._memo))
        except Exception:  # noqa: BLE001 - a call whose arguments cannot be copied is not sampled
            return None

    def _sampled(self, record: ComponentRecord, samples: list[Sample], index: int, owner: nn.Module, method: str,
                 call: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[Any, float]:
        kept = _keep(index)
        copied = self._copy(args, kwargs) if kept else None
        if kept and copied is None:
            record.uncopied += 1
        recorded = RecordedCall.record(call, *copied) if copied is not None else None
        out, seconds = self.clock.time(lambda: call(*args, **kwargs))
        if recorded is not None:
            _store(samples, Sample(index, owner, method, recorded, detached(out), seconds))
        return out, seconds

    def _entry(self, cname: str, owner: nn.Module, method: str) -> Callable[..., Any]:
        record = self.records[cname]

        def around(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
            if self._depth[cname]:
                return call(*args, **kwargs)
            self._depth[cname] += 1
            index = record.calls
            inner = self._children(record) if index == 0 else contextlib.nullcontext()
            try:
                with inner:
                    out, seconds = self._sampled(record, record.samples, index, owner, method, call, args, kwargs)
            finally:
                self._depth[cname] -= 1
            record.calls += 1
            record.seconds += seconds
            if index == 0:
                record.first_seconds = seconds
            return out

        return around

    @contextlib.contextmanager
    def _children(self, record: ComponentRecord) -> Iterator[None]:
        """During the component's first call: every module it calls directly, recorded."""
        depth = [0]
        handles = []

        def child(name: str, module: nn.Module) -> Callable[..., Any]:
            def around(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
                if depth[0]:
                    return call(*args, **kwargs)
                depth[0] += 1
                try:
                    unit = record.children.get(name)
                    if unit is None:
                        unit = record.children[name] = Unit(name, 0, 0.0, [], min_ndim(module), module)
                    out, seconds = self._sampled(record, unit.samples, unit.calls, module, "forward", call, args, kwargs)
                finally:
                    depth[0] -= 1
                unit.calls += 1
                unit.seconds += seconds
                return out

            return around

        prefix = f"{record.name}." if record.name else ""
        for name, module in record.root.named_modules():
            if name and not is_container(module):
                handles.append(add_method_hook(module, "forward", child(prefix + name, module), priority=190))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def __enter__(self) -> Recorder:
        try:
            for cname, root in self.components.items():
                for owner in [root, *called_children(root)]:
                    for method in entry_methods(owner):
                        self._handles.append(add_method_hook(owner, method, self._entry(cname, owner, method), priority=190))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in reversed(self._handles):
            handle.remove()
        self._handles.clear()


def replay(sample: Sample, memo: dict[int, Any], dtype: torch.dtype, min_ndim: int, clock: Clock) -> tuple[Any, float]:
    """Run ``sample`` again: its arguments copied afresh (the model's modules shared through
    ``memo``), their floating tensors cast to ``dtype`` (a KV cache's included), the random
    state put back; returns the output and the call's seconds on ``clock``."""
    args, kwargs = copy.deepcopy((sample.call.args, sample.call.kwargs), dict(memo))
    if dtype != torch.float32:
        args = cast_owned(list(args), dtype, min_ndim)
        kwargs = cast_owned(kwargs, dtype, min_ndim)
    torch.set_rng_state(sample.call.rng)
    if sample.call.cuda_rng is not None:
        torch.cuda.set_rng_state_all(sample.call.cuda_rng)
    target = sample.owner if sample.method == "forward" else getattr(sample.owner, sample.method)
    return clock.time(lambda: target(*args, **kwargs))


def seconds_text(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms" if seconds < 1 else f"{seconds:,.2f} s"
