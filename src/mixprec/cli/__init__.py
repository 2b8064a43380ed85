"""The ``mixprec`` command line: argument parsing and printing only.

Each command calls one library function and renders its result; human output is
rich tables, ``--json`` gives machines the same data.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

import mixprec
from mixprec.config import ConfigError

app = typer.Typer(
    name="mixprec",
    help="Safe, fast and measurable reduced-precision inference for PyTorch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the layered configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")

#: Width when stdout is a pipe or a file (logs, CI) and COLUMNS is unset: rich's 80 columns
#: would wrap the benchmark tables cell by cell; a terminal keeps its own width.
PIPE_WIDTH = 180
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else PIPE_WIDTH)
err_console = Console(stderr=True)

# Flags shared by every command that resolves configuration.
AppFlag = Annotated[Optional[str], typer.Option("--app", help="Your app's env-var prefix, e.g. ACE_STEP.")]
ConfigFlag = Annotated[Optional[str], typer.Option("--config", help="TOML file to read instead of pyproject.toml / mixprec.toml.")]
EnvFileFlag = Annotated[Optional[str], typer.Option("--env-file", help=".env file (default: ./.env when present).")]
MatmulFlag = Annotated[Optional[str], typer.Option("--float32-matmul-precision", help="highest | high | medium")]
ConvFlag = Annotated[Optional[str], typer.Option("--conv-tf32", help="true | false: TF32 in cuDNN convolutions")]
Fp16RedFlag = Annotated[Optional[str], typer.Option("--fp16-reduced-precision-reduction", help="true | false")]
Bf16RedFlag = Annotated[Optional[str], typer.Option("--bf16-reduced-precision-reduction", help="true | false")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def _cli_values(matmul: str | None, conv: str | None, fp16: str | None, bf16: str | None) -> dict[str, Any]:
    return {
        "float32_matmul_precision": matmul,
        "conv_tf32": conv,
        "fp16_reduced_precision_reduction": fp16,
        "bf16_reduced_precision_reduction": bf16,
    }


def _fail(exc: Exception | str) -> None:
    # The message repeats what the user passed (paths, values): printed as is, never as
    # Rich markup ("[red]p.toml" must not become "p.toml").
    err_console.print(Text.assemble(("error:", "bold red"), " ", str(exc)), highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def _version_callback(value: bool) -> None:
    if value:
        console.print(f"mixprec {mixprec.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Show the version and exit.")] = False,
) -> None:
    """Safe, fast and measurable reduced-precision inference for PyTorch."""


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version(), "mixprec": mixprec.__version__}
    for dist in ("torch", "transformers", "diffusers", "gradio"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for index, column in enumerate(columns):
        # The first column holds names (modules, settings): never cut them.
        table.add_column(column, no_wrap=index == 0, overflow="fold")
    for row in rows:
        table.add_row(*("-" if v is None else str(v) for v in row))
    return table


def _gib(n: int | None) -> str | None:
    if n is None:
        return None
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


@app.command()
def env(
    app_prefix: AppFlag = None,
    config: ConfigFlag = None,
    env_file: EnvFileFlag = None,
    matmul: MatmulFlag = None,
    conv_tf32: ConvFlag = None,
    fp16_rpr: Fp16RedFlag = None,
    bf16_rpr: Bf16RedFlag = None,
    device: Annotated[Optional[str], typer.Option("--device", help="cpu | cuda | cuda:N | mps (default: best available)")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Measure the hardware again instead of using the cache.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Hardware, measured precision speeds, effective torch numerics and versions."""
    from mixprec.device import hardware

    try:
        resolved = mixprec.init(
            app_prefix, config_file=config, env_file=env_file, cli=_cli_values(matmul, conv_tf32, fp16_rpr, bf16_rpr)
        )
        hw = hardware.probe(device, use_cache=not no_cache)
    except (ConfigError, ValueError) as exc:
        _fail(exc)
    state = mixprec.describe()
    if as_json:
        payload = {"versions": _versions(), "hardware": hw.to_dict(), "numerics": state, "settings": resolved.rows()}
        console.print_json(json.dumps(payload, default=str))
        return

    console.print(_table("Hardware", ["property", "value"], [
        ["device", hw.device_type], ["name", hw.name],
        ["compute capability", ".".join(map(str, hw.capability)) if hw.capability else None],
        ["memory", _gib(hw.memory_bytes)], ["cpu flags", " ".join(hw.cpu_flags) or None],
        ["threads", hw.threads],
        ["fp32 matmul GFLOP/s by level", " / ".join(f"{k} {v:.0f}" for k, v in hw.matmul_levels.items())],
        ["probe", f"{hw.matmul_size}x{hw.matmul_size} matmul, {hw.seconds:.2f} s" + (" (cached)" if hw.cached else "")],
    ]))
    console.print(_table("Precisions (measured)", ["dtype", "supported", "GFLOP/s", "vs fp32", "class"], [
        [d.name, "yes" if d.supported else "no", d.gflops, f"{d.ratio:.2f}x" if d.ratio else None, d.klass]
        for d in hw.dtypes.values()
    ]))
    console.print(_table("Effective numerics (read back from torch)", ["flag", "value"], [
        ["float32 matmul precision", state["float32_matmul_precision"]],
        *[[f"{k.replace('_', ' ')}", f"{v} ({state['backend_meaning'][k]})"] for k, v in state["backends"].items()],
        ["fp16 reduced-precision reduction", state["fp16_reduced_precision_reduction"]],
        ["bf16 reduced-precision reduction", state["bf16_reduced_precision_reduction"]],
        ["torch API", state["api"]],
    ]))
    console.print(_table("Settings", ["setting", "value", "source"], [[r["key"], r["value"], r["source"]] for r in resolved.rows()]))
    console.print(_table("Versions", ["package", "version"], [[k, v] for k, v in _versions().items()]))


@config_app.command("show")
def config_show(
    app_prefix: AppFlag = None,
    config: ConfigFlag = None,
    env_file: EnvFileFlag = None,
    matmul: MatmulFlag = None,
    conv_tf32: ConvFlag = None,
    fp16_rpr: Fp16RedFlag = None,
    bf16_rpr: Bf16RedFlag = None,
    as_json: JsonFlag = False,
) -> None:
    """Each setting, its effective value and the source it came from (nothing is applied)."""
    try:
        resolved = mixprec.resolve(
            app_prefix, config_file=config, env_file=env_file, cli=_cli_values(matmul, conv_tf32, fp16_rpr, bf16_rpr)
        )
    except (ConfigError, ValueError) as exc:
        _fail(exc)
    if as_json:
        console.print_json(json.dumps({"app": resolved.app, "files": list(resolved.files), "settings": resolved.rows()}))
        return
    for message in resolved.warnings:
        err_console.print(f"[yellow]warning:[/] {message}", highlight=False)
    console.print(_table("mixprec configuration", ["setting", "value", "source"], [[r["key"], r["value"], r["source"]] for r in resolved.rows()]))
    if resolved.files:
        console.print("files read: " + ", ".join(resolved.files), highlight=False)


SizeFlag = Annotated[str, typer.Option("--size", help="Pipeline size: default (benchmark-sized) or test (tiny).")]
PipelineFlag = Annotated[str, typer.Option("--pipeline", help="Pipeline name (see `mixprec pipelines`), or your factory: module.path:factory or path/to/file.py:factory.")]
DeviceFlag = Annotated[Optional[str], typer.Option("--device", help="cpu | cuda | cuda:N | mps (default: best available)")]


@app.command("presets")
def presets_cmd(device: DeviceFlag = None, as_json: JsonFlag = False) -> None:
    """Each preset as resolved on this machine, with the reasons for every choice."""
    from mixprec.device import hardware
    from mixprec.policy import presets

    try:
        hw = hardware.probe(device)
    except ValueError as exc:
        _fail(exc)
    resolved = {name: presets.resolve(name, hw) for name in presets.PRESETS}
    if as_json:
        console.print_json(json.dumps({n: {"policy": p.to_dict(), "reasons": r} for n, (p, r) in resolved.items()}))
        return
    console.print(f"Presets for {hw.device_type} ({hw.name})", highlight=False)
    for name, (policy, reasons) in resolved.items():
        rows = [[f"#{i}", r.match, r.storage, r.compute, r.keep_fp32, r.upcast_attention, r.reason] for i, r in enumerate(policy.rules)]
        table = _table(f"{name}: matmul={policy.numerics.matmul if policy.numerics else '-'}",
                       ["rule", "match", "storage", "compute", "keep_fp32", "upcast attn", "reason"], rows)
        console.print(table)
        for reason in reasons:
            console.print(f"  - {reason}", highlight=False)


def _policy_for(pipe: Any, preset_name: str | None, policy_file: str | None, device: str | None) -> Any:
    from mixprec.device import hardware
    from mixprec.policy import Policy

    if policy_file:
        return Policy.load(policy_file)
    if preset_name:
        return mixprec.preset(preset_name, hardware=hardware.probe(device), hints=tuple(pipe.sensitive))
    return None


@app.command()
def explain(
    pipeline: PipelineFlag,
    preset: Annotated[Optional[str], typer.Option("--preset", help="quality | balanced | fast | memory")] = None,
    policy: Annotated[Optional[str], typer.Option("--policy", help="Policy .toml/.json file.")] = None,
    size: SizeFlag = "default",
    device: DeviceFlag = None,
    all_modules: Annotated[bool, typer.Option("--all", help="List every module, not only those that own weights.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Per module: storage and compute dtype and the rule that decided them."""
    from mixprec import pipelines

    if (preset is None) == (policy is None):
        _fail(ValueError("give exactly one of --preset or --policy"))
    try:
        pipe = pipelines.get(pipeline, size=size)
        pol = _policy_for(pipe, preset, policy, device)
        rows = mixprec.explain(pipe, pol)
        pitfalls = mixprec.explain_warnings(pipe, pol)
    except (ValueError, NotImplementedError) as exc:
        _fail(exc)
    if not all_modules:
        owners = {name for name, m in _owners(pipe)}
        rows = [r for r in rows if r["module"] in owners]
    if as_json:
        console.print_json(json.dumps({"policy": pol.to_dict(), "modules": rows, "warnings": pitfalls}))
        return
    console.print(_table(f"{pipeline} under {pol.name}", ["module", "type", "storage", "compute", "attention", "rule"],
                         [[r["module"], r["type"], r["storage"], r["compute"], r["attention"] or None, r["rule"]] for r in rows]))
    console.print("rules: " + "; ".join(f"#{i} {r.match}: {r.reason}" for i, r in enumerate(pol.rules) if r.reason),
                  highlight=False, markup=False)
    for pitfall in pitfalls:
        console.print(f"warning: {pitfall}", highlight=False, markup=False)


def _owners(pipe: Any):
    from mixprec.policy import iter_modules

    for name, module in iter_modules(dict(pipe.components)):
        if any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False)):
            yield name, module


@app.command()
def diagnose(
    pipeline: PipelineFlag,
    preset: Annotated[Optional[str], typer.Option("--preset", help="quality | balanced | fast | memory")] = None,
    policy: Annotated[Optional[str], typer.Option("--policy", help="Policy .toml/.json file.")] = None,
    size: SizeFlag = "default",
    seed: Annotated[str, typer.Option("--seed", help="Seed of weights and inputs.")] = "0",
    top: Annotated[int, typer.Option("--top", help="Rows to show (0: all).")] = 25,
    device: DeviceFlag = None,
    save: Annotated[bool, typer.Option("--save", help="Keep the profile rows in the benchmark store.")] = False,
    db: Annotated[Optional[str], typer.Option("--db", help="SQLite file for --save (default: the benchmark store).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Profile every module under a policy: range, fp16 headroom, underflow, own and inherited error."""
    from mixprec import pipelines

    if (preset is None) == (policy is None):
        _fail(ValueError("give exactly one of --preset or --policy"))
    try:
        pipe = pipelines.get(pipeline, size=size, seed=_as_int(seed, "--seed"))
        pol = _policy_for(pipe, preset, policy, device)
        prof = mixprec.profile(pipe, pipe.example_inputs(1, _as_int(seed, "--seed")), pol)
    except (ValueError, NotImplementedError) as exc:
        _fail(exc)
    if save:
        from mixprec.device import hardware as hardware_module
        from mixprec.measure.machine import machine_fingerprint

        store = _open_store(db)
        hw = hardware_module.probe(device)
        run_id = store.start_run(pipeline=pipeline, size=size, machine=hw.to_dict(), fingerprint=machine_fingerprint(hw),
                                 versions={"mixprec": mixprec.__version__}, notes=[f"mixprec diagnose under {pol.name}"],
                                 command="mixprec diagnose")
        store.add_profile_rows(run_id, pol.name, prof.rows())
        store.finish_run(run_id)
        err_console.print(f"profile stored as run {run_id} in {store.path}", highlight=False)
    if as_json:
        console.print_json(json.dumps({"policy": pol.to_dict(), "modules": prof.rows(), "suggestions": prof.suggestions()}))
        return
    rows = prof.by_risk()[: top or None]

    def db(v: float | None) -> str | None:
        return None if v is None else f"{v:.1f}"

    table = _table(f"{pipeline} under {pol.name}: most at risk first",
                   ["module", "type", "compute", "calls", "absmax in/out", "fp16 room", "underflow 16/bf", "own dB", "inher. dB"],
                   [[("[bold red]" + s.module + " (fp16 overflow)[/]") if s.overflows_fp16 else s.module,
                     s.type if s.owns_weights else f"{s.type} (block)", s.compute, s.calls,
                     f"{s.input_absmax:.3g}/{s.output_absmax:.3g}", f"{s.fp16_headroom:.2g}",
                     f"{s.underflow_fp16:.1%}/{s.underflow_bf16:.1%}", db(s.own_sqnr_db), db(s.inherited_sqnr_db)] for s in rows])
    console.print(table)
    suggestion = prof.suggestions_toml()
    if suggestion:
        console.print("Suggested keep-fp32 rules (append to your policy file):", highlight=False)
        console.print(suggestion, highlight=False, markup=False)
    else:
        console.print("No module overflows fp16 or falls below 20 dB own SQNR under this policy.", highlight=False)


fallbacks_app = typer.Typer(help="Fallbacks the numerics guard remembered.", no_args_is_help=True)
app.add_typer(fallbacks_app, name="fallbacks")


@fallbacks_app.command("list")
def fallbacks_list(as_json: JsonFlag = False) -> None:
    """Every remembered fallback: model fingerprint, pinned modules and their dtypes."""
    from mixprec.diagnose.guard import FallbackStore

    store = FallbackStore()
    data = store.load()
    if as_json:
        console.print_json(json.dumps({"path": str(store.path), "fallbacks": data}))
        return
    rows = [[key, entry.get("model"), module, dtype, entry.get("updated")]
            for key, entry in data.items() for module, dtype in entry.get("pins", {}).items()]
    console.print(_table(f"Remembered fallbacks ({store.path})", ["fingerprint", "components", "module", "pinned to", "updated"], rows))


@fallbacks_app.command("clear")
def fallbacks_clear(fingerprint: Annotated[Optional[str], typer.Argument(help="Only this fingerprint.")] = None) -> None:
    """Forget remembered fallbacks (all, or one fingerprint)."""
    from mixprec.diagnose.guard import FallbackStore

    removed = FallbackStore().clear(fingerprint)
    console.print(f"removed {removed} remembered fallback(s)", highlight=False)


@app.command("pipelines")
def pipelines_cmd(size: SizeFlag = "default", as_json: JsonFlag = False) -> None:
    """List the available pipelines with their components and parameter counts."""
    from mixprec import pipelines

    rows = pipelines.describe_all(size=size)
    if as_json:
        console.print_json(json.dumps({"pipelines": rows, "plugin_errors": pipelines.plugin_errors()}))
        return
    table_rows = []
    for row in rows:
        if "error" in row:
            table_rows.append([row["name"], "-", f"[red]{row['error']}[/]", "-"])
            continue
        comps = ", ".join(f"{c} {n / 1e6:.2f}M" for c, n in row["components"].items())
        table_rows.append([row["name"], row["output_kind"], comps, f"{row['total'] / 1e6:.2f}M"])
    console.print(_table(f"Pipelines (size={size})", ["name", "output", "components (parameters)", "total"], table_rows))
    for name, error in pipelines.plugin_errors().items():
        err_console.print(f"[yellow]warning:[/] plugin {name!r} failed to load: {error}", highlight=False)


@app.command()
def run(
    pipeline: PipelineFlag,
    out: Annotated[str, typer.Option("--out", help="Output file: .wav (audio), .png (image), .npy/.json (embedding).")],
    seed: Annotated[str, typer.Option("--seed", help="Seed of weights and inputs.")] = "0",
    batch: Annotated[str, typer.Option("--batch", help="Batch size.")] = "1",
    size: SizeFlag = "default",
) -> None:
    """Run a pipeline once and write its output to a file you can open."""
    from mixprec import pipelines

    try:
        _writable_path(out, "--out")
        result = pipelines.run_to_file(pipeline, out, seed=_as_int(seed, "--seed"), batch=_as_int(batch, "--batch"), size=size)
    except (ValueError, NotImplementedError) as exc:
        _fail(exc)
    console.print(_table(f"mixprec run --pipeline {pipeline}", ["field", "value"], [[k, v] for k, v in result.items()]))


DbFlag = Annotated[Optional[str], typer.Option("--db", help="SQLite file (default: bench.sqlite in the user data dir, or MIXPREC_DB).")]


def _writable_path(path: str | None, flag: str) -> None:
    """Refuse, before any work, an output path that cannot be written (a whole search or run would be lost)."""
    if path is None:
        return
    if not path.strip():
        raise ValueError(f"{flag}: empty path")
    target = Path(path).expanduser()
    if target.is_dir():
        raise ValueError(f"{flag} {path!r}: is a directory; give a file name")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.exists():
        raise ValueError(f"{flag} {path!r}: directory {str(parent)!r} does not exist")
    if not parent.is_dir():
        raise ValueError(f"{flag} {path!r}: {str(parent)!r} is a file, not a directory")
    if target.exists() and not os.access(target, os.W_OK):
        raise ValueError(f"{flag} {path!r}: the file is not writable")
    if not target.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path!r}: cannot create files in {str(parent)!r}")


def _open_store(db: str | None):
    from mixprec.bench.store import Store, StoreError

    try:
        _writable_path(db, "--db")
        return Store(db)
    except (StoreError, ValueError) as exc:
        _fail(exc)


def _checked_pipeline(name: str, size: str, seed: int, batch: int, device: str | None) -> str:
    """The pipeline as worker processes get it: a registered name, or a factory spec with an absolute path.

    A factory is built and asked for example inputs once here, so that a broken
    one fails with its own error (exit status 2) instead of in every worker.
    """
    import gc

    from mixprec import pipelines

    if not pipelines.is_factory_spec(name):
        if name not in pipelines.available():
            pipelines.get(name)  # raises the registry's error, which lists the pipelines
        if size not in ("default", "test"):
            pipelines.get(name, size=size, seed=seed)  # an unknown size: the pipeline's own error, before any worker
            gc.collect()
        return name
    spec = pipelines.normalize_spec(name)
    pipe = pipelines.get(spec, size=size, seed=seed, **({"device": device} if device else {}))
    pipe.example_inputs(batch, seed)
    del pipe
    gc.collect()
    return spec


def _int_list(text: str, flag: str) -> list[int]:
    values = [_as_int(part, flag) for part in text.split(",") if part.strip()]
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{flag} {text!r}: expected comma-separated integers >= 1, e.g. 1,4")
    return values


_TERMINAL_COLUMNS = ("config", "batch", "status", "latency", "ci", "speedup", "throughput", "tokens_per_s", "rtf",
                     "peak_mem", "weights", "compile", "snr", "psnr", "sqnr", "token_agreement", "nonfinite", "fallbacks", "error")


def _print_run(run: dict) -> None:
    """The run as a terminal table: the headline columns (the HTML report has every metric)."""
    from mixprec.bench.report import COLUMNS, render_table_rows

    rows = render_table_rows(run)
    if not rows:
        return
    labels = dict(COLUMNS)
    keys = [k for k in _TERMINAL_COLUMNS if k in rows[0] and not (k == "sqnr" and ("snr" in rows[0] or "psnr" in rows[0]))]
    keys = [k for k in keys if k != "error" or any(r.get("error") for r in rows)]
    minmax = any("(min–max)" in r.get("ci", "") for r in rows)
    console.print(_table(f"run {run['id']}: {run['pipeline']} ({run['status']}) on {run['machine'].get('name')}",
                         [labels.get(k, k) for k in keys],
                         [[r[k].replace(" (min–max)", "*") if k == "ci" else r[k] for k in keys] for r in rows]))
    if minmax:
        console.print("  * too few samples for a 95% interval of the median: the range of the samples is shown", highlight=False)
    for note in run.get("notes", []):
        console.print(f"  note: {note}", highlight=False, markup=False)


@app.command()
def bench(
    pipeline: Annotated[str, typer.Option("--pipeline", help="Comma-separated pipeline names, e.g. tts,diffusion, or factories module.path:factory / path/to/file.py:factory.")] = "tts",
    configs: Annotated[Optional[str], typer.Option("--configs", help="Comma-separated configurations (default: all that can help here).")] = None,
    batch: Annotated[str, typer.Option("--batch", help="Comma-separated batch sizes.")] = "1",
    repeat: Annotated[str, typer.Option("--repeat", help="Timed runs per configuration.")] = "3",
    warmup: Annotated[str, typer.Option("--warmup", help="Untimed runs first.")] = "1",
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="Seconds each configuration may spend running, per batch size (default: 20x the fp32 reference's measured time, at least 30 s; the reference itself is not timed out).")] = None,
    size: SizeFlag = "default",
    seed: Annotated[str, typer.Option("--seed", help="Seed of weights and inputs.")] = "0",
    device: Annotated[str, typer.Option("--device", help="cpu or cuda")] = "cpu",
    db: DbFlag = None,
    html: Annotated[Optional[str], typer.Option("--html", help="Write a self-contained HTML report here.")] = None,
    json_out: Annotated[Optional[str], typer.Option("--json", help="Write the runs as JSON here.")] = None,
    csv_out: Annotated[Optional[str], typer.Option("--csv", help="Write one CSV row per configuration here.")] = None,
    budget: Annotated[Optional[str], typer.Option("--budget", help="Fit the whole benchmark into this time (e.g. 6m, 360s): the fp32 reference's first run calibrates, then warm-up and timed runs (at most --warmup and --repeat) and, if needed, the pipeline's steps are chosen to fit; the choice is printed.")] = None,
    force_batch: Annotated[bool, typer.Option("--force-batch", help="Skip the check that every --batch fits in free memory.")] = False,
    compiled: Annotated[bool, typer.Option("--compile", help="Add a compiled twin (torch.compile, inductor) of every configuration; or name them: fast+compile.")] = False,
) -> None:
    """Measure speed, memory and quality per precision configuration, side by side."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from mixprec.device import hardware
    from mixprec.bench import plan, report
    from mixprec.bench.configs import parse_configs
    from mixprec.bench.runner import BenchOptions, run_bench

    try:
        batches = _int_list(batch, "--batch")
        n_repeat, n_warmup = _as_int(repeat, "--repeat"), _as_int(warmup, "--warmup")
        if n_repeat < 1 or n_warmup < 0:
            raise ValueError(f"--repeat must be >= 1 and --warmup >= 0, got {n_repeat} and {n_warmup}")
        if timeout is not None and (not math.isfinite(timeout) or timeout <= 0):
            raise ValueError(f"--timeout {timeout}: must be a finite, positive number of seconds")
        run_seed = _as_int(seed, "--seed")
        budget_s = plan.parse_budget(budget, "--budget") if budget is not None else None
        for flag, path in (("--html", html), ("--json", json_out), ("--csv", csv_out)):
            _writable_path(path, flag)
        if not any(p.strip() for p in pipeline.split(",")):
            raise ValueError(f"--pipeline {pipeline!r}: give at least one pipeline (see mixprec pipelines)")
        names = [_checked_pipeline(p.strip(), size, run_seed, batches[0], device) for p in pipeline.split(",") if p.strip()]
        hw = hardware.probe(device)
        specs, notes = parse_configs(configs, hw, compiled_twins=compiled)
        if any(s.compile for s in specs):
            from mixprec.casting.apply import check_compiler

            check_compiler(mixprec.CompileSettings(), device == "cpu")
    except (ValueError, NotImplementedError, mixprec.ApplyError) as exc:
        _fail(exc)
    store = _open_store(db)
    command = "mixprec bench " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "mixprec bench"
    if max(batches) > 1 and not force_batch:
        for name in names:
            _check_batches(BenchOptions(pipeline=name, configs=specs, size=size, seed=run_seed, device=device,
                                        timeout=timeout), batches, hw)
    run_ids = []
    deadline = time.monotonic() + budget_s if budget_s is not None else None
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=err_console, transient=False) as bar:
        for index, name in enumerate(names):
            task = bar.add_task(f"{name}: starting {len(specs)} workers", total=_steps(len(specs), n_warmup, n_repeat) * len(batches))

            def step(description: str, n: int, task=task, name=name) -> None:
                bar.update(task, advance=n, description=f"{name}: {description}")

            def planned(batch_size: int, chosen: plan.Plan, task=task, name=name) -> None:
                bar.console.print(f"{name}: batch {batch_size}: {chosen.reason}", highlight=False, markup=False)
                bar.update(task, total=_steps(len(specs), chosen.warmup, chosen.repeat) * len(batches))

            share = None if deadline is None else (deadline - time.monotonic()) / (len(names) - index)
            options = BenchOptions(pipeline=name, configs=specs, batches=batches, repeat=n_repeat, warmup=n_warmup,
                                   timeout=timeout, size=size, seed=run_seed, device=device, notes=notes, command=command,
                                   budget=share, on_plan=planned)
            run_ids.append(run_bench(options, hw, store, progress=step))
    runs = [store.load_run(i) for i in run_ids]
    for run in runs:
        _print_run(run)
    if html:
        report.save_html(runs, html)
        console.print(f"report written to {html}", highlight=False)
    if json_out:
        Path(json_out).write_text(report.to_json(runs))
    if csv_out:
        Path(csv_out).write_text(report.to_csv(runs))
    console.print(f"stored as run(s) {', '.join(map(str, run_ids))} in {store.path}", highlight=False)


def _steps(configs: int, warmup: int, repeat: int) -> int:
    """Progress steps of one batch size: every run, the reference's first one included."""
    return configs * (warmup + repeat) + (0 if warmup else 1)


def _check_batches(options: Any, batches: list[int], hw: Any) -> None:
    """Refuse batch sizes that cannot fit in free memory, before any run is stored.

    The fp32 reference is loaded and run once at batch 1 to measure the weights and
    the memory one item takes; every configuration's worker holds both at once.
    """
    from mixprec.bench.plan import batch_limit
    from mixprec.bench.runner import calibrate
    from mixprec.measure.executor import WorkerError, WorkerTimeout
    from mixprec.device.hardware import available_memory

    free = available_memory(options.device)
    if free is None:
        return
    err_console.print(f"{options.pipeline}: measuring the memory of one item to check --batch {max(batches)} ...",
                      highlight=False, markup=False)
    try:
        cal = calibrate(options, hw, batch=1)
    except (WorkerError, WorkerTimeout) as exc:
        _fail(f"{options.pipeline}: the fp32 reference failed while measuring memory for --batch: {exc}")
    workers = len(options.configs)
    limit = batch_limit(cal, workers=workers, available_bytes=free)
    too_big = [b for b in batches if b > limit]
    if too_big:
        _fail(f"--batch {max(too_big)}: at most {limit} fit{'s' if limit == 1 else ''} in the {_gib(free)} free on this "
              f"machine for {options.pipeline} ({workers} configuration workers, each holding the weights "
              f"({_gib(cal.weight_bytes)}) and about {_gib(max(1 << 20, cal.peak_bytes))} per item, measured at batch 1); "
              f"use a smaller --batch, fewer --configs, or --force-batch to try anyway")


runs_app = typer.Typer(help="Benchmark runs in the store.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")


@runs_app.command("list")
def runs_list(db: DbFlag = None, as_json: JsonFlag = False) -> None:
    """Recent runs."""
    store = _open_store(db)
    rows = store.runs()
    if as_json:
        console.print_json(json.dumps(rows))
        return
    console.print(_table(f"runs in {store.path}", ["id", "started", "finished", "status", "pipeline", "size", "configs"],
                         [[r["id"], r["started"], r["finished"], r["status"], r["pipeline"], r["size"], r["configs"]] for r in rows]))


@runs_app.command("show")
def runs_show(run_id: Annotated[int, typer.Argument(help="Run id.")], db: DbFlag = None,
              html: Annotated[Optional[str], typer.Option("--html", help="Also write an HTML report.")] = None,
              as_json: JsonFlag = False) -> None:
    """One run: every configuration and metric."""
    from mixprec.bench import report
    from mixprec.bench.store import StoreError

    store = _open_store(db)
    try:
        run = store.load_run(run_id)
    except StoreError as exc:
        _fail(exc)
    if as_json:
        console.print(report.to_json([run]), highlight=False, markup=False)
        return
    _print_run(run)
    if html:
        report.save_html([run], html)


@app.command()
def compare(run_a: Annotated[int, typer.Argument(help="Earlier run id.")], run_b: Annotated[int, typer.Argument(help="Later run id.")],
            db: DbFlag = None, as_json: JsonFlag = False) -> None:
    """Per-configuration changes from run A to run B, and which exceed the noise."""
    from mixprec.bench.gate import compare as compare_runs
    from mixprec.bench.store import StoreError

    store = _open_store(db)
    try:
        rows = compare_runs(store.load_run(run_a), store.load_run(run_b))
    except (StoreError, ValueError) as exc:
        _fail(exc)
    if as_json:
        console.print_json(json.dumps(rows, default=str))
        return
    console.print(_table(f"run {run_a} -> run {run_b}", ["config", "batch", "latency A", "latency B", "change", "beyond noise", "quality A", "quality B"], [
        [r["config"], r["batch"], _seconds(r.get("latency_a")), _seconds(r.get("latency_b")),
         f"{r['latency_change']:+.1%}" if "latency_change" in r else None,
         ("yes" if r["latency_significant"] else "no") if "latency_significant" in r else None,
         _quality(r.get("quality_a")), _quality(r.get("quality_b"))] for r in rows]))


def _seconds(value: float | None) -> str | None:
    return None if value is None else f"{value:.4f} s"


def _quality(value: float | None) -> str | None:
    if value is None:
        return None
    return "exact" if value == float("inf") else f"{value:.1f} dB"


@app.command("gate")
def gate_cmd(
    run_id: Annotated[int, typer.Argument(help="The run to check.")],
    baseline: Annotated[int, typer.Option("--baseline", help="The run to compare against.")],
    max_quality_drop: Annotated[str, typer.Option("--max-quality-drop")] = "5%",
    max_latency_regression: Annotated[str, typer.Option("--max-latency-regression")] = "10%",
    max_memory_increase: Annotated[str, typer.Option("--max-memory-increase")] = "0%",
    max_failure_rate: Annotated[str, typer.Option("--max-failure-rate")] = "1%",
    allow_different_machine: Annotated[bool, typer.Option("--allow-different-machine",
                                                          help="Gate against a baseline measured on another machine.")] = False,
    db: DbFlag = None,
) -> None:
    """Exit 1 and list every violation when a run regresses against a baseline (for CI)."""
    from mixprec.bench.gate import gate, thresholds_from_flags
    from mixprec.bench.store import StoreError

    try:
        thresholds = thresholds_from_flags(max_quality_drop=max_quality_drop, max_latency_regression=max_latency_regression,
                                           max_memory_increase=max_memory_increase, max_failure_rate=max_failure_rate)
    except ValueError as exc:
        _fail(exc)
    store = _open_store(db)
    try:
        violations = gate(store.load_run(run_id), store.load_run(baseline), thresholds,
                          allow_different_machine=allow_different_machine)
    except StoreError as exc:
        _fail(exc)
    if violations:
        console.print(f"gate FAILED: run {run_id} vs baseline {baseline}", highlight=False)
        for violation in violations:
            console.print(f"  - {violation}", highlight=False, markup=False)
        raise typer.Exit(code=1)
    console.print(f"gate passed: run {run_id} vs baseline {baseline}", highlight=False)


@app.command("tune")
def tune_cmd(
    pipeline: Annotated[str, typer.Option("--pipeline", help="Pipeline to tune: a registered name, or your factory module.path:factory / path/to/file.py:factory.")] = "tts",
    bound: Annotated[str, typer.Option("--bound", help="Quality bound 'metric op number', e.g. 'snr>=30' or 'cosine>=0.999'.")] = "sqnr>=30",
    objective: Annotated[str, typer.Option("--objective", help="latency (fastest) or memory (smallest weights).")] = "latency",
    budget: Annotated[Optional[str], typer.Option("--budget", help="Most measured evaluations (cached ones are free).")] = None,
    seeds: Annotated[str, typer.Option("--seeds", help="Number of seeds quality is measured on (worst case), or a comma-separated list.")] = "2",
    repeat: Annotated[str, typer.Option("--repeat", help="Timed runs per evaluation (median).")] = "2",
    size: SizeFlag = "default",
    db: DbFlag = None,
    out: Annotated[Optional[str], typer.Option("--out", help="Write the chosen policy as TOML here.")] = None,
    html: Annotated[Optional[str], typer.Option("--html", help="Write the frontier and search path as HTML here.")] = None,
    as_json: JsonFlag = False,
    try_compile: Annotated[bool, typer.Option("--try-compile", help="The local search also tries compiling the components (torch.compile), kept where it measures faster.")] = False,
    validation_seeds: Annotated[str, typer.Option("--validation-seeds", help="Held-out seeds the chosen policy must also meet the bound on: a count (3: the three seeds after the search seeds), or seeds such as 7,8,9 or 10-19; 0 disables validation.")] = "3",
    margin: Annotated[str, typer.Option("--margin", help="dB of error the search keeps below the bound, so the answer is not tuned to its edge (sqnr>=40 searches for 41 with 1); 0: none.")] = "1",
) -> None:
    """Find the fastest (or smallest) policy that meets a quality bound, by measurement.

    The search measures quality on --seeds; the chosen policy is then checked on
    --validation-seeds it never saw, and replaced by the next candidate of the frontier
    when it misses the bound there. Exit status 1 when no candidate meets the bound (the
    closest one is shown).
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from mixprec.tuning.tuner import render_tune_html

    try:
        parsed = mixprec.parse_bound(bound)
        if objective not in ("latency", "memory"):
            raise ValueError(f"--objective {objective!r}: expected latency or memory")
        n_budget = _as_int(budget, "--budget") if budget is not None else None
        if n_budget is not None and n_budget < 1:
            raise ValueError(f"--budget {budget!r}: expected a positive number of evaluations")
        seed_list = [_as_int(part, "--seeds") for part in seeds.split(",") if part.strip()]
        if len(seed_list) == 1:
            seed_list = list(range(seed_list[0]))
        if not seed_list or any(v < 0 for v in seed_list):
            raise ValueError(f"--seeds {seeds!r}: expected a count >= 1 (e.g. 2) or comma-separated seeds >= 0 (e.g. 0,1)")
        n_repeat = _as_int(repeat, "--repeat")
        if n_repeat < 1:
            raise ValueError(f"--repeat {repeat!r}: expected at least 1")
        held_out = _validation_seeds(validation_seeds, seed_list)
        margin_db = _as_float(margin, "--margin")
        if not (math.isfinite(margin_db) and margin_db >= 0):
            raise ValueError(f"--margin {margin!r}: expected a number of dB >= 0 (0: search to the bound itself)")
        _writable_path(out, "--out")
        _writable_path(html, "--html")
        if not pipeline.strip():
            raise ValueError(f"--pipeline {pipeline!r}: give a pipeline (see mixprec pipelines)")
        pipeline = _checked_pipeline(pipeline, size, 0, 1, None)
        if try_compile:
            from mixprec.casting.apply import check_compiler

            check_compiler(mixprec.CompileSettings(), True)
    except (ValueError, NotImplementedError) as exc:
        _fail(exc)
    store = _open_store(db)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err_console, transient=False) as bar:
        task = bar.add_task(f"{pipeline}: measuring the fp32 reference", total=n_budget)

        def progress(event) -> None:
            best = event.best
            best_text = (f"best {best.evaluation.latency_s:.3f} s, {best.evaluation.memory_bytes / 2**20:.1f} MiB, "
                         f"{parsed.key} {best.evaluation.quality.get(parsed.key, float('nan')):.4g}") if best else "none meets the bound yet"
            left = f", {event.budget - event.evaluations} left" if event.budget is not None else ""
            bar.update(task, completed=event.evaluations, description=f"{pipeline}: {event.latest.step[:40]} | {best_text}{left}")

        try:
            result = mixprec.tune(pipeline, parsed, objective=objective, budget=n_budget, seeds=seed_list, store=store,
                                  progress=progress, size=size, repeat=n_repeat, try_compile=try_compile,
                                  validation_seeds=held_out, margin=margin_db)
        except ValueError as exc:
            _fail(exc)
    if out:
        Path(out).write_text(result.to_toml(), encoding="utf-8")
    if html:
        Path(html).write_text(render_tune_html(result), encoding="utf-8")
    if as_json:
        from mixprec.tuning.tuner import _jsonable

        console.print_json(json.dumps(_jsonable(result.to_dict())))
    else:
        _print_tune(result, pipeline)
        if out:
            console.print(f"policy written to {out} (load it with mixprec.Policy.load, or MIXPREC_POLICY for mixprec.init)", highlight=False)
        if html:
            console.print(f"report written to {html}", highlight=False)
    if not result.met:
        err_console.print(f"[bold red]bound not met:[/] no candidate meets {parsed}; the closest "
                          f"({result.closest.step}) misses it by {result.miss:.4g}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=1)


def _print_tune(result, pipeline: str) -> None:
    key = result.bound.key

    def q(c) -> str:
        v = c.evaluation.quality.get(key)
        return "n/a" if v is None else ("exact" if v == float("inf") else f"{v:.6g}")

    shown = list(result.frontier)
    if result.chosen not in shown:  # chosen by the side-by-side re-timing, not by its search timing
        shown = sorted([*shown, result.chosen], key=lambda c: c.index)
    rows = [[c.index, c.step, f"{c.evaluation.latency_s:.4f}", f"{c.evaluation.memory_bytes / 2**20:.1f}", q(c),
             "yes" if c.met else "no", "chosen" if c is result.chosen else ""] for c in shown]
    console.print(_table(f"tune {pipeline}: frontier of {len(result.path)} candidates ({result.bound}, {result.objective})",
                         ["#", "step", "latency s", "weights MiB", key, "meets", ""], rows))
    console.print(f"{result.evaluations} measured evaluations, {result.cached} reused from the store, {result.wall_s:.0f} s",
                  highlight=False)
    for note in result.notes:
        console.print(f"  note: {note}", highlight=False, markup=False)
    from mixprec.tuning.tuner import validation_text

    console.print(f"validation: {validation_text(result)}", highlight=False, markup=False, soft_wrap=True)
    if result.seed_summary:
        rows = [[metric, _fmt_metric(v["worst"]), _fmt_metric(v["median"]), _fmt_metric(v["spread"]), int(v["seeds"])]
                for metric, v in result.seed_summary.items()]
        console.print(_table("how sure: the chosen policy's quality over every seed measured",
                             ["metric", "worst", "median", "spread", "seeds"], rows))
    if result.met:
        base = result.path[0].evaluation
        chosen = result.chosen.evaluation
        console.print(f"chosen: #{result.chosen.index} ({result.chosen.step}): {result.speedup:.2f}x "
                      f"the speed of fp32, weights {chosen.memory_bytes / base.memory_bytes:.0%} of fp32, {key} {q(result.chosen)}; "
                      f"kept fp32: {', '.join(result.keep_fp32) or 'none'}", highlight=False, markup=False, soft_wrap=True)


def _fmt_metric(value: float) -> str:
    return "exact" if value == float("inf") else f"{value:.6g}"


def _validation_seeds(text: str, search: list[int]) -> int | list[int]:
    """``--validation-seeds``: a count (one number), or seeds and ranges (``7,8,9``, ``10-19``)."""
    from mixprec.tuning.tuner import validation_seed_list

    valid = "a count (e.g. 3; 0 disables validation) or seeds such as 7,8,9 or 10-19"
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise ValueError(f"--validation-seeds {text!r}: expected {valid}")
    if len(parts) == 1 and "-" not in parts[0] and "," not in text:
        count = _as_int(parts[0], "--validation-seeds")
        if count < 0:
            raise ValueError(f"--validation-seeds {text!r}: expected {valid}")
        return count
    seeds: list[int] = []
    for part in parts:
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            raise ValueError(f"--validation-seeds {text!r}: {part!r} is not a seed or a range; expected {valid}") from None
        if first < 0 or last < first or last - first > 10_000:
            raise ValueError(f"--validation-seeds {text!r}: {part!r} is not a range of seeds >= 0; expected {valid}")
        seeds += range(first, last + 1)
    try:
        return list(validation_seed_list(seeds, search))
    except ValueError as exc:
        raise ValueError(f"--validation-seeds {text!r} vs --seeds: {exc}") from None


def _as_int(text: str, flag: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected an integer") from None


def _as_float(text: str, flag: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected a number") from None


@app.command("ui")
def ui_cmd(
    host: Annotated[str, typer.Option("--host", help="Interface to bind; anything but loopback exposes the UI to the network (warned).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 7860,
    lang: Annotated[str, typer.Option("--lang", help="Initial language: en, zh, ja or he.")] = "en",
) -> None:
    """Serve the web UI: run, benchmark, diagnose and tune in the browser (needs pip install 'mixprec\\[ui]')."""

    try:
        from mixprec.ui.app import launch
        from mixprec.ui.i18n import check_language
    except ImportError as exc:
        _fail(exc)
    try:
        check_language(lang)
    except ValueError as exc:
        _fail(ValueError(f"--lang: {exc}"))
    launch(host=host, port=port, lang=lang)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    app(args=argv if argv is not None else sys.argv[1:], prog_name="mixprec")


if __name__ == "__main__":  # pragma: no cover
    main()
