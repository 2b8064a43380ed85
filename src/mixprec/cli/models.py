"""The commands that look at or run one pipeline: ``explain``, ``diagnose``, ``fallbacks``, ``pipelines`` and ``run``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Annotated, Any, Iterator, Optional

import typer

import mixprec
from mixprec._quote import quote
from mixprec.casting.explain import compile_advice, explain_unmatched
from mixprec.policy.select import summarise_unmatched
from mixprec.cli._app import app
from mixprec.cli._choices import extension_help, preset_values
from mixprec.cli._common import (
    MAX_BATCH,
    MAX_SEED,
    DeviceFlag,
    JsonFlag,
    PipelineFlag,
    SizeFlag,
    as_int,
    checked_device,
    console,
    example_inputs,
    err_console,
    fail,
    open_store,
    table,
    writable_path,
)
from mixprec.cli._files import Outputs
from mixprec.cli._module_tables import (EXPLAIN_COLUMNS, EXPLAIN_DROP, PROFILE_COLUMNS, PROFILE_DROP, explain_rows,
                                        explain_summary, profile_rows)
from mixprec.cli._text import clean, line, say

#: ``--preset`` of explain and diagnose.
PRESET_HELP = " | ".join(preset_values())


def _policy_for(pipe: Any, preset_name: str | None, policy_file: str | None, device: str | None) -> Any:
    from mixprec.device import hardware
    from mixprec.policy import Policy

    if policy_file is not None:
        return Policy.load(policy_file)
    return mixprec.preset(preset_name, hardware=hardware.probe(device), hints=tuple(pipe.sensitive))


def _one_policy(preset: str | None, policy: str | None) -> None:
    """Exactly one of --preset and --policy, and not an empty one."""
    if (preset is None) == (policy is None):
        fail(ValueError("give exactly one of --preset or --policy"))
    if preset is not None and not preset.strip():
        fail(ValueError(f"--preset {quote(preset)}: give a preset name: {', '.join(mixprec.PRESETS)}"))
    if policy is not None and not policy.strip():
        fail(ValueError(f"--policy {quote(policy)}: give a policy file (.toml or .json)"))


@app.command()
def explain(
    pipeline: PipelineFlag,
    preset: Annotated[Optional[str], typer.Option("--preset", help=PRESET_HELP)] = None,
    policy: Annotated[Optional[str], typer.Option("--policy", help="Policy .toml/.json file.")] = None,
    size: SizeFlag = "default",
    device: DeviceFlag = None,
    all_modules: Annotated[bool, typer.Option("--all", help="List every module, not only those that own weights.")] = False,
    expand: Annotated[bool, typer.Option("--expand", help="One row per module: repeated blocks (layers.0, layers.1, ...) are not collapsed into one row.")] = False,
    calibrate: Annotated[bool, typer.Option("--calibrate", help="Check the preset on the pipeline itself (as `mixprec calibrate`; a remembered decision is reused) and explain the policy it keeps.")] = False,
    compiled: Annotated[bool, typer.Option("--compile", help="Explain the policy compiled (torch.compile, inductor; what bench's fast+compile runs): which components decode on a static key/value cache.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Per module: storage and compute dtype and the rule that decided them, after a summary.

    The pipeline is built on --device (its factory gets it when it accepts one, else the
    pipeline is moved there), and the presets follow that device's probe. With
    --calibrate the preset's candidates are timed on the pipeline (batch 1), or a
    remembered decision is reused, and the figures it was decided on are shown.
    """
    from mixprec import pipelines

    _one_policy(preset, policy)
    if calibrate and preset is None:
        fail(ValueError("--calibrate checks a preset on the pipeline: give --preset, not --policy"))
    calibration = None
    try:
        device = checked_device(device)
        pipe = pipelines.get(pipeline, size=size, device=device)
        if calibrate:
            from mixprec.calibration import calibrate as run_calibration

            calibration = run_calibration(pipe, preset, example_inputs(pipe, pipeline, 1, 0))
            pol = calibration.policy
        else:
            pol = _policy_for(pipe, preset, policy, device)
        if compiled and pol.compile is None:
            pol = dataclasses.replace(pol, compile=mixprec.CompileSettings())
        rows = mixprec.explain(pipe, pol)
        pitfalls = mixprec.explain_warnings(pipe, pol)
        unmatched = explain_unmatched(pipe, pol)
        advice = compile_advice(pipe, pol, _device_type(device))
    except (ValueError, NotImplementedError) as exc:
        fail(exc)
    if not all_modules:
        owners = {name for name, m in _owners(pipe)}
        rows = [r for r in rows if r["module"] in owners]
    if as_json:
        console.print_json(json.dumps({"device": device, "policy": pol.to_dict(), "modules": rows,
                                       "warnings": summarise_unmatched(unmatched) + pitfalls,
                                       "unmatched_rules": [u.to_dict() for u in unmatched], "advice": advice,
                                       "calibration": calibration.to_dict() if calibration is not None else None}, default=str))
        return
    title = f"{pipeline} under {pol.name} on {device}"
    shown = explain_rows(rows, expand=expand)
    for text in explain_summary(title, rows, warnings=len(pitfalls) + len(summarise_unmatched(unmatched)), advice=len(advice),
                                collapsed=None if expand or len(shown) == len(rows) else len(shown)):
        say(console, text, soft_wrap=False)
    console.print(table(title, EXPLAIN_COLUMNS, shown, drop=EXPLAIN_DROP))
    reasons = "; ".join(f"#{i} {r.match}: {r.reason}" for i, r in enumerate(pol.rules) if r.reason)
    if reasons:
        say(console, "rules: " + reasons, soft_wrap=False)
    for pitfall in pitfalls:
        say(console, "warning: ", pitfall, soft_wrap=False)
    for message in summarise_unmatched(unmatched):  # on stderr too: a typo'd pin is not a table row
        say(err_console, ("warning:", "yellow"), " ", message)
    for hint in advice:
        say(console, "advice: ", hint, soft_wrap=False)
    if calibration is not None:
        from mixprec.cli.calibrate import (CALIBRATION_COLUMNS, COMPONENT_COLUMNS, calibration_lines, calibration_rows,
                                           component_rows)

        lines = calibration_lines(calibration)
        say(console, "calibrated: ", lines[0], soft_wrap=False)
        if calibration.components:
            console.print(table(f"{pipeline}: {preset} calibrated per component", COMPONENT_COLUMNS,
                                component_rows(calibration)))
        console.print(table(f"{pipeline}: {preset}'s candidates", CALIBRATION_COLUMNS, calibration_rows(calibration),
                            drop=("out / also", "weights")))
        for reason in lines[1:]:
            say(console, "  - ", reason, soft_wrap=False)


def _device_type(device: str) -> str:
    import torch

    return torch.device(device).type


def _model_error(pipe: Any, inputs: Any, pipeline: str, policy_name: str, exc: Exception) -> str:
    """The message for a model that raised while profiled: run once more in fp32, without mixprec,
    to tell the model's own error from one the policy causes."""
    import copy
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno} ({frames[-1].name})" if frames else ""
    raised = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}{where}"
    try:
        pipe.run(copy.deepcopy(inputs))
    except Exception as again:
        if type(again) is type(exc):
            return (f"{pipeline}: the model raised {raised}. It raises the same in fp32 without mixprec, so this is the "
                    f"model's own error, not the precision policy's ({policy_name}); fix the model or its inputs first")
    return (f"{pipeline}: the model raised {raised} while profiled under {policy_name}; it runs in fp32 without "
            "mixprec, so the policy causes it: try a policy that keeps more in fp32, or mixprec.guard to find the module")


def _owners(pipe: Any):
    from mixprec.policy import iter_modules

    for name, module in iter_modules(dict(pipe.components)):
        if any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False)):
            yield name, module


@contextlib.contextmanager
def working(what: str) -> Iterator[None]:
    """A spinner with the elapsed time on stderr while long work runs (gone when it ends)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        bar.add_task(clean(what), total=None)
        yield


@contextlib.contextmanager
def _profile_bar(what: str) -> Iterator[Any]:
    """A progress bar on stderr fed by :func:`mixprec.profile`'s progress: the pass, module calls done and time left."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), TextColumn("{task.fields[left]}"),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task(clean(f"{what}: starting"), total=None, left="")

        def progress(event: Any) -> None:
            left = "" if event.left_s is None else f"about {event.left_s / 60:.0f} min left" if event.left_s >= 90 \
                else f"about {event.left_s:.0f} s left"
            bar.update(task, description=clean(f"{what}: {event.phase} {event.done}/{event.total} calls"),
                       completed=event.done, total=event.total or None, left=left)

        yield progress


@app.command()
def diagnose(
    pipeline: PipelineFlag,
    preset: Annotated[Optional[str], typer.Option("--preset", help=PRESET_HELP)] = None,
    policy: Annotated[Optional[str], typer.Option("--policy", help="Policy .toml/.json file.")] = None,
    size: SizeFlag = "default",
    seed: Annotated[str, typer.Option("--seed", help="Seed of weights and inputs.")] = "0",
    top: Annotated[int, typer.Option("--top", help="Rows to show (0: all).")] = 25,
    device: DeviceFlag = None,
    save: Annotated[bool, typer.Option("--save", help="Keep the profile rows in the benchmark store.")] = False,
    db: Annotated[Optional[str], typer.Option("--db", help="SQLite file for --save (default: the benchmark store).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Profile every module under a policy: range, fp16 headroom, underflow, own and inherited error.

    The pipeline is built and profiled on --device (stored with the profile by --save).
    """
    from mixprec import pipelines

    _one_policy(preset, policy)
    try:
        run_seed = as_int(seed, "--seed", low=0, high=MAX_SEED)
        if top < 0:
            raise ValueError(f"--top {top}: expected a number of rows >= 0 (0: all)")
        device = checked_device(device)
        with working(f"{pipeline}: building the pipeline on {device}"):
            pipe = pipelines.get(pipeline, size=size, seed=run_seed, device=device)
            pol = _policy_for(pipe, preset, policy, device)
            inputs = example_inputs(pipe, pipeline, 1, run_seed)
    except (ValueError, NotImplementedError) as exc:
        fail(exc)
    try:
        with _profile_bar(f"{pipeline} under {pol.name}") as progress:
            prof = mixprec.profile(pipe, inputs, pol, progress=progress)
    except (ValueError, NotImplementedError, mixprec.PrecisionDtypeError) as exc:
        fail(exc)
    except Exception as exc:  # the model's code raised: say whose error it is, as the guard and bench do
        fail(_model_error(pipe, inputs, pipeline, pol.name, exc))
    if save:
        from mixprec.device import hardware as hardware_module
        from mixprec.measure.machine import machine_fingerprint

        store = open_store(db)
        hw = hardware_module.probe(device)
        run_id = store.start_run(pipeline=pipeline, size=size, machine={**hw.to_dict(), "device": device},
                                 fingerprint=machine_fingerprint(hw),
                                 versions={"mixprec": mixprec.__version__}, notes=[f"mixprec diagnose under {pol.name}"],
                                 command="mixprec diagnose")
        store.add_profile_rows(run_id, pol.name, prof.rows())
        store.finish_run(run_id)
        say(err_console, f"profile stored as run {run_id} in {store.path}")
    if as_json:
        console.print_json(json.dumps({"policy": pol.to_dict(), "modules": prof.rows(), "suggestions": prof.suggestions()}))
        return
    rows = prof.by_risk()[: top or None]

    console.print(table(f"{pipeline} under {pol.name} on {device}: most at risk first", PROFILE_COLUMNS, profile_rows(rows),
                        drop=PROFILE_DROP))
    suggestion = prof.suggestions_toml()
    if suggestion:
        say(console, "Suggested keep-fp32 rules (append to your policy file):")
        say(console, suggestion)
    else:
        say(console, "No module overflows fp16 or falls below 20 dB own SQNR under this policy.")


fallbacks_app = typer.Typer(help="Fallbacks the numerics guard remembered.", no_args_is_help=True)
app.add_typer(fallbacks_app, name="fallbacks")


@fallbacks_app.command("list")
def fallbacks_list(as_json: JsonFlag = False) -> None:
    """Every remembered fallback: model fingerprint, pinned modules and their dtypes."""
    from mixprec.diagnose.fallbacks import FallbackStore

    store = FallbackStore()
    data = store.load()
    if as_json:
        console.print_json(json.dumps({"path": str(store.path), "fallbacks": data}))
        return
    rows = [[key, entry.get("model"), module, dtype, entry.get("updated")]
            for key, entry in data.items() for module, dtype in entry.get("pins", {}).items()]
    console.print(table(f"Remembered fallbacks ({store.path})", ["fingerprint", "components", "module", "pinned to", "updated"], rows))


@fallbacks_app.command("clear")
def fallbacks_clear(fingerprint: Annotated[Optional[str], typer.Argument(help="Only this fingerprint.")] = None) -> None:
    """Forget remembered fallbacks (all, or one fingerprint)."""
    from mixprec.diagnose.fallbacks import FallbackStore

    removed = FallbackStore().clear(fingerprint)
    say(console, f"removed {removed} remembered fallback(s)")


@app.command("pipelines")
def pipelines_cmd(size: SizeFlag = "default", as_json: JsonFlag = False) -> None:
    """List the available pipelines with their components and parameter counts, and what each size is for and needs."""
    from mixprec import pipelines

    rows = pipelines.describe_all(size=size)
    for row in rows:  # every size, counted on the meta device: no weights are allocated
        row["sizes"] = pipelines.describe_sizes(row["name"])
    if as_json:
        console.print_json(json.dumps({"pipelines": rows, "plugin_errors": pipelines.plugin_errors()}))
        return
    table_rows, size_rows = [], []
    for row in rows:
        for name, info in row["sizes"].items():
            fp32 = info.get("fp32_weight_bytes", 0)
            memory = f"{fp32 / 2**30:,.2f} GiB" if fp32 >= 2**30 else f"{fp32 / 2**20:,.1f} MiB"
            needs = ([f"{info['parameters'] / 1e6:,.1f}M", memory]
                     if "error" not in info else [line((info["error"], "red")), "-"])
            size_rows.append([row["name"], name, info["purpose"] or "-", *needs])
        if "error" in row:
            table_rows.append([row["name"], "-", line((row["error"], "red")), "-"])
            continue
        comps = ", ".join(f"{c} {n / 1e6:.2f}M" for c, n in row["components"].items())
        table_rows.append([row["name"], row["output_kind"], comps, f"{row['total'] / 1e6:.2f}M"])
    console.print(table(f"Pipelines (size={size})", ["name", "output", "components (parameters)", "total"], table_rows))
    console.print(table("Sizes (--size): what each is for and what its weights need",
                        ["name", "size", "for", "parameters", "fp32 weights"], size_rows))
    say(console, "16-bit weights take half the fp32 figure; activations, caches and the runtime come on top.")
    for name, error in pipelines.plugin_errors().items():
        say(err_console, ("warning:", "yellow"), f" plugin {name!r} failed to load: {error}")


#: ``run``'s timed fields, labelled so that the run's wall time never reads as the output's length.
_RUN_FIELDS = {"wall_seconds": "wall time (the run)", "audio_seconds": "audio length"}


@app.command()
def run(
    pipeline: PipelineFlag,
    out: Annotated[str, typer.Option("--out", help=extension_help())],
    seed: Annotated[str, typer.Option("--seed", help="Seed of weights and inputs.")] = "0",
    batch: Annotated[str, typer.Option("--batch", help="Batch size.")] = "1",
    size: SizeFlag = "default",
    device: DeviceFlag = None,
) -> None:
    """Run a pipeline once on --device and write its output to a file you can open."""
    from mixprec import pipelines

    result: dict[str, Any] = {}

    def produce(path) -> None:
        result.update(pipelines.run_to_file(pipeline, path, seed=run_seed, batch=run_batch, size=size, device=run_device))

    outputs = Outputs(err_console)
    try:
        writable_path(out, "--out")
        run_seed, run_batch = as_int(seed, "--seed", low=0, high=MAX_SEED), as_int(batch, "--batch", high=MAX_BATCH)
        run_device = checked_device(device)
        with working(f"{pipeline}: building and running the pipeline once on {run_device}"):
            outputs.write(out, "--out", produce, again=f"mixprec run --pipeline {pipeline} --device {run_device} --out {out}")
    except (ValueError, NotImplementedError, pipelines.PipelineRunError) as exc:
        fail(exc)
    if result:
        result["path"] = out  # written under a temporary name first, then renamed
        console.print(table(f"mixprec run --pipeline {pipeline}", ["field", "value"], [
            [_RUN_FIELDS.get(k, k), f"{v:.2f} s" if k in _RUN_FIELDS and v is not None else v] for k, v in result.items()]))
    outputs.finish()
