"""The hardware matrix: the same configurations measured on several machines, side by side.

Every run is one machine. A cell holds what its run measured for one configuration:
the speed-up against the fp32 reference *of the same run* (so a ratio never mixes
machines), the main quality metric and the peak memory. :func:`hardware_matrix` builds
one :class:`Matrix` per pipeline, size and batch; :func:`matrix_text_rows` and
:func:`matrix_html` render it for the terminal, the UI and the HTML report.

Every speed-up cell is rendered by :func:`mixprec.bench.evidence.speedup_cell`, as in
every other table: a figure only where its interval from paired rounds supports one.
A machine's winner is named only where the intervals support it: of the configurations
that ran to their end (``ok``) with only finite outputs, the one whose whole interval lies
above every other's (fp32's is exactly 1). Where they do not, the machine's line says it
is undecided and why; the winner's quality stands beside it, for the reader to judge. No winner
is named from a run that did not finish, measured nothing, lacks its fp32 or timed nothing
(:func:`mixprec.bench.runstate.classify`): its line says which state it is in.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from mixprec.bench import evidence, rundata
from mixprec.bench.evidence import Interval, ratio_text, speedup_cell
from mixprec.bench.gate import main_quality
from mixprec.bench.runstate import classify, shown_status

__all__ = ["MATRIX_NOTE", "Cell", "Matrix", "hardware_matrix", "machine_label", "matrix_html", "matrix_runs",
           "matrix_text_rows", "spans_machines"]

#: The note that starts the tag every run of one hardware matrix carries (one tag per matrix).
MATRIX_NOTE = "hardware matrix"

_QUALITY_NAMES = {"snr_db": "SNR", "psnr_db": "PSNR", "sqnr_db": "SQNR"}


def machine_label(run: Mapping[str, Any]) -> str:
    """A machine's name in the matrix: its hardware label on a cluster, else device and fingerprint."""
    machine = run.get("machine") or {}
    node = machine.get("node") or {}
    fingerprint = rundata.text(run.get("machine_fingerprint"))[:8]
    if node.get("label"):
        return f"{node['label']} ({node.get('host') or node.get('ip') or '?'})"
    return f"{rundata.text(machine.get('name')) or '?'} [{fingerprint or '?'}]"


def spans_machines(runs: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``runs`` were measured on more than one machine (fingerprint, hardware label or device:
    a CPU run and a CUDA run on one host are two machines here)."""
    return len({(r.get("machine_fingerprint"), ((r.get("machine") or {}).get("node") or {}).get("label"),
                 _device_kind(r)) for r in runs}) > 1


def _device_kind(run: Mapping[str, Any]) -> str | None:
    device = rundata.device(run)
    return device.split(":")[0] if device else None


def _tag(run: Mapping[str, Any]) -> str | None:
    return next((n for n in run.get("notes") or [] if isinstance(n, str) and n.startswith(MATRIX_NOTE + " ")), None)


def matrix_runs(store: Any, run: Mapping[str, Any], *, recent: int = 200) -> list[Mapping[str, Any]]:
    """``run`` and the other runs of its hardware matrix (same tag in their notes), by id; just ``run`` if it has none."""
    tag = _tag(run)
    if tag is None:
        return [run]
    others = [store.load_run(r["id"]) for r in store.runs(recent) if r["id"] != run.get("id")]
    return sorted([run, *(o for o in others if _tag(o) == tag)], key=lambda r: r.get("id") or 0)


@dataclass(frozen=True)
class Cell:
    """One configuration on one machine.

    The speed-up is against the run's own fp32 reference at the same batch
    (:func:`mixprec.bench.evidence.speedup`): ``low``/``high`` its interval from ``pairs``
    paired rounds (``pairs`` 0: a ratio stored without an interval; ``None``: not said).
    """

    status: str
    speedup: float | None = None
    quality_key: str | None = None
    quality: float | None = None
    peak_mem_bytes: float | None = None
    weight_bytes: float | None = None
    nonfinite: float | None = None
    error: str | None = None
    low: float | None = None
    high: float | None = None
    pairs: int | None = None
    exact: bool = False
    #: The runner found its timings too spread to trust (the run's notes say why).
    unstable: bool = False
    #: The fp32 reference of its run (its speed-up is 1 by definition).
    reference: bool = False

    @property
    def usable(self) -> bool:
        """Ran to its end with finite outputs and was timed: it takes part in the choice of a winner."""
        return self.status == "ok" and not self.nonfinite and (self.reference or self.speedup is not None)

    @property
    def interval(self) -> Interval | None:
        """The speed-up and its interval (exactly 1 for the reference; ``None``: not timed)."""
        if self.reference:
            return Interval(1.0, 1.0, 1.0, None)
        if self.speedup is None:
            return None
        low = self.speedup if self.low is None else self.low
        high = self.speedup if self.high is None else self.high
        return Interval(self.speedup, low, high, self.pairs, self.exact)

    @property
    def speed_text(self) -> str:
        """The speed-up cell, as every table shows it (:func:`~mixprec.bench.evidence.speedup_cell`)."""
        return speedup_cell(self.interval, unstable=self.unstable, reference=self.reference)

    @property
    def supported(self) -> bool:
        """Whether its interval can decide anything: the reference, or at least
        :data:`~mixprec.bench.evidence.MIN_PAIRS` paired rounds with finite bounds and steady timings."""
        interval = self.interval
        if self.reference:
            return True
        return (interval is not None and interval.usable and not self.unstable
                and (interval.n is None or interval.n >= evidence.MIN_PAIRS))


@dataclass
class Matrix:
    """Configurations (rows) by machines (columns) for one pipeline, size and batch.

    Attributes:
        machines: column names, one per run (``run N`` is added when a machine has two runs; ``on DEVICE``
            when the runs were measured on more than one kind of device).
        run_ids: the run of each column.
        devices: the device of each column (``None``: the run does not say).
        configs: row names, in the order the runs measured them.
        cells: ``(config, machine) -> Cell``.
        winners: machine -> the configuration its intervals support as the fastest
            (``None``: undecided, or none ran to its end with finite outputs).
        undecided: machine -> why no winner is named there (``None`` where one is).
    """

    pipeline: str
    size: str
    batch: Any
    machines: list[str] = field(default_factory=list)
    run_ids: list[Any] = field(default_factory=list)
    devices: list[str | None] = field(default_factory=list)
    configs: list[str] = field(default_factory=list)
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    winners: dict[str, str | None] = field(default_factory=dict)
    undecided: dict[str, str | None] = field(default_factory=dict)

    def summary(self) -> list[str]:
        """One line per machine: which configuration its intervals support as the fastest, or why none is named."""
        lines = []
        for machine in self.machines:
            winner, why = self.winners.get(machine), self.undecided.get(machine)
            if winner is None:
                lines.append(f"{machine}: {why or 'no winner'}")
                continue
            cell = self.cells[(winner, machine)]
            quality = _quality_text(cell)
            if cell.reference:
                others = [c for c in self.configs if c != winner and (c, machine) in self.cells
                          and self.cells[(c, machine)].usable]
                lines.append(f"{machine}: {winner} (the reference) is fastest: " + (
                    f"{_names(others)} {'is' if len(others) == 1 else 'are'} slower over the whole interval" if others
                    else "no other configuration ran to its end with finite outputs"))
            else:
                lines.append(f"{machine}: {winner} is fastest, {cell.speed_text} its fp32, above every other "
                             "configuration's interval" + (f", {quality}" if quality else ""))
        kinds = sorted({d.split(":")[0] for d in self.devices if d})
        if len(kinds) > 1:
            lines.append(f"different devices ({', '.join(kinds)}): each column is one device against fp32 on that "
                         "device; they are never one machine, even on one host")
        return lines


def _cell(run: Mapping[str, Any], config: Mapping[str, Any]) -> Cell:
    metrics = rundata.metrics(config)
    quality = main_quality(metrics)
    ref = evidence.reference(run, config.get("batch"))
    is_reference = ref is not None and ref.get("name") == config.get("name")
    interval = None if is_reference else evidence.speedup(run, config)
    return Cell(status=shown_status(config) or "?",
                speedup=interval.value if interval is not None else None,
                low=interval.low if interval is not None else None, high=interval.high if interval is not None else None,
                pairs=interval.n if interval is not None else None, exact=bool(interval is not None and interval.exact),
                unstable=bool(rundata.num(metrics.get("unstable"))), reference=is_reference,
                quality_key=quality[0] if quality else None, quality=quality[1] if quality else None,
                peak_mem_bytes=rundata.num(metrics.get("peak_mem_bytes")), weight_bytes=rundata.num(metrics.get("weight_bytes")),
                nonfinite=rundata.num(metrics.get("nonfinite")), error=config.get("error"))


def hardware_matrix(runs: Sequence[Mapping[str, Any]]) -> list[Matrix]:
    """One :class:`Matrix` per (pipeline, size, batch) over ``runs``, each run a column."""
    tables: dict[tuple[str, str, Any], Matrix] = {}
    unfinal: dict[str, str] = {}  # column -> why its run is not a final result
    labels = [machine_label(r) for r in runs]
    if len({_device_kind(r) for r in runs}) > 1:  # a CPU run and a CUDA run of one host are two columns, named apart
        labels = [f"{label} on {rundata.device(r) or '?'}" for label, r in zip(labels, runs)]
    for run, label in zip(runs, labels):
        column = label if labels.count(label) == 1 else f"{label}, run {run.get('id', '?')}"
        state = classify(run)
        if not state.usable:
            unfinal[column] = f"no winner: run {state.run_id} is not a final result ({state.state})"
        for batch in rundata.batches(run):
            key = (rundata.text(run.get("pipeline")), rundata.text(run.get("size")), batch)
            table = tables.setdefault(key, Matrix(*key))
            table.machines.append(column)
            table.run_ids.append(run.get("id"))
            table.devices.append(rundata.device(run))
            for config in rundata.group(run, batch):
                name = rundata.text(config.get("name"))
                if name not in table.configs:
                    table.configs.append(name)
                table.cells[(name, column)] = _cell(run, config)
    for table in tables.values():
        for machine in table.machines:
            usable = [(c, table.cells[(c, machine)]) for c in table.configs
                      if (c, machine) in table.cells and table.cells[(c, machine)].usable]
            table.winners[machine], table.undecided[machine] = _winner(usable)
            if machine in unfinal:  # its figures are shown, but no winner is named from them
                table.winners[machine], table.undecided[machine] = None, unfinal[machine]
    return list(tables.values())


def _bounds(name: str, cell: Cell) -> str:
    interval = cell.interval
    if cell.reference or interval is None:
        return f"{name} (1, the reference)"
    return f"{name} ({ratio_text(interval.low)}–{ratio_text(interval.high)})"


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _winner(usable: list[tuple[str, Cell]]) -> tuple[str | None, str | None]:
    """``(winner, None)`` where the intervals support one configuration as the fastest, else
    ``(None, why not)``.

    A winner's interval lies wholly above every other usable configuration's (the
    reference's is exactly 1), and each of those has an interval that can decide (at
    least :data:`~mixprec.bench.evidence.MIN_PAIRS` paired rounds, steady timings): a
    configuration timed once might be the fastest, so nothing is named over it.
    """
    if not usable:
        return None, "no configuration ran to its end with finite outputs"
    undecidable = [(n, c) for n, c in usable if not c.supported]
    if undecidable:
        said = [f"{n} reads {c.speed_text}" for n, c in undecidable]
        return None, ("undecided which is fastest on this machine: " + _names(said)
                      + f"; a winner needs every speed-up from at least {evidence.MIN_PAIRS} paired rounds of steady timings")
    best_name, best = max(usable, key=lambda p: (p[1].interval.low, p[1].interval.value))  # type: ignore[union-attr]
    overlap = [(n, c) for n, c in usable if n != best_name and c.interval.high >= best.interval.low]  # type: ignore[union-attr]
    if overlap:
        return None, ("undecided which is fastest on this machine: the intervals of "
                      + _names([_bounds(n, c) for n, c in [(best_name, best), *overlap]]) + " overlap")
    return best_name, None


def _quality_text(cell: Cell) -> str:
    if cell.quality is None or cell.quality_key is None:
        return ""
    name = _QUALITY_NAMES.get(cell.quality_key, cell.quality_key)
    return f"{name} exact" if math.isinf(cell.quality) and cell.quality > 0 else f"{name} {cell.quality:.1f} dB"


def _cell_text(cell: Cell | None) -> str:
    if cell is None:
        return "not measured"
    if cell.status != "ok":
        return cell.status
    parts = [cell.speed_text if cell.usable or cell.speedup is not None else "no timing"]
    quality = _quality_text(cell)
    if quality:
        parts.append(quality)
    if cell.peak_mem_bytes is not None:
        parts.append(f"{cell.peak_mem_bytes / 2**20:.0f} MiB peak")
    if cell.nonfinite:
        parts.append(f"{cell.nonfinite:.0f} non-finite")
    return ", ".join(parts)


def matrix_text_rows(table: Matrix) -> tuple[list[str], list[list[str]]]:
    """Header and rows for a terminal or UI table; the winner on each machine is marked ``*``."""
    header = ["config", *table.machines]
    rows = []
    for config in table.configs:
        row = [config]
        for machine in table.machines:
            text = _cell_text(table.cells.get((config, machine)))
            row.append(("* " if table.winners.get(machine) == config else "") + text)
        rows.append(row)
    return header, rows


def _e(value: Any) -> str:
    return html.escape(rundata.text(value), quote=True)


def matrix_html(runs: Sequence[Mapping[str, Any]]) -> str:
    """The hardware matrix section of the HTML report ("" when the runs share one machine)."""
    if not spans_machines(runs):
        return ""
    parts = ['<section id="hardware-matrix">', "<h2>Hardware matrix</h2>",
             '<p class="muted">Each cell: speed-up against the fp32 reference measured on the same machine in the same '
             "run (ratios never mix machines), the main quality metric, and peak memory. A speed-up shows a figure only "
             "where its 95% interval from paired rounds lies wholly above or below 1; otherwise it reads undecided or "
             "unstable, with the interval or the number of rounds. <strong>Bold</strong>: the configuration whose interval "
             "lies above every other's on that machine; none where the intervals cannot decide (the line under the "
             "table says why).</p>"]
    for table in hardware_matrix(runs):
        head = "".join(f"<th>{_e(m)}<br><span class=\"muted\">run {_e(r)}</span></th>"
                       for m, r in zip(table.machines, table.run_ids))
        body = []
        for config in table.configs:
            cells = []
            for machine in table.machines:
                cell = table.cells.get((config, machine))
                text = _e(_cell_text(cell))
                if table.winners.get(machine) == config:
                    text = f"<strong>{text}</strong>"
                css = "num" if cell is not None and cell.status == "ok" else "err"
                title = f' title="{_e(cell.error)}"' if cell is not None and cell.error else ""
                cells.append(f'<td class="{css}"{title}>{text}</td>')
            body.append(f"<tr><th>{_e(config)}</th>{''.join(cells)}</tr>")
        caption = f"{table.pipeline}" + (f" ({table.size})" if table.size else "") + f", batch {table.batch}"
        parts.append(f"<h3>{_e(caption)}</h3>")
        parts.append(f'<div class="wide"><table><thead><tr><th>configuration</th>{head}</tr></thead>'
                     f"<tbody>{''.join(body)}</tbody></table></div>")
        parts.append("<ul>" + "".join(f"<li>{_e(line)}</li>" for line in table.summary()) + "</ul>")
    parts.append("</section>")
    return "\n".join(parts)
