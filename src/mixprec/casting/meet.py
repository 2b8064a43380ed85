"""Where dtypes meet inside a component: an op that refuses its inputs runs in the wider dtype.

Real model code makes tensors of its own inside a 16-bit component and hands them to
ops together with the component's activations: an fp32 resampling kernel passed to
``F.conv1d``, an fp32 alignment matrix in an ``einsum``, a window, ``torch.zeros``. Or
it calls an op that has no 16-bit kernel on this device (``torch.linalg.inv``,
``torch.fft.rfft`` of bf16 on CPU). In fp32 nothing of this fails; in 16 bits the op
raises a dtype error, wherever it sits: in a module's ``forward``, in a component's own
method, in a library function the model calls.

One rule covers every such place, without a list of ops and without reading the
model's source: when a call of an applied component fails with a dtype error
(:func:`is_dtype_error`), the call runs again under :class:`WidenMode`, in which any op
that raises a dtype error is retried once with its floating tensors in the widest
floating dtype among them (fp32 where they were all 16-bit, or where bf16 met fp16).
Ops that succeed are untouched, so the result is what fp32 type promotion would have
given at exactly the places that needed it. The component keeps the mode from then on
(:class:`DtypeMeet` is per entry method of a component, so a failure in ``decode``
does not slow ``forward``), and one warning names the op, the dtypes and where it was
called from.

Nothing is paid until an op fails: the hook is a ``try`` around the call. Under the
mode every op of that component's call pays a Python check (about 1 µs), measured in
``benchmarks/bench_leaf_casts.py --wrappers meet``.
"""

from __future__ import annotations

import os
import re
import traceback
import warnings
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode

from mixprec.casting.hooks import CallStack, cast_floats

__all__ = ["DtypeMeet", "WidenMode", "is_dtype_error", "may_be_about_dtypes", "OP_ERRORS", "storage_key", "float_dtypes", "widest", "DEFER", "DeferDtypeErrors"]

#: Set (as a count) on a component's root while a numerics guard watches it: a dtype
#: error is then the guard's to fix, with a pin it remembers, so it is not widened here.
DEFER = "_mixprec_dtype_errors_deferred"

# Messages of dtype failures in torch's kernels (CPU and CUDA), as of torch 2.3 - 2.13.
_DTYPE_MESSAGES = re.compile(
    "|".join((
        r"must have the same (?:dtype|scalar type)",
        r"to have the same dtype",
        r"expected scalar type \w+ but found \w+",
        r"Unsupported dtype",
        r"not implemented for '(?:BFloat16|Half)'",
        r"should be the same",  # Input type (float) and bias type (c10::BFloat16) should be the same
        r"does not match (?:weight|bias) dtype",
        r"dtype mismatch",
        r"mismatched dtypes?",
        r"expected (?:both|all) (?:inputs|tensors) to have (?:the )?same dtype",
        r"Expected (?:object|tensor) of scalar type",
        r"Expected .{0,40}dtype",
        r"found dtype \w+ but expected",
        r"Unsupported input dtype",
        r"(?:BFloat16|Half) is not supported",
        r"does not support (?:bf16|bfloat16|half|fp16|float16)",
        r"[Ll]ow precision dtypes not supported",
        r"doesn't support tensors of type",
        r"(?:expected|unsupported|not supported|not implemented|but got).{0,120}\b(?:BFloat16|Half|bfloat16|float16)\b",
    )),
    re.IGNORECASE,
)

_HALF = (torch.float16, torch.bfloat16)


#: What a failing op may raise when the dtypes of its inputs are the cause.
OP_ERRORS = (RuntimeError, TypeError, NotImplementedError)


def is_dtype_error(exc: BaseException) -> bool:
    """Whether ``exc`` reads as a dtype failure of a kernel (mismatched or unsupported dtype).

    A hint from torch's wording, no more: kernels word the same failure in many ways
    (``mixed dtype (CPU): expect parameter to have scalar type of Float``), so what decides
    is :func:`may_be_about_dtypes` and a re-run under :class:`WidenMode`, in which an op
    that failed counts as a dtype clash only when the same call with its floating inputs
    made one dtype succeeds.
    """
    return isinstance(exc, OP_ERRORS) and bool(_DTYPE_MESSAGES.search(str(exc)))


def may_be_about_dtypes(exc: BaseException) -> bool:
    """Whether ``exc`` is of a kind a dtype clash raises, and worth a re-run that finds out.

    Running out of memory is not (its re-run would only fail again, slowly); an error the
    re-run needs to tell apart from a dtype clash is any other error an op raises.
    """
    return isinstance(exc, OP_ERRORS) and not isinstance(exc, torch.OutOfMemoryError)


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors in ``obj`` (tensors, tuples, lists, dict values, nested)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def float_dtypes(obj: Any, found: set[torch.dtype] | None = None) -> set[torch.dtype]:
    """The floating dtypes of the tensors in ``obj`` (tensors, tuples, lists, dict values)."""
    found = set() if found is None else found
    found.update(t.dtype for t in _tensors(obj) if t.is_floating_point())
    return found


def storage_key(t: torch.Tensor) -> int | None:
    """Where ``t``'s memory starts: the same for a weight and every view of it (``w.t()``)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse, meta and other storage-less layouts
        return None


def _half_ids(obj: Any) -> set[int]:
    """The storages (:func:`storage_key`) of the 16-bit tensors in ``obj``."""
    return {key for t in _tensors(obj) if t.dtype in _HALF and (key := storage_key(t))}


def widest(dtypes: set[torch.dtype]) -> torch.dtype:
    """The dtype an op refusing ``dtypes`` runs in: the widest of them, and fp32 where
    none is wider than 16 bits (a lone 16-bit dtype without a kernel, or bf16 with fp16)."""
    wide = max(dtypes, key=lambda d: torch.finfo(d).bits)
    return torch.float32 if wide in _HALF else wide


def _name(func: Callable[..., Any]) -> str:
    name = getattr(func, "__name__", None) or repr(func)
    qualname = getattr(func, "__qualname__", None) or name
    if qualname.startswith(("TensorBase.", "_TensorBase.", "Tensor.")):
        return f"Tensor.{name}"
    module = getattr(func, "__module__", None) or ""
    if getattr(torch, name, None) is func:
        return f"torch.{name}"  # torch.einsum, not torch.functional.einsum
    if module.startswith("torch._C._"):  # torch.linalg.inv: module torch._C._linalg, named linalg_inv
        short = module[len("torch._C._"):]
        if name.startswith(short + "_") and getattr(getattr(torch, short, None), name[len(short) + 1:], None) is func:
            return f"torch.{short}.{name[len(short) + 1:]}"
    if not module or module.startswith("torch._C") or qualname.startswith("_VariableFunctionsClass."):
        return f"torch.{name}"
    return f"{module}.{name}"


def _call_site() -> str:
    """Where the op was called from: the innermost frame outside torch and this package."""
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    here = os.path.dirname(os.path.dirname(__file__)) + os.sep
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not frame.filename.startswith((torch_dir, here)):
            return f"{frame.filename}:{frame.lineno} ({frame.name})"
    return "unknown"


class WidenMode(TorchFunctionMode):
    """While active, an op that fails is retried once in the widest floating dtype of its
    inputs, where those differ or include a 16-bit one; ``seen`` collects (op, input
    dtypes, dtype run in, call site) of each op the retry rescued.

    Whether a failure was about dtypes is decided by what happened, not by torch's
    wording: the op failed, and the same call with its floating inputs made one dtype
    succeeded. An op whose retry fails too raises its first error, unchanged; one whose
    floating inputs are all one wide dtype is not retried at all.
    """

    def __init__(self, seen: list[tuple[str, tuple[str, ...], str, str]] | None = None,
                 read: list[set[int]] | None = None) -> None:
        super().__init__()
        self.seen = [] if seen is None else seen
        #: Per rescued op (when given): the storage of each 16-bit tensor it was handed
        #: (:func:`storage_key`), so a caller can tell whose weights the op read, views included.
        self.read = read

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            return func(*args, **kwargs)
        except OP_ERRORS as exc:
            name = getattr(func, "__name__", "")
            # In-place ops and ``out=`` write into a tensor of their own dtype: widening
            # their inputs would not change what they refuse.
            if name.endswith("_") or "out" in kwargs or not may_be_about_dtypes(exc):
                raise
            dtypes = float_dtypes((args, kwargs))
            if not dtypes or (len(dtypes) == 1 and next(iter(dtypes)) not in _HALF):
                raise
            wide = widest(dtypes)
            try:
                result = func(*cast_floats(args, wide), **cast_floats(kwargs, wide))
            except OP_ERRORS:
                raise exc from None  # not the dtypes: the op's own failure, as it was
            if len(self.seen) < 32:
                self.seen.append((_name(func), tuple(sorted(str(d).replace("torch.", "") for d in dtypes)),
                                  str(wide).replace("torch.", ""), _call_site()))
                if self.read is not None:
                    self.read.append(_half_ids((args, kwargs)))
            return result


class DtypeMeet:
    """Around one entry method of an applied component: re-runs a call that failed with
    a dtype error under :class:`WidenMode`, and keeps the mode for later calls.

    Installed as the outermost of apply's method hooks (inside the guard's), so the
    re-run starts from the caller's own arguments and goes through the component's
    casts again. A re-run that fails with another dtype error raises the original one;
    one that gets past the dtypes and fails otherwise raises that error, the model's
    own (what its fp32 run gives). Either way the component keeps running without the mode.
    """

    def __init__(self, root: Any, component: str, method: str) -> None:
        self.root, self.component, self.method = root, component, method
        self.widen = False
        self.seen: list[tuple[str, tuple[str, ...], str, str]] = []
        self._retrying = CallStack()  # per thread; a copy of the model has no re-run in progress

    def around(self, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if getattr(self.root, DEFER, 0):
            return call(*args, **kwargs)
        if self.widen:
            with WidenMode(self.seen):
                return call(*args, **kwargs)
        try:
            return call(*args, **kwargs)
        except OP_ERRORS as exc:
            if not may_be_about_dtypes(exc) or self._retrying.items:
                raise
            original = exc
        # Whatever torch's wording, the re-run finds out: an op that failed and passes with
        # its inputs in one dtype was a dtype clash; nothing widened, the error is the model's.
        self._retrying.items.append(True)
        before = len(self.seen)
        try:
            with WidenMode(self.seen):
                output = call(*args, **kwargs)
        except BaseException as again:
            if len(self.seen) == before or is_dtype_error(again):
                raise original from None
            raise  # past the dtypes, the model fails on its own: its error, as fp32 gives it
        finally:
            self._retrying.items.pop()
        if len(self.seen) == before:
            if not is_dtype_error(original):
                raise original  # the re-run passed by itself: the model's own (state-dependent) failure
            # The re-run passed without widening anything: the failure was not a meeting of
            # dtypes this rule fixes (e.g. state the first call changed); say so, keep it off.
            warnings.warn(f"mixprec: {self.component}.{self.method} failed with a dtype error ({original}) and passed "
                          "when run again; nothing was widened", stacklevel=3)
            return output
        self.widen = True
        ops = list(dict.fromkeys(f"{op} ({' and '.join(dtypes)}, called from {where})" for op, dtypes, _, where in self.seen[before:]))
        component = f"component {self.component!r}" if self.component else "the model"
        warnings.warn(
            f"mixprec: in {component} ({self.method}), ops refused the dtypes of their inputs: "
            f"{'; '.join(ops[:3])}{f'; and {len(ops) - 3} more' if len(ops) > 3 else ''}. Such ops now run in the "
            f"wider dtype ({self.seen[before][2]}) in {self.method}; this call was run again", stacklevel=3)
        return output


class DeferDtypeErrors:
    """While it lasts, dtype errors in ``root``'s calls pass through :class:`DtypeMeet`
    unwidened, to whoever watches the calls (the numerics guard); :meth:`remove` ends it."""

    def __init__(self, root: Any) -> None:
        self.root = root
        root.__dict__[DEFER] = root.__dict__.get(DEFER, 0) + 1

    def remove(self) -> None:
        if self.root is None:
            return
        count = self.root.__dict__.get(DEFER, 0) - 1
        if count > 0:
            self.root.__dict__[DEFER] = count
        else:
            self.root.__dict__.pop(DEFER, None)
        self.root = None
