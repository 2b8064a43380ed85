"""``mixprec calibrate``: a pipeline's presets checked on the pipeline itself, remembered; ``--list`` and ``--clear``."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Optional

import typer

from mixprec._quote import quote
from mixprec.cli._app import app
from mixprec.cli._common import (
    MAX_BATCH,
    PIPELINE_HELP,
    DeviceFlag,
    JsonFlag,
    SizeFlag,
    as_int,
    checked_device,
    console,
    example_inputs,
    fail,
    gib,
    table,
)
from mixprec.cli._choices import preset_values
from mixprec.cli._text import say

__all__ = ["calibrate_cmd", "calibration_rows", "calibration_lines"]

#: The presets calibrated when no --preset is given.
_DEFAULT_PRESETS = ["balanced", "fast", "memory"]

CALIBRATION_COLUMNS = ["candidate", "vs fp32", "output SQNR", "weights", "against the incumbent", "out / also"]


def calibration_rows(result: Any) -> list[list[Any]]:
    """One row per candidate of a :class:`~mixprec.calibration.Calibration`, the kept one marked."""
    rows = []
    for fig in result.figures:
        speed = fig.get("vs_fp32")
        sqnr = fig.get("sqnr_db")
        rows.append([
            ("* " if fig["label"] == result.chosen else "  ") + fig["label"],
            f"{speed['value']:.2f}x ({speed['low']:.2f}-{speed['high']:.2f})" if speed else ("1.00x" if fig["label"] == "fp32" else None),
            None if sqnr is None else ("exact" if sqnr == math.inf else f"{sqnr:.1f} dB"),
            gib(fig.get("weight_bytes")),
            fig.get("status") or ("not eligible" if not fig.get("eligible") else None),
            fig.get("out") or (f"same policy as {', '.join(fig['also'])}" if fig.get("also") else None),
        ])
    return rows


COMPONENT_COLUMNS = ["component", "calls", "fp32 time", "share", "timed on", "kept", "vs fp32", "own SQNR", "note"]


def component_rows(result: Any) -> list[list[Any]]:
    """One row per component of a calibration made per component (none for a one-component model)."""
    rows = []
    for comp in result.components:
        speed, sqnr = comp.get("vs_fp32"), comp.get("sqnr_db")
        rows.append([comp["component"], comp["calls"], f"{comp['seconds']:.3f} s", f"{comp['share']:.0%}", comp["unit"],
                     comp["kept"], f"{speed['value']:.2f}x ({speed['low']:.2f}-{speed['high']:.2f})" if speed else None,
                     None if sqnr is None else ("exact" if sqnr == math.inf else f"{sqnr:.1f} dB"),
                     comp.get("verdict") or comp.get("note")])
    return rows


def calibration_lines(result: Any) -> list[str]:
    """The headline and the reasons that are not a candidate's figure line (the table holds those)."""
    labels = tuple(f"{fig['label']}:" for fig in result.figures)
    return [result.headline()] + [r for r in result.reasons if not r.startswith(labels)]


def _show(result: Any, title: str) -> None:
    lines = calibration_lines(result)
    say(console, lines[0], soft_wrap=False)
    if result.components:
        console.print(table(f"{title}: per component", COMPONENT_COLUMNS, component_rows(result)))
    console.print(table(title, CALIBRATION_COLUMNS, calibration_rows(result), drop=("out / also", "weights")))
    for line in lines[1:]:
        say(console, "  - ", line, soft_wrap=False)


@app.command("calibrate")
def calibrate_cmd(
    pipeline: Annotated[Optional[str], typer.Option("--pipeline", help=PIPELINE_HELP)] = None,
    preset: Annotated[Optional[list[str]], typer.Option("--preset", help=" | ".join(preset_values()) + " (repeat for several; default: " + ", ".join(_DEFAULT_PRESETS) + ").")] = None,
    size: SizeFlag = "default",
    batch: Annotated[str, typer.Option("--batch", help="Batch size of the example inputs the presets are timed on.")] = "1",
    device: DeviceFlag = None,
    time_limit: Annotated[float, typer.Option("--time-limit", help="Seconds each preset's calibration may take, the fp32 reference and warm-up included.")] = 20.0,
    refresh: Annotated[bool, typer.Option("--refresh", help="Measure again even where a decision is remembered (and remember the new one).")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write remembered decisions.")] = False,
    list_: Annotated[bool, typer.Option("--list", help="List the remembered decisions and exit.")] = False,
    clear: Annotated[bool, typer.Option("--clear", help="Forget the remembered decisions (of --preset, or all) and exit.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Time each preset's candidates on the pipeline itself and keep the fastest that meets the preset's quality floor.

    The candidates are the rule-based resolution, the preset with the other 16-bit type,
    fp32 at the preset's matmul level, the preset without its extras and the one-line casts;
    each is checked against fp32's output on the same inputs, then timed in paired rounds
    (CPU time on a CPU, CUDA events on a GPU). A decision is remembered, keyed by the model's
    structure, the inputs' shapes, the device and the versions: the next run, and `mixprec
    explain --calibrate`, reuse it without running the model.
    """
    from mixprec import calibration, pipelines
    from mixprec.policy.presets import check_name

    names: list[str] = []
    try:
        names = [check_name(p) for p in (preset or _DEFAULT_PRESETS)]
    except ValueError as exc:
        fail(f"--preset: {exc}")
    if list_ or clear:
        if clear:
            removed = sum(calibration.clear(n) for n in names) if preset else calibration.clear()
            say(console, f"forgot {removed} remembered calibration{'s' if removed != 1 else ''} ({calibration.cache.folder()})")
            return
        found = calibration.entries()
        if as_json:
            console.print_json(json.dumps(found, default=str))
            return
        console.print(table(f"Remembered calibrations ({calibration.cache.folder()})",
                            ["preset", "component", "kept", "device", "when", "clock", "rounds", "inputs", "torch"],
                            [[r.get("preset"), r.get("component") or "(whole model)", r.get("chosen"), r.get("device"), r.get("when"), r.get("clock"), r.get("rounds"),
                              (r.get("key") or {}).get("inputs"), (r.get("key") or {}).get("torch")] for r in found]))
        return
    if pipeline is None:
        fail("give --pipeline (see `mixprec pipelines`), or --list / --clear")
    if not (time_limit > 0):
        fail(f"--time-limit {quote(time_limit)}: give a positive number of seconds")
    if refresh and no_cache:
        fail("--refresh remembers a new decision, --no-cache remembers nothing: give one of them")
    try:
        rows = as_int(batch, "--batch", low=1, high=MAX_BATCH)
    except ValueError as exc:
        fail(exc)
    results = {}
    try:
        device = checked_device(device)
        pipe = pipelines.get(pipeline, size=size, device=device)
        inputs = example_inputs(pipe, pipeline, rows, 0)
        cache: bool | str = False if no_cache else ("refresh" if refresh else True)
        for name in names:
            results[name] = calibration.calibrate(pipe, name, inputs, time_limit=time_limit, cache=cache)
    except ValueError as exc:
        fail(exc)
    if as_json:
        console.print_json(json.dumps({"pipeline": pipeline, "size": size, "batch": rows, "device": device,
                                       "calibrations": {n: r.to_dict() for n, r in results.items()}}, default=str))
        return
    for name, result in results.items():
        _show(result, f"{pipeline} ({size}, batch {rows}) on {device}: {name}")
