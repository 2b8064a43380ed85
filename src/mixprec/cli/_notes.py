"""The pre-run note of ``bench`` and ``tune``: what a user's policy holds that will not be used.

A policy file's rules that match no module of the pipeline are found once, before any worker
starts (on the pipeline built on the ``meta`` device), said here on stderr in mixprec's words,
and kept in the run's notes (``bench``) or the result's (``tune``). The workers do not say them
again as Python warnings. The same note comes with ``--executor local`` and ``--executor ray``.
"""

from __future__ import annotations

from typing import Any, Iterable

from mixprec.cli._common import err_console
from mixprec.cli._text import say

__all__ = ["bench_pre_run_notes", "say_pre_run"]


def bench_pre_run_notes(specs: list[Any], names: Iterable[str], *, size: str, seed: int) -> dict[str, list[str]]:
    """For each pipeline of ``names``: the rules of the policy-file configurations among ``specs``
    that match none of its modules (:func:`mixprec.bench.configs.unmatched_notes`)."""
    from mixprec.bench.configs import unmatched_notes

    return {name: unmatched_notes(specs, name, size=size, seed=seed) for name in names}


def say_pre_run(notes: dict[str, list[str]]) -> None:
    """Each note on stderr as a warning, prefixed with its pipeline."""
    for name, lines in notes.items():
        for line in lines:
            say(err_console, ("warning:", "yellow"), f" {name}: {line}")
