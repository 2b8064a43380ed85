"""The runs as data for other tools: CSV (:func:`to_csv`) and strict JSON (:func:`to_json`), one record per
configuration with every metric, its error and, in JSON, its raw samples and full policy.

Every record says its run's state (:func:`mixprec.bench.runstate.classify`): ``run_state`` (``complete``,
``nothing measured``, ``interrupted``, ...), ``run_final`` (whether the figures are a final result) and
``run_state_reason`` in plain words, so no tool reads a run that measured nothing as a result."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any, Mapping, Sequence

from mixprec.bench import rundata
from mixprec.bench.runstate import classify, shown_status

__all__ = ["to_csv", "to_json"]

#: Metrics of a configuration, in the order the exports list them.
METRIC_ORDER: tuple[str, ...] = (
    "latency_median", "latency_p10", "latency_p90", "latency_mean", "latency_ci_low", "latency_ci_high",
    "latency_ci_exact", "latency_cv", "speedup", "speedup_ci_low", "speedup_ci_high", "speedup_pairs", "unstable",
    "throughput_items_per_s", "tokens_per_s", "rtf", "peak_mem_bytes",
    "weight_bytes", "compile_s", "compile_cached", "max_abs_err", "rel_err", "cosine", "sqnr_db", "snr_db", "lsd_db", "psnr_db", "ssim",
    "step_sqnr_db", "step_sqnr_worst_db",
    "embedding_cosine_mean", "embedding_cosine_min", "token_agreement", "nonfinite", "fallbacks", "shape_mismatch",
)

_ROW_FIELDS = ("run_id", "pipeline", "size", "run_status", "run_state", "run_final", "run_state_reason", "started", "finished", "device", "torch",
               "config", "batch", "status", "error", "policy_name", "n_samples")


def _metric_names(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    present = {name for run in runs for config in rundata.configs(run) for name in rundata.metrics(config)}
    known = [name for name in METRIC_ORDER if name in present]
    return known + sorted(present - set(METRIC_ORDER))


def _export_rows(runs: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    names = _metric_names(runs)
    rows = []
    for run in runs:
        state = classify(run)
        machine = run.get("machine") or {}
        versions = run.get("versions") or {}
        # A run without a configuration is still one record, so its state is said.
        for config in rundata.configs(run) or [{}]:
            metrics = rundata.metrics(config)
            policy = config.get("policy")
            row: dict[str, Any] = {
                "run_id": run.get("id"),
                "pipeline": run.get("pipeline"),
                "size": run.get("size"),
                "run_status": run.get("status"),
                "run_state": state.state,
                "run_final": state.final,
                "run_state_reason": state.text,
                "started": run.get("started"),
                "finished": run.get("finished"),
                "device": machine.get("name"),
                "torch": versions.get("torch"),
                "config": config.get("name"),
                "batch": config.get("batch"),
                "status": shown_status(config),
                "error": config.get("error"),
                "policy_name": policy.get("name") if isinstance(policy, Mapping) else None,
                "n_samples": len(config.get("samples") or []) if config else None,
            }
            # A metric stored without a value was measured as NaN (the store keeps NaN as
            # NULL); one the configuration never measured is absent and stays empty.
            row.update({name: math.nan if name in metrics and metrics[name] is None else metrics.get(name)
                        for name in names})
            row["_samples"] = list(config.get("samples") or [])
            row["_policy"] = policy
            rows.append(row)
    return [*_ROW_FIELDS, *names], rows


#: A text cell starting with one of these is a formula to a spreadsheet (OWASP "CSV injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return rundata.nonfinite_text(value) or repr(value)
    if isinstance(value, int):
        return str(value)
    # Text (configuration, pipeline and policy names, errors) is data, never a live formula:
    # a leading quote makes spreadsheets show it as typed.
    text = str(value)
    text = "'" + text if text.startswith(FORMULA_STARTS) else text
    # The writer quotes a cell holding its line terminator ("\n") but not a lone "\r",
    # which readers take for the end of the row: a carriage return reads as a line break.
    return text.replace("\r\n", "\n").replace("\r", "\n")


def to_csv(runs: Sequence[Mapping[str, Any]]) -> str:
    """One CSV row per configuration: run fields, status, error and every metric.

    Metrics a configuration did not measure are empty cells; NaN reads ``nan`` and
    infinities ``inf`` / ``-inf``. A text cell that
    a spreadsheet would run as a formula (starting with ``= + - @``, tab or carriage
    return) gets a leading ``'``.
    """
    runs = list(runs)
    fields, rows = _export_rows(runs)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(fields)
    for row in rows:
        writer.writerow([_csv_cell(row[f]) for f in fields])
    return buffer.getvalue()


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return rundata.nonfinite_text(value) or value
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _headlines(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any] | None]:
    """The headline (:func:`mixprec.bench.headline.headlines`) of each record's run and batch, in record order."""
    from mixprec.bench.headline import headlines

    out: list[dict[str, Any] | None] = []
    for run in runs:
        said = [h.to_dict() for h in headlines(run)]
        out += ([next((h for h in said if h["batch"] == config.get("batch")), None) for config in rundata.configs(run)]
                or said[:1])
    return out


def to_json(runs: Sequence[Mapping[str, Any]]) -> str:
    """A JSON array with one object per configuration.

    Each object has the CSV's fields plus ``samples`` (the raw latencies in
    seconds), ``policy`` (the full policy, or ``null``) and ``headline``: which configuration
    to use at its run's batch and how sure that is (:meth:`mixprec.bench.headline.Headline.to_dict`:
    ``certainty``, ``choice``, ``speedup``, ``final``, ``text``). Infinities and NaN
    are the strings ``"inf"``, ``"-inf"`` and ``"nan"``, so the text is strict JSON;
    a metric the configuration did not measure is ``null``.
    """
    runs = list(runs)
    fields, rows = _export_rows(runs)
    out = []
    for row, said in zip(rows, _headlines(runs)):
        item = {f: row[f] for f in fields}
        item["samples"] = row["_samples"]
        item["policy"] = row["_policy"]
        item["headline"] = said
        out.append(_json_safe(item))
    return json.dumps(out, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
