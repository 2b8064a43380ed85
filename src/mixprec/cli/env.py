"""The commands that show this machine and the resolved settings: ``env``, ``config show`` and ``presets``."""

from __future__ import annotations

import json
import platform
from importlib import metadata
from typing import Annotated, Any, Optional

import typer

import mixprec
from mixprec.cli._app import app
from mixprec.cli._choices import bool_help, matmul_values
from mixprec.cli._common import DEVICES, DeviceFlag, JsonFlag, console, err_console, fail, gib, table
from mixprec.cli._text import say
from mixprec.config import ConfigError

config_app = typer.Typer(help="Inspect the layered configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")

# Flags shared by every command that resolves configuration.
AppFlag = Annotated[Optional[str], typer.Option("--app", help="Your app's env-var prefix, e.g. ACE_STEP.")]
ConfigFlag = Annotated[Optional[str], typer.Option("--config", help="TOML file to read instead of pyproject.toml / mixprec.toml.")]
EnvFileFlag = Annotated[Optional[str], typer.Option("--env-file", help=".env file (default: ./.env when present).")]
MatmulFlag = Annotated[Optional[str], typer.Option("--float32-matmul-precision", help=" | ".join(matmul_values()))]
ConvFlag = Annotated[Optional[str], typer.Option("--conv-tf32", help=bool_help("TF32 in cuDNN convolutions"))]
Fp16RedFlag = Annotated[Optional[str], typer.Option("--fp16-reduced-precision-reduction", help=bool_help())]
Bf16RedFlag = Annotated[Optional[str], typer.Option("--bf16-reduced-precision-reduction", help=bool_help())]


def _cli_values(matmul: str | None, conv: str | None, fp16: str | None, bf16: str | None) -> dict[str, Any]:
    return {
        "float32_matmul_precision": matmul,
        "conv_tf32": conv,
        "fp16_reduced_precision_reduction": fp16,
        "bf16_reduced_precision_reduction": bf16,
    }


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version(), "mixprec": mixprec.__version__}
    for dist in ("torch", "transformers", "diffusers", "gradio"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _warn(note: str) -> None:
    say(err_console, ("warning:", "yellow"), " ", note)


def _not_used_json(resolved: Any) -> dict[str, Any]:
    """The --json fields of what the sources held and was not used: ``unused`` (each name with
    where, why and its kind) and ``warnings`` (unknown ``MIXPREC_*`` names near no setting)."""
    return {"unused": [u.to_dict() for u in resolved.unused], "warnings": list(resolved.warnings)}


@app.command()
def env(
    app_prefix: AppFlag = None,
    config: ConfigFlag = None,
    env_file: EnvFileFlag = None,
    matmul: MatmulFlag = None,
    conv_tf32: ConvFlag = None,
    fp16_rpr: Fp16RedFlag = None,
    bf16_rpr: Bf16RedFlag = None,
    device: Annotated[Optional[str], typer.Option("--device", help=f"{DEVICES} (default: best available)")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Measure the hardware again instead of using the cache.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Hardware, measured precision speeds, effective torch numerics and versions."""
    from mixprec.device import hardware

    try:
        # What the sources held and was not used: on stderr in mixprec's words (in --json, its "unused" field)
        resolved = mixprec.init(
            app_prefix, config_file=config, env_file=env_file, cli=_cli_values(matmul, conv_tf32, fp16_rpr, bf16_rpr),
            notes=(lambda _note: None) if as_json else _warn,
        )
        hw = hardware.probe(device, use_cache=not no_cache)
    except (ConfigError, ValueError) as exc:
        fail(exc)
    state = mixprec.describe()
    if as_json:
        payload = {"versions": _versions(), "hardware": hw.to_dict(), "numerics": state, "settings": resolved.rows(),
                   **_not_used_json(resolved)}
        console.print_json(json.dumps(payload, default=str))
        return

    console.print(table("Hardware", ["property", "value"], [
        ["device", hw.device_type], ["name", hw.name],
        ["compute capability", ".".join(map(str, hw.capability)) if hw.capability else None],
        ["memory", gib(hw.memory_bytes)], ["cpu flags", " ".join(hw.cpu_flags) or None],
        ["threads", hw.threads],
        ["fp32 matmul GFLOP/s by level" + (" (one thread)" if "1 thread" in hw.clock else ""),
         " / ".join(f"{k} {v:.0f}" for k, v in hw.matmul_levels.items())],
        ["probe", f"{hw.matmul_size}x{hw.matmul_size} matmul, {hw.seconds:.2f} s" + (f", timed in {hw.clock}" if hw.clock else "")
         + (f" (recorded in {hw.recorded} through MIXPREC_PROBE_FILE, not measured here)" if hw.recorded
            else " (cached)" if hw.cached else "")],
    ]))
    console.print(table("Precisions (measured)", ["dtype", "supported", "GFLOP/s" + (" (one thread)" if "1 thread" in hw.clock else ""),
                                                  "vs fp32", "class", "used as"], [
        [d.name, "yes" if d.supported else "no", d.gflops, hardware.ratio_text(d.ratio, d.klass), d.klass,
         hw.effective(d.name).klass]
        for d in hw.dtypes.values()
    ]))
    for d in hw.dtypes.values():
        if d.note:  # an undecided or unstable figure: why it is no evidence, that it was not cached, and what is used
            used = hw.effective(d.name)
            say(console, f"  {d.name} {d.klass}: {d.note}; not cached, "
                + (f"used as {used.klass} {used.note.split(':')[0]}" if used is not d else "used as not fast"))
    if hw.layers:
        console.print(table("Layer kinds: the 16-bit layer's time over an fp32 island's, casts included", [
            "dtype", "layer", "fp32 island gain", "presets keep it fp32"], [
            [dtype, kind, "unstable ({:.2f}–{:.2f}), not used".format(*info["range"]) if info.get("unstable")
             else f"{info['gain']:.2f}x", "yes" if info.get("island") else "no"]
            for dtype, kinds in hw.layers.items() for kind, info in kinds.items()]))
    console.print(table("Effective numerics (read back from torch)", ["flag", "value"], [
        ["float32 matmul precision", state["float32_matmul_precision"]],
        *[[f"{k.replace('_', ' ')}", f"{v} ({state['backend_meaning'][k]})"] for k, v in state["backends"].items()],
        ["fp16 reduced-precision reduction", state["fp16_reduced_precision_reduction"]],
        ["bf16 reduced-precision reduction", state["bf16_reduced_precision_reduction"]],
        ["torch API", state["api"]],
    ]))
    console.print(table("Settings", ["setting", "value", "source"], [[r["key"], r["value"], r["source"]] for r in resolved.rows()]))
    console.print(table("Versions", ["package", "version"], [[k, v] for k, v in _versions().items()]))


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
        fail(exc)
    if as_json:
        console.print_json(json.dumps({"app": resolved.app, "files": list(resolved.files), "settings": resolved.rows(),
                                       **_not_used_json(resolved)}))
        return
    for message in resolved.warnings:
        say(err_console, ("warning:", "yellow"), " ", message)
    console.print(table("mixprec configuration", ["setting", "value", "source"], [[r["key"], r["value"], r["source"]] for r in resolved.rows()]))
    if resolved.files:
        say(console, "files read: " + ", ".join(resolved.files))
    for item in resolved.unused:
        say(console, "not used: ", str(item))


@app.command("presets")
def presets_cmd(device: DeviceFlag = None, as_json: JsonFlag = False) -> None:
    """Each preset as resolved on this machine, with the reasons for every choice."""
    from mixprec.device import hardware
    from mixprec.policy import presets

    try:
        hw = hardware.probe(device)
    except ValueError as exc:
        fail(exc)
    resolved = {name: presets.resolve(name, hw) for name in presets.PRESETS}
    if as_json:
        console.print_json(json.dumps({n: {"policy": p.to_dict(), "reasons": r} for n, (p, r) in resolved.items()}))
        return
    say(console, f"Presets for {hw.device_type} ({hw.name})")
    for name, (policy, reasons) in resolved.items():
        rows = [[f"#{i}", r.match, r.storage, r.compute, r.keep_fp32, r.upcast_attention, r.reason] for i, r in enumerate(policy.rules)]
        console.print(table(f"{name}: matmul={policy.numerics.matmul if policy.numerics else '-'}",
                            ["rule", "match", "storage", "compute", "keep_fp32", "upcast attn", "reason"], rows))
        for reason in reasons:
            say(console, "  - ", reason)
