"""Dtype errors under a policy: recognise them, find the module that was running, say why.

Real model code fails in reduced precision in ways that are not overflows: a kernel
refuses mixed dtypes (``mat1 and mat2 must have the same dtype``), an op has no 16-bit
kernel on this device (``torch.fft.rfft``: ``Unsupported dtype BFloat16``), or app code
casts its input to ``self.dtype`` (the dtype of its first parameter, now bf16) before
calling such an op. The guard treats these as precision problems: this module names
the innermost module running when the error was raised (from the traceback, so methods
other than ``forward``, such as ``embed_ref`` or ``inference``, count), its storage and
compute dtype and the rule that set them, and lists the scopes a fallback may widen,
narrowest first.
"""

from __future__ import annotations

import linecache
import os
import threading
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Callable

import torch
from torch import nn

from mixprec.casting.hooks import own_tensors
from mixprec.casting.meet import is_dtype_error, storage_key
from mixprec.policy.tree import called_children, first_weight_owner, is_container
from mixprec.policy import ModulePlan, Policy

__all__ = ["is_dtype_error", "DtypeErrorReport", "PrecisionDtypeError", "locate", "candidate_scopes", "direct_callees",
           "same_class", "counterparts", "weight_owners"]

#: Frames of torch's own call machinery: the module they belong to is running, but the
#: method name to report is that of the next frame of the same module.
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_CALL_MACHINERY = {"_call_impl", "_wrapped_call_impl", "__call__", "inner", "wrapper", "decorate_context"}


@dataclass(frozen=True)
class Frame:
    """A module that was running when the error was raised, and in which method."""

    module: str
    type: str
    method: str
    where: str


@dataclass(frozen=True)
class DtypeErrorReport:
    """Where a dtype error was raised under a policy.

    Attributes:
        component: the component whose call failed.
        module: qualified name of the innermost module that was running.
        type: its class name.
        method: the method it was running (``forward``, ``embed_ref``, ...).
        where: ``file:line`` of the innermost frame of that module's code.
        raised_at: ``file:line (function)`` where the error itself was raised.
        storage: the module's storage dtype under the policy.
        compute: its compute dtype.
        rule: the rule that set its storage (``#0 '*'``) or ``default (fp32)``.
        error: the original message (first line).
        stack: the running modules, outermost first.
    """

    component: str
    module: str
    type: str
    method: str
    where: str
    raised_at: str
    storage: str
    compute: str
    rule: str
    error: str
    stack: tuple[Frame, ...] = field(default=())
    #: The source line that raised (the op), when it can be read.
    code: str = ""
    #: The op that refused its inputs' dtypes, as a re-run found it: ``torch.layer_norm
    #: (bfloat16 and float32)``; empty where only torch's wording said so.
    op: str = ""
    #: How many modules of the component share the innermost module's class.
    same_class: int = 1

    def suggestion(self) -> str:
        """A keep-fp32 rule for the innermost module (for every module of its class, where
        there are others: they run the same code), as TOML to append to a policy file."""
        match = f"type:{self.type}" if self.same_class > 1 else self.module
        return f'[[rules]]\nmatch = "{match}"\nkeep_fp32 = true\nreason = "dtype error in {self.type}.{self.method}: {_toml_safe(self.error)}"\n'

    def __str__(self) -> str:
        running = " > ".join(f"{f.module or '(root)'} ({f.type}.{f.method})" for f in self.stack)
        return (f"{self.error!r} in {self.module} ({self.type}.{self.method}, storage {self.storage}, compute {self.compute}, "
                f"set by rule {self.rule}) at {self.where}; raised at {self.raised_at}"
                + (f" by `{self.code}`" if self.code else "")
                + (f"; the op {self.op} runs when its inputs are given one dtype" if self.op else "")
                + (f"; modules running: {running}" if len(self.stack) > 1 else ""))


def _toml_safe(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', "'")[:120]


class PrecisionDtypeError(RuntimeError):
    """A call under a policy failed with a dtype error; the report says where and how to fix it."""

    def __init__(self, report: DtypeErrorReport, note: str = ""):
        self.report = report
        others = f" and the other {report.type} modules (they run the same code)" if report.same_class > 1 else ""
        message = (f"dtype error under the precision policy: {report}. "
                   f"To keep that module{others} in fp32, add to the policy:\n{report.suggestion()}"
                   "When that line mixes what a module it called returned with a tensor of its own, handing on only that "
                   "module's output in fp32 is narrower (output_dtype = \"fp32\" on that module). When the failing code is "
                   "the app's own (for example it casts to self.dtype before an op without a 16-bit kernel), "
                   "mixprec.guard(applied, on_nonfinite='fallback') finds the narrowest fix.")
        super().__init__(message + (f"\n{note}" if note else ""))


def _in_torch(filename: str) -> bool:
    return filename.startswith(_TORCH_DIR)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def locate(exc: BaseException, component: str, root: nn.Module, plans: list[ModulePlan], policy: Policy,
           rescued: tuple | None = None) -> DtypeErrorReport:
    """Name the innermost module of ``component`` that was running when ``exc`` was raised.

    ``rescued``: the op a re-run got past by giving its inputs one dtype (``WidenMode.seen``).
    """
    by_id = {id(p.module): p for p in plans}
    frames: list[Frame] = []
    last: TracebackType | None = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        owner = frame.f_locals.get("self")
        plan = by_id.get(id(owner)) if isinstance(owner, nn.Module) else None
        if plan is not None:
            name = frame.f_code.co_name
            where = f"{frame.f_code.co_filename}:{tb.tb_lineno}"
            if frames and frames[-1].module == plan.qualname and name in _CALL_MACHINERY:
                pass  # torch's call machinery of the module already on top
            elif frames and frames[-1].module == plan.qualname and frames[-1].method in _CALL_MACHINERY:
                frames[-1] = Frame(plan.qualname, plan.type_name, name, where)
            elif frames and frames[-1].module == plan.qualname and frames[-1].method == name:
                # A subclass calling its base's method (``super().forward(x.float())``): the
                # line to report is the model's own, not the torch code it called.
                if not (_in_torch(frame.f_code.co_filename) and not _in_torch(frames[-1].where)):
                    frames[-1] = Frame(plan.qualname, plan.type_name, name, where)
            else:
                frames.append(Frame(plan.qualname, plan.type_name, name, where))
        last = tb
        tb = tb.tb_next
    root_plan = by_id[id(root)]
    top = frames[-1] if frames else Frame(root_plan.qualname or component, root_plan.type_name, "?", "?")
    plan = next((p for p in plans if p.qualname == top.module), root_plan)
    index = plan.decided_by.get("storage")
    rule = f"#{index} {policy.rules[index].match!r}" if index is not None else "default (fp32)"
    raised_at = f"{last.tb_frame.f_code.co_filename}:{last.tb_lineno} ({last.tb_frame.f_code.co_name})" if last else "?"
    code = linecache.getline(last.tb_frame.f_code.co_filename, last.tb_lineno).strip() if last else ""
    return DtypeErrorReport(component=component, module=top.module, type=top.type, method=top.method, where=top.where,
                            raised_at=raised_at, storage=plan.storage, compute=plan.compute_dtype, rule=rule,
                            error=_first_line(exc), stack=tuple(frames), code=code,
                            op=f"{rescued[0]} ({' and '.join(rescued[1])})" if rescued else "",
                            same_class=len(same_class(plan.qualname, root, plans)) if plan is not root_plan else 1)


def same_class(name: str, root: nn.Module, plans: list[ModulePlan]) -> list[str]:
    """``name`` first, then every other module of exactly its class under ``root`` that is not
    already fp32 in storage and compute: they run the same code, so they fail the same way."""
    return counterparts(name, name, root, plans)


def counterparts(scope: str, reader: str, root: nn.Module, plans: list[ModulePlan]) -> list[str]:
    """``scope`` first, then the same place under every other module of ``reader``'s class in
    ``root``: ``scope`` itself or a module inside ``reader`` (``layers.0.codebook`` read by
    ``layers.0`` gives ``layers.1.codebook``, ...), where it is not already fp32 throughout."""
    by_name = {p.qualname: p for p in plans}
    if reader not in by_name or not (scope == reader or scope.startswith(f"{reader}.") or not reader):
        return [scope]
    rest = scope[len(reader):] if reader else f".{scope}"
    target = by_name[reader].module
    inside = {id(m) for m in root.modules()}
    out = [scope]
    for p in plans:
        if type(p.module) is not type(target) or id(p.module) not in inside:
            continue
        name = f"{p.qualname}{rest}" if p.qualname else rest.lstrip(".")
        other = by_name.get(name)
        if name not in out and other is not None and (other.storage != "fp32" or other.compute_dtype != "fp32"):
            out.append(name)
    return out


def weight_owners(read: set[int], plans: list[ModulePlan]) -> list[str]:
    """The modules whose own 16-bit tensors a failing op was handed (``read``: their storages,
    :func:`~mixprec.casting.meet.storage_key`, so views such as ``w.t()`` count)."""
    return [p.qualname for p in plans if any(storage_key(t) in read for _, t in own_tensors(p.module))] if read else []


def candidate_scopes(report: DtypeErrorReport, plans: list[ModulePlan], owners: list[str] = ()) -> list[str]:
    """Scopes a fallback may pin to fp32, narrowest first.

    0. the modules whose 16-bit weights the failing op itself read (``owners``: a child's
       weights read by its parent's code, ``self.codebook.weight``);
    1. the innermost running module;
    2. the modules whose parameters code on the stack reads its dtype from: for each
       running module (innermost first), the owner of its first parameter and of each
       called child's first parameter (``self.dtype`` properties read exactly these);
    3. the enclosing blocks of the innermost module, up to the component.

    Only modules that are not already fp32 in storage and compute are listed.
    """
    by_name = {p.qualname: p for p in plans}
    by_id = {id(p.module): p for p in plans}
    out: list[str] = []

    def add(name: str | None) -> None:
        plan = by_name.get(name) if name is not None else None
        if plan is not None and name not in out and (plan.storage != "fp32" or plan.compute_dtype != "fp32"):
            out.append(name)

    for owner in owners:
        if owner != report.component:
            add(owner)
    if report.module != report.component:
        add(report.module)  # the component itself is the widest scope: tried last
    for frame in reversed(report.stack):
        plan = by_name.get(frame.module)
        if plan is None:
            continue
        for sub in (plan.module, *called_children(plan.module)):
            owner = first_weight_owner(sub)
            owner_plan = by_id.get(id(owner)) if owner is not None else None
            add(owner_plan.qualname if owner_plan is not None else None)
    name = report.module
    while "." in name:
        name = name.rpartition(".")[0]
        if name in by_name and not is_container(by_name[name].module):
            add(name)
    add(report.component)
    return out


def direct_callees(report: DtypeErrorReport, plans: list[ModulePlan], rerun: Callable[[], Any]) -> list[str]:
    """Modules the failing module's own code called before the error, last first.

    Re-runs the call (it fails again) with hooks on the failing module's subtree and
    keeps the calls made while no other module of that subtree was running: the modules
    whose outputs the failing code itself received. Only those computing in 16 bits with
    floating weights and not already handing back fp32 are listed.
    """
    by_name = {p.qualname: p for p in plans}
    by_id = {id(p.module): p for p in plans}
    failing = by_name.get(report.module)
    if failing is None:
        return []
    calls: list[str] = []
    depth = [0]
    caller = threading.get_ident()

    def pre(module, args):
        if threading.get_ident() != caller:
            return  # another thread's call of the same model
        if depth[0] == 0:
            calls.append(by_id[id(module)].qualname)
        depth[0] += 1

    def post(module, args, output):
        if threading.get_ident() == caller:
            depth[0] -= 1

    handles = []
    for sub in failing.module.modules():
        if sub is not failing.module and id(sub) in by_id and not is_container(sub):
            handles += [sub.register_forward_pre_hook(pre), sub.register_forward_hook(post, always_call=True)]
    try:
        rerun()
    except (RuntimeError, TypeError, NotImplementedError):
        pass  # the error this is about
    finally:
        for handle in handles:
            handle.remove()
    out: list[str] = []
    for name in reversed(calls):
        plan = by_name[name]
        if name in out or plan.compute_dtype == "fp32" or plan.output_dtype == "fp32":
            continue
        if any(t.is_floating_point() for t in plan.module.parameters()):
            out.append(name)
    return out


def add_note(exc: BaseException, note: str) -> Any:
    """``exc.add_note`` where Python has it (3.11+)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    return exc
