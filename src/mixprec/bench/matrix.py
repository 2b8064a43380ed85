"""The hardware matrix: the same configurations measured on several machines, side by side.

Every run is one machine. A cell holds what its run measured for one configuration:
the speed-up against the fp32 reference *of the same run* (so a ratio never mixes
machines), the main quality metric and the peak memory. :func:`hardware_matrix` builds
one :class:`Matrix` per pipeline, size and batch; :func:`matrix_text_rows` and
:func:`matrix_html` render it for the terminal, the UI and the HTML report.

The winner on a machine is its fastest configuration that ran to its end (``ok``)
with only finite outputs; its quality stands beside it, for the reader to judge.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from mixprec.bench import rundata
from mixprec.bench.gate import main_quality

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
    """One configuration on one machine."""

    status: str
    speedup: float | None = None
    quality_key: str | None = None
    quality: float | None = None
    peak_mem_bytes: float | None = None
    weight_bytes: float | None = None
    nonfinite: float | None = None
    error: str | None = None
    #: The speed-up's interval from paired rounds (None in runs stored without one).
    low: float | None = None
    high: float | None = None

    @property
    def usable(self) -> bool:
        return self.status == "ok" and not self.nonfinite and self.speedup is not None


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
        winners: machine -> its fastest usable configuration (``None``: none usable).
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
    #: machine -> the configuration whose interval the winner's does not clear (None: the
    #: win is supported: the winner's interval lies above every other's, and above 1).
    contested: dict[str, str | None] = field(default_factory=dict)

    def summary(self) -> list[str]:
        """One line per machine: which configuration wins there, and by how much."""
        lines = []
        for machine in self.machines:
            winner = self.winners.get(machine)
            if winner is None:
                lines.append(f"{machine}: no configuration ran to its end with finite outputs")
                continue
            cell = self.cells[(winner, machine)]
            quality = _quality_text(cell)
            rival = self.contested.get(machine)
            if rival is None:
                lines.append(f"{machine}: {winner} wins, {_speed_text(cell)} its fp32" + (f", {quality}" if quality else ""))
            else:
                lines.append(f"{machine}: {winner} leads with {_speed_text(cell)} its fp32" + (f", {quality}" if quality else "")
                             + f", undecided against {rival} on this machine")
        kinds = sorted({d.split(":")[0] for d in self.devices if d})
        if len(kinds) > 1:
            lines.append(f"different devices ({', '.join(kinds)}): each column is one device against fp32 on that "
                         "device; they are never one machine, even on one host")
        return lines


def _cell(config: Mapping[str, Any]) -> Cell:
    metrics = rundata.metrics(config)
    quality = main_quality(metrics)
    return Cell(status=rundata.text(config.get("status")) or "?", speedup=rundata.num(metrics.get("speedup")),
                low=rundata.num(metrics.get("speedup_ci_low")), high=rundata.num(metrics.get("speedup_ci_high")),
                quality_key=quality[0] if quality else None, quality=quality[1] if quality else None,
                peak_mem_bytes=rundata.num(metrics.get("peak_mem_bytes")), weight_bytes=rundata.num(metrics.get("weight_bytes")),
                nonfinite=rundata.num(metrics.get("nonfinite")), error=config.get("error"))


def hardware_matrix(runs: Sequence[Mapping[str, Any]]) -> list[Matrix]:
    """One :class:`Matrix` per (pipeline, size, batch) over ``runs``, each run a column."""
    tables: dict[tuple[str, str, Any], Matrix] = {}
    labels = [machine_label(r) for r in runs]
    if len({_device_kind(r) for r in runs}) > 1:  # a CPU run and a CUDA run of one host are two columns, named apart
        labels = [f"{label} on {rundata.device(r) or '?'}" for label, r in zip(labels, runs)]
    for run, label in zip(runs, labels):
        column = label if labels.count(label) == 1 else f"{label}, run {run.get('id', '?')}"
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
                table.cells[(name, column)] = _cell(config)
    for table in tables.values():
        for machine in table.machines:
            usable = [(c, table.cells[(c, machine)]) for c in table.configs
                      if (c, machine) in table.cells and table.cells[(c, machine)].usable]
            table.winners[machine] = max(usable, key=lambda p: p[1].speedup)[0] if usable else None
            table.contested[machine] = _rival(table.winners[machine], usable)
    return list(tables.values())


def _rival(winner: str | None, usable: list[tuple[str, Cell]]) -> str | None:
    """The configuration the winner is not supported faster than, or None.

    Where stored intervals exist, the winner's lower bound must clear every other
    configuration's upper bound (fp32's is 1). Runs stored without intervals are
    compared on their point figures, as they were measured.
    """
    if winner is None:
        return None
    best = dict(usable)[winner]
    if best.low is None:
        return None
    for name, cell in sorted(usable, key=lambda p: -(p[1].speedup or 0.0)):
        if name == winner:
            continue
        top = cell.high if cell.high is not None else cell.speedup
        if top is not None and best.low <= top:
            return name
    return None


def _speed_text(cell: Cell) -> str:
    if cell.low is not None and cell.high is not None and not cell.low == cell.high == cell.speedup:
        return f"{cell.speedup:.2f}x ({cell.low:.2f}-{cell.high:.2f})"
    return f"{cell.speedup:.2f}x"


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
    parts = [_speed_text(cell) if cell.speedup is not None else "no timing"]
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
             "run (ratios never mix machines), the main quality metric, and peak memory. "
             "<strong>Bold</strong>: the fastest configuration on that machine that ran to its end with finite outputs.</p>"]
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
