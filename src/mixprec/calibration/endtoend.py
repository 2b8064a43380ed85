"""The end-to-end steps of a calibration made per component (:mod:`~mixprec.calibration.components`).

:meth:`EndToEnd.check` runs the composed policy once, whole, against fp32's output with the
preset's floor; where it misses, the component with the largest own error moves back to a
safer option (for ``memory`` its 16-bit weights before fp32; otherwise fp32) and the check
runs again, within the time limit. :meth:`EndToEnd.confirm` then, where time allows, times
the kept policy against the rule-based one in paired whole runs: the rules come back where
they run supported faster and meet the floor.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from mixprec.calibration.candidates import REFERENCE
from mixprec.calibration.decide import MIN_ROUNDS, compare
from mixprec.calibration.options import Part, eligible
from mixprec.calibration.trials import _applied, detached, output_quality, short
from mixprec.policy import Policy

__all__ = ["EndToEnd", "PER_COMPONENT", "db"]

#: The label of a composed choice (components keeping different candidates).
PER_COMPONENT = "per-component"


def db(value: float) -> str:
    return "exact" if value == math.inf else f"{value:.1f} dB"


class EndToEnd:
    """The end-to-end check and the closing paired whole runs, on the state of a per-component calibration."""

    # Set by the calibration (see mixprec.calibration.components._PerComponent).
    name: str
    floor: float
    time_limit: float
    target: Any
    parts: dict[str, Part]
    choice: dict[str, str]
    chosen: str
    policy: Policy

    def check(self) -> None:
        while self.chosen != REFERENCE:
            expected = self.reference_wall * min(1.0, self.predicted(self.choice) / self.total_s) * 1.1
            if self.elapsed() + expected > self.time_limit:  # the 10% over the limit is the estimate's slack
                self._no_time_to_check()
                return
            try:
                with _applied(self.target, self.policy), torch.inference_mode():
                    out, self.check_s = self.clock.time(lambda: self.run(self.forced))
                    self.check_sqnr, bad = output_quality(detached(out), self.ref)
            except Exception as exc:  # noqa: BLE001 - the composition fails: back to the rules, said with its error
                self.reasons.append(f"the composed policy failed end to end ({short(exc)}): the rule-based choice stays")
                self.policy, self.chosen, self.check_sqnr = self._rules(), "rules", None
                self.check_skipped = True
                return
            if not bad and self.check_sqnr >= self.floor:
                return
            movable = {p.name: self._safer(p) for p in self.parts.values()}
            movable = {c: o for c, o in movable.items() if o is not None}
            if not movable:  # nothing left to move back: the floor is not met, and it is said
                self.reasons.append(f"end to end {self.check_sqnr:.1f} dB, below {self.name}'s floor of {self.floor:g} dB, "
                                    "with no component left to move back (remembered decisions stay as they are)")
                self.check_skipped = True
                return
            # The largest own error first; a component not timed (its own error unknown) after those measured.
            worst = min((self.parts[c] for c in movable), key=lambda p: (
                p.options[self.choice[p.name]].sqnr_db is None, p.options[self.choice[p.name]].sqnr_db or 0.0,
                -p.record.seconds))
            safer = movable[worst.name]
            self.backed.append(f"{worst.name} ({self.choice[worst.name]} to {safer})")
            self.reasons.append(f"end to end {self.check_sqnr:.1f} dB{f' with {bad} non-finite values' if bad else ''}, "
                                f"below {self.name}'s floor of {self.floor:g} dB: {worst.name}, the largest own error, "
                                f"moves back to {safer}")
            worst.note = (f"moved back from {self.choice[worst.name]} to {safer}: the composition's output missed the "
                          "floor end to end")
            self.choice[worst.name] = worst.kept = safer
            self.policy, self.chosen = self.policy_for(self.choice)
        self.check_sqnr = math.inf

    def _safer(self, part: Part) -> str | None:
        """The option ``part`` moves back to: the fastest the preset may choose with a smaller own error than its
        current one (``memory``: its 16-bit weights before fp32), else fp32; ``None`` where it is fp32 already."""
        current = part.options.get(self.choice[part.name])
        if current is None or current.label == REFERENCE or REFERENCE not in part.options:
            return None
        own = current.sqnr_db if current.sqnr_db is not None else -math.inf
        safer = [o for o in part.options.values() if o.out is None and o.label != REFERENCE and eligible(o, self.name)
                 and o.sqnr_db is not None and o.sqnr_db > own]
        return max(safer, key=lambda o: self.ratio_of(part, o.label)).label if safer else REFERENCE

    def confirm(self) -> None:
        """Where time allows, paired whole runs of the kept policy and the rule-based one close the decision:
        the rules come back where the kept policy runs supported slower than them end to end."""
        self.confirmed: str | None = None
        if self.chosen in ("rules", REFERENCE) or self.check_sqnr is None or self.check_s is None:
            return
        rules = self.by_label["rules"].policy
        pair = self.check_s * self.wall_per_clock * 2 * MIN_ROUNDS
        if self.elapsed() + pair * 1.3 > self.time_limit:
            return
        samples: dict[str, list[float]] = {"kept": [], "rules": []}
        quality = None
        for index in range(MIN_ROUNDS):
            for label in (("kept", "rules") if index % 2 == 0 else ("rules", "kept")):
                with _applied(self.target, self.policy if label == "kept" else rules), torch.inference_mode():
                    out, seconds = self.clock.time(lambda: self.run(self.forced))
                    if label == "rules" and quality is None:
                        quality, bad = output_quality(detached(out), self.ref)
                        quality = quality if not bad else -math.inf
                samples[label].append(seconds)
        verdict = compare(samples, "kept", ["rules"])
        ratio = verdict.ratios["rules"]
        if verdict.status["rules"] == "faster" and quality is not None and quality >= self.floor:
            self.confirmed = f"the rules ran {ratio.text()} the speed of {self.chosen} end to end: the rules are kept"
            self.policy, self.chosen = self._rules(), "rules"
        elif verdict.status["rules"] == "faster":
            self.confirmed = (f"the rules ran {ratio.text()} the speed of {self.chosen} end to end, but their output "
                              f"({db(quality)}) misses {self.name}'s floor: {self.chosen} stays")
        else:
            self.confirmed = (f"confirmed end to end: the rules ran {ratio.text()} the speed of {self.chosen} over "
                              f"{MIN_ROUNDS} paired whole runs")

    def _rules(self) -> Policy:
        return dataclasses.replace(self.by_label["rules"].policy, name=self.name)

    def _no_time_to_check(self) -> None:
        self.check_sqnr, self.check_skipped = None, True
        if self.backed:  # a composition missed the floor: fp32 is the one choice known to meet it
            self.reasons.append(f"not checked end to end again: the time limit ({self.time_limit:g} s) came first; "
                                "fp32 stays, the one choice known to meet the floor")
            self.choice = {c: REFERENCE if REFERENCE in p.options else self.choice[c] for c, p in self.parts.items()}
            self.policy, self.chosen = self.policy_for(self.choice)
        else:
            self.reasons.append(f"not checked end to end: the time limit ({self.time_limit:g} s) came first; the "
                                "rule-based choice stays")
            self.policy, self.chosen = self._rules(), "rules"
