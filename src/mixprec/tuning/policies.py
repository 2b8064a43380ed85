"""A user's own policies in a tune run: measured as candidates beside the presets, so the
result is never worse than them, and what in them will not be used said before the search.

A rule that matches no module of the pipeline (a typo, a policy written for another model)
is found once, before any evaluation, on the pipeline built on the ``meta`` device (no weight
memory) or on the evaluator's own target; it is said in mixprec's words (a warning on the
``mixprec`` logger, once per process, or the caller's printer) and kept in the result's
notes. Workers and in-process evaluations apply the policy without saying it again as a
Python warning with a source path (:func:`quiet_unmatched`).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from mixprec._quote import quote
from mixprec.casting.explain import explain_unmatched
from mixprec.config.names import say_once
from mixprec.policy import Policy
from mixprec.policy.select import UnmatchedRuleWarning, summarise_unmatched

__all__ = ["STEP_PREFIX", "load_policies", "unmatched_notes", "say_notes", "quiet_unmatched"]

logger = logging.getLogger("mixprec")

#: The search step of a user policy: ``policy tuned.toml``.
STEP_PREFIX = "policy "


def load_policies(policies: Sequence[str | Path | Policy]) -> list[tuple[str, Policy]]:
    """``(label, policy)`` for each policy file (its path as given) or :class:`Policy` (its name).

    Raises:
        ValueError: a file that does not exist or does not parse (``PolicyError``), or another kind of value.
    """
    out = []
    for index, entry in enumerate(policies):
        if isinstance(entry, Policy):
            out.append((entry.name or f"#{index}", entry))
        elif isinstance(entry, (str, Path)) and str(entry).strip():
            out.append((str(entry), Policy.load(str(entry).strip())))
        else:
            raise ValueError(f"policies[{index}]: expected a policy file or a mixprec.Policy, got {quote(entry)}")
    return out


def unmatched_notes(policies: Sequence[tuple[str, Policy]], *, pipeline: Any = None, target: Any = None,
                    size: str = "default") -> list[str]:
    """``'<label>: policy rule #0 'x' matches no module; closest: ...'`` for each rule of ``policies``
    that matches no module: of ``target`` (an evaluator's modules) when given, else of the registered
    pipeline or factory ``pipeline`` at ``size``, built on ``meta`` (or for real where its factory
    refuses ``meta``). Empty when there is nothing to look at."""
    if not policies:
        return []
    if target is None and isinstance(pipeline, str):
        from mixprec.pipelines import get
        from mixprec.pipelines._sizes import build_on_meta

        try:
            target = build_on_meta(pipeline, size=size)
        except Exception:  # a factory that cannot build on meta; the real build reports its own errors
            target = get(pipeline, size=size)
    if target is None:
        return []
    return [f"{label}: {line}" for label, policy in policies
            for line in summarise_unmatched(explain_unmatched(target, policy))]


def say_notes(notes: Sequence[str], say: Callable[[str], object] | None = None) -> None:
    """Each note once per process: to ``say`` (the CLI's printer), else a WARNING on the ``mixprec`` logger."""
    say_once(notes, say if say is not None else logger.warning)


@contextlib.contextmanager
def quiet_unmatched() -> Iterator[None]:
    """While applying policies whose unmatched rules were already said: no Python warning for them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnmatchedRuleWarning)
        yield
