"""Benchmark reports: run dicts in, one self-contained HTML page out (:func:`render_html`), and
:func:`save_html`, which only writes that page to a file.

The page depends on nothing but the runs: no timestamps, no randomness; its plots come from
:mod:`mixprec.bench.plots` and its tables from :mod:`mixprec.bench.table`.
"""

from __future__ import annotations

import html
import os
from base64 import b64encode
from pathlib import Path
from typing import Any, Mapping, Sequence

from mixprec.bench import rundata
from mixprec.bench.matrix import matrix_html
from mixprec.bench.plots import QUALITY_LABELS, latency_samples_png, main_quality_key, memory_png, scatter_png
from mixprec.bench.runstate import classify
from mixprec.bench.table import COLUMNS, render_table_rows
from mixprec.device.hardware import ratio_text

__all__ = ["render_html", "save_html"]

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { border-bottom: 2px solid #ddd; padding-bottom: .2em; margin-top: 2em; }
h3 { margin-top: 1.5em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .88em; }
th, td { border: 1px solid #ddd; padding: .25em .55em; vertical-align: top; }
th { background: #f4f4f4; text-align: left; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
td.err { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: .9em; color: #8b0000; max-width: 32em; }
tr.failed td, tr.timeout td { background: #fff0f0; }
tr.running td, tr.pending td { background: #fffbe6; }
.wide { overflow-x: auto; }
.banner { background: #fff4ce; border: 1px solid #e0c060; padding: .5em .8em; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; } .plots figure { flex: 1 1 480px; }
figcaption, .muted { color: #666; font-size: .88em; }
code { font-size: .9em; }
"""

_TEXT_COLUMNS = {"config", "status", "policy", "error"}


def _e(value: Any) -> str:
    return html.escape(rundata.text(value), quote=True)


def _img(png: bytes, alt: str) -> str:
    return f'<img src="data:image/png;base64,{b64encode(png).decode("ascii")}" alt="{_e(alt)}">'


def _kv_table(pairs: Sequence[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in pairs if v not in (None, "", []))
    return f'<table class="kv">{body}</table>' if body else '<p class="muted">not recorded</p>'


def _dtype_summary(dtypes: Any) -> str:
    if not isinstance(dtypes, Mapping):
        return ""
    parts = []
    for name, info in dtypes.items():
        if isinstance(info, Mapping):
            ratio = rundata.num(info.get("ratio"))
            klass = rundata.text(info.get("klass")) or "?"
            shown = ratio_text(ratio, klass)
            parts.append(f"{name} {klass}" + (f" ({shown})" if shown else ""))
        else:
            parts.append(f"{name} {info}")
    return ", ".join(parts)


def _machine_html(run: Mapping[str, Any]) -> str:
    machine = run.get("machine") or {}
    memory = rundata.num(machine.get("memory_bytes"))
    pairs = [
        ("device type", machine.get("device_type")),
        ("device", machine.get("name")),
        ("threads", machine.get("threads")),
        ("memory", f"{memory / 2**30:.1f} GiB" if memory is not None else None),
        ("compute capability", machine.get("capability")),
        ("measured dtypes", _dtype_summary(machine.get("dtypes"))),
    ]
    versions = run.get("versions") or {}
    parts = ["<h3>Machine</h3>", _kv_table(pairs)]
    flags = machine.get("cpu_flags")
    if flags:
        parts.append(f"<details><summary>CPU flags ({len(flags)})</summary><p><code>"
                     f"{_e(' '.join(map(str, flags)))}</code></p></details>")
    parts += ["<h3>Versions</h3>", _kv_table([(k, v) for k, v in versions.items()])]
    if run.get("command"):
        parts.append(f"<p>Command: <code>{_e(run['command'])}</code></p>")
    return "\n".join(parts)


def _table_html(rows: Sequence[Mapping[str, str]]) -> str:
    if not rows:
        return '<p class="muted">no configurations</p>'
    labels = dict(COLUMNS)
    keys = [k for k in rows[0] if any(r.get(k) for r in rows)]
    head = "".join(f"<th>{_e(labels.get(k, k))}</th>" for k in keys)
    body = []
    for row in rows:
        cells = []
        for key in keys:
            css = "err" if key == "error" else "text" if key in _TEXT_COLUMNS else "num"
            cells.append(f'<td class="{css}">{_e(row.get(key, ""))}</td>')
        body.append(f'<tr class="{_e(row.get("status", ""))}">{"".join(cells)}</tr>')
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def _policies_html(configs: Sequence[Mapping[str, Any]]) -> str:
    items = []
    for config in configs:
        policy = config.get("policy")
        if not isinstance(policy, Mapping):
            continue
        rules = policy.get("rules") or []
        rule_rows = []
        for rule in rules:
            if not isinstance(rule, Mapping):
                continue
            settings = ", ".join(f"{k}={v}" for k, v in rule.items() if k not in ("match", "reason"))
            rule_rows.append(f"<tr><td><code>{_e(rule.get('match'))}</code></td><td>{_e(settings)}</td>"
                             f"<td>{_e(rule.get('reason'))}</td></tr>")
        numerics = policy.get("numerics")
        numerics_text = ", ".join(f"{k}={v}" for k, v in numerics.items()) if isinstance(numerics, Mapping) else ""
        table = (f"<table><thead><tr><th>match</th><th>settings</th><th>reason</th></tr></thead>"
                 f"<tbody>{''.join(rule_rows)}</tbody></table>" if rule_rows else '<p class="muted">no rules</p>')
        items.append(f"<h4>{_e(config.get('name'))} (batch {_e(config.get('batch'))}): policy "
                     f"<code>{_e(policy.get('name'))}</code></h4>"
                     + (f"<p>numerics: <code>{_e(numerics_text)}</code></p>" if numerics_text else "") + table)
    if not items:
        return ""
    return f"<details><summary>Policies ({len(items)})</summary>{''.join(items)}</details>"


def _batch_html(run: Mapping[str, Any], batch: Any, anchor: str) -> str:
    configs = rundata.group(run, batch)
    key = main_quality_key(run)
    name = rundata.text(run.get("pipeline"))
    scatter = scatter_png(run, configs, batch)
    memory = memory_png(configs)
    spread = latency_samples_png(configs)
    sub_run = dict(run, configs=configs)
    return "\n".join([
        f'<h3 id="{_e(anchor)}">{_e(name)}, batch {_e(batch)}</h3>',
        f"<figure>{_img(scatter, f'{name}: latency vs quality')}<figcaption>Median latency (error bars: "
        f"confidence interval of the median) against {_e(QUALITY_LABELS[key])}; the line joins the Pareto "
        f"front (no other configuration is both faster and more accurate). Outputs identical to fp32 are "
        f"drawn above the others and labelled exact.</figcaption></figure>",
        '<div class="plots">',
        f"<figure>{_img(memory, f'{name}: memory')}<figcaption>Weight bytes and peak memory.</figcaption></figure>",
        f"<figure>{_img(spread, f'{name}: latency samples')}<figcaption>Latency samples.</figcaption></figure>",
        "</div>",
        _table_html(render_table_rows(sub_run)),
    ])


def _run_html(run: Mapping[str, Any], index: int) -> str:
    run_id = run.get("id", index)
    anchor = f"run-{run_id}"
    heading = f"Run {run_id}: {rundata.text(run.get('pipeline'))}"
    if run.get("size"):
        heading += f" ({rundata.text(run.get('size'))})"
    parts = [f'<section id="{_e(anchor)}">', f"<h2>{_e(heading)}</h2>"]
    times = f"started {rundata.text(run.get('started')) or '?'}"
    times += f", finished {rundata.text(run['finished'])}" if run.get("finished") else ", not finished"
    parts.append(f'<p class="muted">{_e(times)}; status {_e(run.get("status"))}</p>')
    state = classify(run)
    if state.warning is not None:
        parts.append(f'<p class="banner run-state"><strong>Not a final result ({_e(state.state)}).</strong> '
                     + " ".join(f"{_e(kind.capitalize())}: {_e(why)}." for kind, why in state.problems) + "</p>")
    elif state.problems:
        parts.append(f'<p class="muted run-state">{_e(state.text)}</p>')
    parts.append(_machine_html(run))
    batches = rundata.batches(run)
    if not batches:
        parts.append('<p class="muted">no configurations were measured</p>')
    for i, batch in enumerate(batches):
        parts.append(_batch_html(run, batch, f"{anchor}-batch-{i}"))
    parts.append(_policies_html(rundata.configs(run)))
    notes = run.get("notes") or []
    if notes:
        items = "".join(f"<li>{_e(note)}</li>" for note in notes)
        parts.append(f"<h3>Notes</h3><ul>{items}</ul>")
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def _headlines_html(runs: Sequence[Mapping[str, Any]]) -> str:
    """What to use on each machine, per pipeline and batch (:func:`mixprec.bench.headline.headlines`)."""
    from mixprec.bench.headline import by_machine

    parts = [f"<h3>What to use on {_e(machine)}</h3><ul>{''.join(f'<li>{_e(text)}</li>' for text in lines)}</ul>"
             for machine, lines in by_machine(runs).items() if lines]
    return f'<section class="headline">{"".join(parts)}</section>' if parts else ""


def render_html(runs: Sequence[Mapping[str, Any]], *, title: str = "mixprec benchmark") -> str:
    """One self-contained HTML page for one or more runs.

    The page starts with which configuration to use on each machine, per pipeline and batch, and how
    sure that is (:mod:`mixprec.bench.headline`); runs on more than one machine then show their
    hardware matrix (:func:`mixprec.bench.matrix.matrix_html`). Per run: machine and versions; per batch size a latency-vs-quality scatter
    with its Pareto front, memory bars, latency box plots and the configuration
    table; the policies; the notes. CSS is inline and the plots are embedded as
    base64 PNG, so the page loads nothing from elsewhere. All text from the runs
    is HTML-escaped. The same runs always give the same page.

    Args:
        runs: run dicts as the store returns them.
        title: page title and heading.
    """
    runs = list(runs)
    nav = ""
    if len(runs) > 1:
        links = "".join(f'<li><a href="#run-{_e(r.get("id", i))}">Run {_e(r.get("id", i))}: {_e(r.get("pipeline"))}</a></li>'
                        for i, r in enumerate(runs))
        nav = f"<nav><ul>{links}</ul></nav>"
    body = "\n".join(_run_html(run, i) for i, run in enumerate(runs)) or '<p class="muted">no runs</p>'
    body = "\n".join(p for p in (_headlines_html(runs), matrix_html(runs), body) if p)  # what to use, then the hardware matrix
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{_e(title)}</title>\n'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<style>{_CSS}</style>\n</head>\n'
        f"<body>\n<h1>{_e(title)}</h1>\n{nav}\n{body}\n</body>\n</html>\n"
    )


def save_html(runs: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write :func:`render_html` of ``runs`` to ``path`` (UTF-8) and return the path."""
    target = Path(path)
    target.write_text(render_html(runs), encoding="utf-8")
    return target
