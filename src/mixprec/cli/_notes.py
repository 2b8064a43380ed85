"""The pre-run note of ``bench`` and ``tune``: what a user's policy holds that will not be used.

A policy file's rules that match no module of the pipeline are found once, before any worker
starts (on the pipeline built on the ``meta`` device), said here on stderr in mixprec's words,
and kept in the run's notes (``bench``) or the result's (``tune``). The workers do not say them
again as Python warnings. The same note comes with ``--executor local`` and ``--executor ray``.

Each fact is said once per command, here, before the run: the configurations added, moved or left
out (``note:``), the unmatched rules (``warning:``) and, as the run begins, its plan. The run keeps
them in its notes; the table printed after the run leaves out those already said
(:func:`say_pre_run` returns them).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from mixprec.cli._common import err_console
from mixprec.cli._text import say

__all__ = ["bench_pre_run_notes", "say_pre_run"]


def bench_pre_run_notes(specs: list[Any], names: Iterable[str], *, size: str, seed: int) -> dict[str, list[str]]:
    """For each pipeline of ``names``: the rules of the policy-file configurations among ``specs``
    that match none of its modules (:func:`mixprec.bench.configs.unmatched_notes`)."""
    from mixprec.bench.configs import unmatched_notes

    return {name: unmatched_notes(specs, name, size=size, seed=seed) for name in names}


def say_pre_run(notes: dict[str, list[str]], general: Sequence[str] = ()) -> dict[str, set[str]]:
    """Say on stderr what this command found before the run: ``general`` (the configurations added,
    moved or left out, for every pipeline) as notes, then each pipeline's ``notes`` as warnings,
    prefixed with the pipeline. Returns, per pipeline, the notes said, which the run's table then
    leaves out: one fact, said once."""
    for line in dict.fromkeys(general):
        say(err_console, "note: ", line)
    for name, lines in notes.items():
        for line in lines:
            say(err_console, ("warning:", "yellow"), f" {name}: {line}")
    return {name: {*general, *lines} for name, lines in notes.items()}
