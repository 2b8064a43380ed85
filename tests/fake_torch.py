"""A stand-in for a torch older than 2.9: only the legacy numeric flags exist.

It mirrors the legacy behaviour that matters to mixprec: ``set_float32_matmul_precision``
also flips ``torch.backends.cuda.matmul.allow_tf32`` (``high``/``medium`` -> True).
"""

from __future__ import annotations

from types import SimpleNamespace


class _Matmul:
    def __init__(self, owner: "OldTorch"):
        self._owner = owner
        self.allow_fp16_reduced_precision_reduction = True
        self._bf16 = True

    @property
    def allow_bf16_reduced_precision_reduction(self) -> bool:
        return self._bf16

    @allow_bf16_reduced_precision_reduction.setter
    def allow_bf16_reduced_precision_reduction(self, value: bool) -> None:
        if self._owner.fail_once_on_bf16:
            self._owner.fail_once_on_bf16 = False
            raise RuntimeError("simulated failure writing allow_bf16_reduced_precision_reduction")
        self._bf16 = bool(value)

    @property
    def allow_tf32(self) -> bool:
        return self._owner._level != "highest"

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        self._owner._level = "high" if value else "highest"


class _Cudnn:
    def __init__(self, owner: "OldTorch"):
        self._owner = owner
        self._allow = True

    @property
    def allow_tf32(self) -> bool:
        return self._allow

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        self._allow = bool(value)


class OldTorch:
    """Just enough of ``torch`` 2.3 for mixprec.device.backends."""

    __version__ = "2.3.1"

    def __init__(self, *, fail_once_on_bf16: bool = False):
        self._level = "highest"
        self.fail_once_on_bf16 = fail_once_on_bf16
        self.writes: list[str] = []
        self.backends = SimpleNamespace(cuda=SimpleNamespace(matmul=_Matmul(self)), cudnn=_Cudnn(self))
        self.cuda = SimpleNamespace(is_available=lambda: False)

    def set_float32_matmul_precision(self, level: str) -> None:
        if level not in ("highest", "high", "medium"):
            raise RuntimeError(f"Invalid precision {level}")
        self.writes.append(level)
        self._level = level

    def get_float32_matmul_precision(self) -> str:
        return self._level
