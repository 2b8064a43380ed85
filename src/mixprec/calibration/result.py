"""What a calibration decided (:class:`Calibration`), with the figures it decided on; data only."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from mixprec._json import number, strict
from mixprec.policy import Policy

__all__ = ["Calibration"]


@dataclass(frozen=True)
class Calibration:
    """What a calibration decided, and the figures it decided on.

    Attributes:
        preset: the preset calibrated.
        policy: the policy to apply (the kept candidate's).
        chosen: the kept candidate's label (``rules``, ``naive-fp16``, ``fp32``, ...).
        source: ``measured`` (timed now), ``cache`` (remembered from an earlier
            calibration) or ``rules`` (nothing was timed: ``quality``, or a device where every
            candidate computes what fp32 computes: "nothing to choose on this device").
        decided: whether the rounds reached a verdict (at least
            :data:`~mixprec.calibration.decide.MIN_ROUNDS` paired rounds; ``False``: the
            rule-based choice stayed, ``reasons`` say why). Candidates the rounds could not
            separate from the kept one within 2% are named in ``reasons``.
        reasons: sentences for every choice, figures included.
        figures: per candidate: ``label``, ``what``, ``also``, ``eligible``, ``sqnr_db``,
            ``nonfinite``, ``out`` (why it could not be chosen), ``weight_bytes``,
            ``median_s``, ``vs_fp32`` (speed over the untouched model, a
            :class:`~mixprec.measure.stats.Ratio` dict) and ``status`` against the incumbent.
        clock: what timed the rounds (``cpu-time``, ``cuda-events``, ``wall``).
        rounds: paired timed rounds.
        seconds: wall seconds the calibration took.
        when: when it was measured (UTC, ISO 8601).
        device: the device's name.
        floor_db: the quality floor applied.
        cache_path: where the decision is remembered, if it is.
        components: for a model of several components, calibrated per component
            (:mod:`~mixprec.calibration.components`): per component ``component``,
            ``calls``, ``seconds`` (fp32, device clock), ``share`` of the run, ``unit``
            (``calls``, or ``layers (predicted)``), ``kept``, ``vs_fp32``, ``sqnr_db`` (its
            own error), ``decided``, ``source``, ``note``, ``verdict`` and its ``options``.
            The ``figures`` of such a calibration are predicted from the components'
            (``predicted``), the ``per-component`` one checked end to end.
    """

    preset: str
    policy: Policy
    chosen: str
    source: str
    decided: bool
    reasons: tuple[str, ...]
    figures: tuple[dict[str, Any], ...] = ()
    clock: str = ""
    rounds: int = 0
    seconds: float = 0.0
    when: str = ""
    device: str = ""
    floor_db: float | None = None
    cache_path: str | None = None
    components: tuple[dict[str, Any], ...] = ()

    def figure(self, label: str) -> dict[str, Any] | None:
        return next((f for f in self.figures if f["label"] == label), None)

    def headline(self) -> str:
        """One line: what was kept, how fast against fp32, and where it came from."""
        fig = self.figure(self.chosen) or {}
        speed = fig.get("vs_fp32")
        text = f"{self.preset}: {self.chosen}"
        if self.chosen == "per-component" and self.components:
            text = f"{self.preset}: per component (" + ", ".join(f"{c['component']} {c['kept']}" for c in self.components) + ")"
        if speed and fig.get("predicted"):
            text += f" {speed['value']:.2f}x fp32 predicted from the components"
        elif speed:
            text += f" {speed['value']:.2f}x fp32 ({speed['low']:.2f}-{speed['high']:.2f})"
        if self.source == "cache":
            text += f", remembered from {self.when} ({self.clock}, {self.rounds} rounds)"
        elif self.source == "measured":
            text += f", measured in {self.clock} over {self.rounds} paired rounds ({self.seconds:.1f} s)"
        else:
            text += ", from the rules (nothing timed)"
        if self.decided:
            return text
        return text + ("; undecided: the rule-based choice stays" if self.chosen == "rules"
                       else f"; undecided: the rules were out, so {self.chosen} stays")

    def component_lines(self) -> list[str]:
        """One line per component of a calibration made per component: its share of the run, the
        candidate kept, its speed against fp32 (predicted where timed through its layers) and its own error."""
        lines = []
        for c in self.components:
            speed, sqnr = c.get("vs_fp32"), c.get("sqnr_db")
            lines.append(f"{c['component']}: {c['share']:.0%} of the run, {c['kept']}"
                         + (f", {speed['value']:.2f}x fp32" + (" (predicted)" if c.get("unit") != "calls" else "") if speed else "")
                         + ("" if sqnr is None else ", exact" if sqnr == float("inf") else f", own SQNR {sqnr:.1f} dB")
                         + ("" if c.get("decided") else ", undecided"))
        return lines

    def to_dict(self) -> dict[str, Any]:
        """Standard JSON data: an exact SQNR (``inf``) is written ``"inf"``, as mixprec's exports write it."""
        data = dataclasses.asdict(self)
        data["policy"] = self.policy.to_dict()
        data["reasons"] = list(self.reasons)
        data["figures"] = [strict(dict(f)) for f in self.figures]
        data["floor_db"] = strict(self.floor_db)
        data["components"] = [strict({k: ([strict(dict(o)) for o in v] if k == "options" else v) for k, v in c.items()})
                              for c in self.components]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        fields = {f.name for f in dataclasses.fields(cls)}
        kept = {k: v for k, v in data.items() if k in fields}
        kept["policy"] = Policy.from_dict(data["policy"], "calibration policy")
        kept["reasons"] = tuple(data.get("reasons", ()))
        kept["figures"] = tuple({k: (number(v) if k == "sqnr_db" else v) for k, v in f.items()} for f in data.get("figures", ()))
        kept["floor_db"] = number(data.get("floor_db"))
        kept["components"] = tuple(
            {k: ([{ok: (number(ov) if ok == "sqnr_db" else ov) for ok, ov in o.items()} for o in v] if k == "options"
                 else number(v) if k == "sqnr_db" else v) for k, v in c.items()} for c in data.get("components", ()))
        return cls(**kept)
