"""Ops without 16-bit kernels: FFTs, STFTs and complex construction run in fp32.

Audio models compute spectra inside their own code: a vocoder's inverse STFT
(``torch.complex`` then ``torch.istft``), a speaker encoder's Kaldi filter bank
(``torch.fft.rfft``), a tokenizer's log-mel front end (``torch.stft``). On CPU these
ops have no bf16 kernel (``Unsupported dtype BFloat16``) and CUDA has none for bf16
either, so a module stored in bf16 that feeds them fails. There is no complex bf16
type at all: the result of such an op is complex64 / fp32 whatever its input was.

:class:`SpectralUpcastMode` upcasts 16-bit inputs of exactly these ops to fp32 (a
lossless cast) while a scoped module runs. Scopes go only on modules whose class is
defined in a source file that uses such ops (found by reading the file once), so
models without spectral code pay nothing.
"""

from __future__ import annotations

import functools
import inspect
import re
import threading
from typing import Any, Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = ["SpectralUpcastMode", "SpectralScope", "uses_spectral_ops"]

_HALF = (torch.float16, torch.bfloat16)
# Dicts, not sets: ``func in`` a set of functions breaks the graph under torch < 2.7's
# Dynamo (it cannot trace a set's ``__contains__``); a dict's is traced on 2.6 - 2.13.
_SPECTRAL: dict[Callable[..., Any], bool] = dict.fromkeys((
    torch.stft, torch.istft, torch.Tensor.stft, torch.Tensor.istft,
    torch.complex, torch.polar, torch.view_as_complex,
    *(getattr(torch.fft, name) for name in (
        "fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft", "rfft2", "irfft2", "rfftn", "irfftn",
        "hfft", "ihfft", "hfft2", "ihfft2", "hfftn", "ihfftn",
    ) if hasattr(torch.fft, name)),
), True)
_MATMULS: dict[Callable[..., Any], bool] = dict.fromkeys((
    torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.mm, torch.Tensor.mm,
    torch.bmm, torch.Tensor.bmm, torch.einsum, torch.nn.functional.linear, torch.nn.functional.conv1d,
), True)
# Calls, not mentions: docstrings that speak of "log-mel spectrograms" do not count.
_SOURCE_PATTERN = re.compile(r"(?:\bfft\.\w+|\b(?:stft|istft|rfft|irfft|fbank|view_as_complex|polar)|\w*spectrogram|torch\.complex)\s*\(")
_local = threading.local()
# The importing thread's stack exists from the start: created lazily inside a compiled
# region, its appearance after the first call would be a guard failure (a recompile).
_local.stack = []


def _stack() -> list[tuple[int, SpectralUpcastMode | None]]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def _up(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor) and obj.dtype in _HALF:
        return obj.float()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_up(o) for o in obj)
    return obj


def _mixed(args: tuple) -> bool:
    dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()}
    return len(dtypes) > 1 and bool(dtypes & set(_HALF))


class SpectralUpcastMode(TorchFunctionMode):
    """While active, FFT / STFT / complex-construction ops get fp32 instead of 16-bit inputs.

    Their results are fp32, so spectral code then meets its own 16-bit buffers (a mel
    filter bank stored with the weights) in a matrix product: a product of mixed float
    dtypes runs in fp32 too, as elementwise ops already promote.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SPECTRAL:
            return func(*_up(args), **{k: _up(v) for k, v in kwargs.items()})
        if func in _MATMULS and _mixed(args):
            return func(*_up(args), **kwargs)
        return func(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def _file_uses_spectral_ops(path: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return bool(_SOURCE_PATTERN.search(handle.read()))
    except OSError:
        return False


def uses_spectral_ops(module: nn.Module) -> bool:
    """Whether the source file of ``module``'s class (or a base class's) mentions spectral ops."""
    for cls in type(module).__mro__:
        if cls is object or cls.__module__.startswith("torch."):
            continue
        try:
            path = inspect.getsourcefile(cls)
        except (TypeError, OSError):
            continue
        if path and _file_uses_spectral_ops(path):
            return True
    return False


class SpectralScope:
    """Enter :class:`SpectralUpcastMode` for the outermost scoped call on this thread.

    Entries live on one per-thread stack keyed by the module that entered, not on the
    scope object: a guard fallback re-applies the policy in the middle of a component's
    call, so the hook that leaves may belong to a new scope object.
    """

    def enter(self, key: int = 0) -> None:
        stack = _stack()
        if any(mode is not None for _, mode in stack):
            stack.append((key, None))
            return
        mode = SpectralUpcastMode()
        mode.__enter__()
        stack.append((key, mode))

    def leave(self, key: int = 0) -> None:
        stack = _stack()
        if stack and stack[-1][0] == key:
            _, mode = stack.pop()
            if mode is not None:
                mode.__exit__(None, None, None)

    def pre(self, module, args):
        self.enter(id(module))

    def post(self, module, args, output):
        self.leave(id(module))

    def around(self, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """A method hook (see :func:`mixprec.casting.hooks.add_method_hook`) for methods other than ``forward``."""
        key = id(call)
        self.enter(key)
        try:
            return call(*args, **kwargs)
        finally:
            self.leave(key)
