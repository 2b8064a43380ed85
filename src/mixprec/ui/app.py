"""The mixprec web UI: run, benchmark, diagnose and tune, in four languages.

``build_app`` returns the ``gr.Blocks``; ``launch`` serves it (on 127.0.0.1 by
default). Per-session data (loaded pipelines, the running benchmark or search and
its cancel flag) lives in ``gr.State``, so two browser sessions never share or
corrupt each other's state. The Benchmark and Tune tabs live in
:mod:`mixprec.ui.bench_tab` and :mod:`mixprec.ui.tune_tab`.

Examples:
    >>> from mixprec.ui.app import launch
    >>> launch(port=7860, lang="he")  # doctest: +SKIP
"""

from __future__ import annotations

import errno
import html
import ipaddress
import json
import math
import os
import threading
import time
import warnings
from contextlib import ExitStack
from typing import Any, Callable, Sequence

import gradio as gr

import mixprec
from mixprec import pipelines
from mixprec.ui.bench_tab import build_bench_tab, list_runs, show_run, speedup_text
from mixprec.ui.controls import (DTYPES, NO_PRESET, build_policy, defaults_message, dtype_selector_update, matmul_info,
                                 precision_controls, preset_choices, preset_storage)
from mixprec.ui.endpoints import INTERNAL, endpoint
from mixprec.ui.forms import SIZES, check_choice, devices, error_text, markdown_table
from mixprec.ui.i18n import DEFAULT_LANGUAGE, LANGUAGES, check_language, direction, t
from mixprec.ui.tune_tab import build_tune_tab
from mixprec.ui.widgets import device_picker

__all__ = ["MAX_COMPONENTS", "SIZES", "PortInUseError", "build_app", "diagnose", "launch", "list_runs", "run_comparison",
           "show_run"]

#: Storage-type selectors reserved for a pipeline's components.
MAX_COMPONENTS = 8
_MIB = 1024 * 1024

#: A session's loaded pipelines: ``(name, size, device) -> pipeline``.
Cache = dict[tuple[str, str, str], Any]
#: Pipelines are built one at a time: two handlers importing a model library at once (the page's
#: load event and a quick first click) can see it half imported.
_BUILDING = threading.Lock()

_DIR_JS = """(lang) => {{
  const rtl = {rtl};
  document.documentElement.setAttribute('dir', rtl.includes(lang) ? 'rtl' : 'ltr');
  document.documentElement.setAttribute('lang', lang);
  return lang;
}}"""


#: The page's own styles. Gradio marks every block ``dir="ltr"``; in a right-to-left page the blocks
#: follow the page (labels, help texts, fields, checkbox rows), while code and audio players stay
#: left-to-right. Each paragraph, label and table cell takes its direction from its first strong
#: letter outside isolates (:func:`mixprec.ui.i18n.bidi` isolates the Latin runs of right-to-left
#: texts), so an English line left from an earlier language keeps its parentheses. Table cells keep
#: whole words: a wide table scrolls sideways instead.
CSS = """
html[dir="rtl"] .gradio-container [dir="ltr"] { direction: rtl; }
html[dir="rtl"] .gradio-container label, html[dir="rtl"] .gradio-container [data-testid="block-info"],
html[dir="rtl"] .gradio-container [data-testid="block-label"], html[dir="rtl"] .gradio-container .prose,
html[dir="rtl"] .gradio-container input, html[dir="rtl"] .gradio-container textarea { text-align: start; }
html[dir="rtl"] .gradio-container .icon-wrap { right: auto; left: var(--size-5, 20px); }
html[dir="rtl"] .gradio-container label > input + span { margin-left: 0; margin-right: var(--size-2, 8px); }
html[dir="rtl"] .gradio-container .cm-editor, html[dir="rtl"] .gradio-container .cm-editor *,
html[dir="rtl"] .gradio-container #run-fp32-audio, html[dir="rtl"] .gradio-container #run-fp32-audio *,
html[dir="rtl"] .gradio-container #run-mixed-audio, html[dir="rtl"] .gradio-container #run-mixed-audio * { direction: ltr; }
.gradio-container .prose p, .gradio-container .prose li, .gradio-container .prose blockquote,
.gradio-container .info-text, .gradio-container [data-testid="block-info"], .gradio-container label span,
.gradio-container .mixprec-status-text { unicode-bidi: plaintext; text-align: start; }
.gradio-container [data-testid="markdown"] { overflow-x: auto; }
.gradio-container .prose th, .gradio-container .prose td, #diagnose-profile th, #diagnose-profile td {
  white-space: nowrap; word-break: keep-all; unicode-bidi: plaintext; text-align: start; }
"""


def _pipeline(cache: Cache | None, name: str, size: str, device: str = "cpu") -> tuple[Any, Cache]:
    """The session's pipeline ``name``/``size`` on ``device``, built on first use (returns a new cache dict)."""
    cache = dict(cache or {})
    if (name, size, device) not in cache:
        with _BUILDING:
            cache[(name, size, device)] = pipelines.get(name, size=size, seed=0, device=device)
    return cache[(name, size, device)], cache


def _header(lang: str) -> str:
    return (f"<style>{CSS}</style>"
            f'<div id="mixprec-header" dir="{direction(lang)}" lang="{lang}">'
            f"<h2>{html.escape(t('app.title', lang))}</h2><p>{html.escape(t('app.subtitle', lang))}</p></div>")


def _db(value: float | None) -> str:
    if value is None:
        return "—"
    return "∞" if math.isinf(value) else f"{value:.1f}"


def _quality_text(q: dict[str, Any], kind: str, lang: str) -> str:
    if q.get("sqnr_db") is not None and math.isinf(q["sqnr_db"]):
        return t("run.exact", lang)
    parts = [f"SQNR {_db(q.get('sqnr_db'))}"]
    extra = {"audio": "snr_db", "image": "psnr_db"}.get(kind)
    if extra and q.get(extra) is not None:
        parts.insert(0, f"{extra.split('_')[0].upper()} {_db(q[extra])}")
    return " · ".join(parts)


def _warm_then_time(run: Callable[[], Any], device: Any = None) -> tuple[Any, float]:
    """One untimed run (first-call costs: lazy init, allocator growth, kernel selection), then one timed run
    (on a CUDA ``device``, until its kernels have run, not only been launched)."""
    import torch

    def sync() -> None:
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)

    run()
    sync()
    start = time.perf_counter()
    out = run()
    sync()
    return out, time.perf_counter() - start


def run_comparison(
    name: str,
    size: str,
    preset: str | None,
    upcast_attention: bool,
    dtype_values: Sequence[str],
    *,
    lang: str = DEFAULT_LANGUAGE,
    cache: Cache | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """Run a pipeline in fp32 and under the chosen policy on the same inputs, on ``device``.

    TTS is teacher-forced on the fp32 speech tokens so the two waveforms align.

    Args:
        name, size: the pipeline (see :func:`mixprec.pipelines.get`).
        preset, upcast_attention: see :func:`mixprec.ui.controls.build_policy`.
        dtype_values: storage types for the pipeline's components, in order.
        lang: language of the figures table.
        cache: the session's loaded pipelines.
        device: where the pipeline is built and run (one of :func:`~mixprec.ui.forms.devices`).

    Returns:
        ``kind``, ``fp32`` and ``mixed`` outputs (audio ``(rate, ndarray)`` or an
        HWC image array; ``None`` for embeddings), ``figures`` (Markdown),
        ``latency_s``, ``weight_bytes``, ``quality`` and the updated ``cache``.
    """
    from mixprec.measure.metrics import quality

    pipe, cache = _pipeline(cache, name, size, device)
    dtypes = dict(zip(pipe.components, dtype_values))
    policy = build_policy(preset=preset, upcast_attention=upcast_attention, dtypes=dtypes, hints=tuple(pipe.sensitive))
    inputs = pipe.example_inputs(batch=1, seed=0)
    ref, fp32_s = _warm_then_time(lambda: pipe.run(inputs), pipe.device)
    fp32_bytes = mixprec.weight_bytes(pipe)
    options = {"speech_tokens": ref.speech_tokens} if getattr(ref, "speech_tokens", None) is not None else {}
    if policy is None:
        out, mixed_s = _warm_then_time(lambda: pipe.run(inputs, **options), pipe.device)
        mixed_bytes = fp32_bytes
        label = t("run.policy_fp32", lang)
    else:
        with mixprec.apply(pipe, policy) as applied:
            out, mixed_s = _warm_then_time(lambda: pipe.run(inputs, **options), pipe.device)
            mixed_bytes = applied.weight_bytes()
        label = policy.name if preset not in (None, NO_PRESET) else t("run.policy_custom", lang)
    kind = pipe.output_kind
    rate = getattr(ref, "sample_rate", None)
    q = quality(out.output, ref.output, kind, sample_rate=rate)
    headers = [t(f"run.col_{c}", lang) for c in ("config", "latency", "weights", "quality")]
    rows = [[t("run.row_fp32", lang), f"{fp32_s:.3f}", f"{fp32_bytes / _MIB:.2f}", "—"],
            [label, f"{mixed_s:.3f}", f"{mixed_bytes / _MIB:.2f}", _quality_text(q, kind, lang)]]
    ratio = fp32_s / max(mixed_s, 1e-9)  # one run each: a sample, not a speed-up (it reads undecided, n=1)
    summary = t("run.speedup", lang, speedup=speedup_text(ratio, ratio, ratio, 1, lang),
                ratio=f"{100 * mixed_bytes / max(fp32_bytes, 1):.0f}") + " " + t("run.timing_note", lang)
    if kind == "audio":
        summary += "\n\n" + t("run.audio_length", lang, seconds=_audio_seconds(ref), rate=rate)
    return {"kind": kind, "fp32": _media(ref, kind), "mixed": _media(out, kind), "figures": markdown_table(headers, rows) + "\n\n" + summary,
            "latency_s": (fp32_s, mixed_s), "weight_bytes": (fp32_bytes, mixed_bytes), "quality": q, "cache": cache}


def _audio_seconds(out: Any) -> str:
    """The length of the first waveform of an audio output, in seconds (two decimals)."""
    return f"{out.output[0].shape[-1] / out.sample_rate:.2f}"


def _media(out: Any, kind: str) -> Any:
    """Audio as ``(rate, int16 ndarray of samples)``, an image as HWC float array in [0, 1], else ``None``.

    The waveform goes out as 16-bit PCM at its true level: Gradio would otherwise scale each float
    waveform to its own peak, so the two players would not compare levels.
    """
    import torch

    if kind == "audio":
        wave = out.output[0].detach().float().clamp(-1, 1).reshape(-1)
        return int(out.sample_rate), (wave * 32767).round().to(torch.int16).cpu().numpy()
    if kind == "image":
        return out.output[0].detach().float().clamp(0, 1).permute(1, 2, 0).cpu().numpy()
    return None


def diagnose(name: str, size: str, preset: str, *, lang: str = DEFAULT_LANGUAGE,
             cache: Cache | None = None) -> tuple[str, str, str, Cache]:
    """Profile a pipeline under a preset.

    Returns:
        ``(summary Markdown, HTML table with risky rows highlighted, suggested rules TOML, cache)``.
    """
    pipe, cache = _pipeline(cache, name, size)
    policy = mixprec.preset(preset, hints=tuple(pipe.sensitive))
    prof = mixprec.profile(pipe, pipe.example_inputs(batch=1, seed=0), policy)
    risky = {s["match"] for s in prof.suggestions()}
    rows = prof.rows()
    cols = ("module", "type", "compute", "fp16_headroom", "overflows_fp16", "own_sqnr_db", "inherited_sqnr_db")
    head = "".join(f"<th>{html.escape(t(f'diag.col_{c}', lang))}</th>" for c in
                   ("module", "type", "compute", "headroom", "overflow", "own", "inherited"))
    body = []
    for row in rows:
        cells = []
        for c in cols:
            v = row.get(c)
            if isinstance(v, bool):
                v = t("diag.yes" if v else "diag.no", lang)
            elif isinstance(v, float):
                v = f"{v:.3g}"
            cells.append(f"<td>{html.escape(str(v))}</td>")
        style = ' class="risky" style="background:#fde2e1;color:#7a1410;font-weight:600"' if row["module"] in risky else ""
        body.append(f"<tr{style}>{''.join(cells)}</tr>")
    table = (f'<div style="max-height:520px;overflow:auto"><table id="diagnose-profile"><thead><tr>{head}</tr></thead>'
             f"<tbody>{''.join(body)}</tbody></table></div>")
    return t("diag.summary", lang, risky=len(risky), total=len(rows)), table, prof.suggestions_toml(), cache


def build_app(lang: str = DEFAULT_LANGUAGE, *, app: str | None = None) -> gr.Blocks:
    """Build the UI.

    Args:
        lang: initial language (a code of :data:`mixprec.ui.i18n.LANGUAGES`).
        app: env-var prefix whose settings pre-fill the precision controls.
    """
    check_language(lang)
    names = pipelines.available()
    first = "tts" if "tts" in names else names[0]
    # (component, {property: locale key or function of the language}) for relabelling.
    texts: list[tuple[Any, dict[str, str | Callable[[str], Any]]]] = []

    def reg(component: Any, **spec: str | Callable[[str], Any]) -> Any:
        texts.append((component, spec))
        return component

    # A local tool does not phone home: Gradio's usage analytics stay off unless the user
    # turned them on (GRADIO_ANALYTICS_ENABLED=True).
    analytics = os.environ.get("GRADIO_ANALYTICS_ENABLED", "").strip().lower() in ("1", "true", "yes")
    with gr.Blocks(title=t("app.title", lang), analytics_enabled=analytics) as demo:
        cache = gr.State({})
        with gr.Row():
            header = gr.HTML(_header(lang), elem_id="header-box")
            language = reg(gr.Dropdown([(v, k) for k, v in LANGUAGES.items()], value=lang, scale=0, min_width=180,
                                       label=t("app.language_label", lang), info=t("app.language_info", lang),
                                       elem_id="language"), label="app.language_label", info="app.language_info")
        with gr.Tabs():
            with reg(gr.Tab(t("tab.run", lang), id="run", elem_id="tab-run"), label="tab.run"):
                with gr.Row():
                    run_pipe = reg(gr.Dropdown(names, value=first, label=t("run.pipeline_label", lang),
                                               info=t("run.pipeline_info", lang), elem_id="run-pipeline"),
                                   label="run.pipeline_label", info="run.pipeline_info")
                    run_size = reg(gr.Radio(list(SIZES), value=SIZES[0], label=t("run.size_label", lang),
                                            info=t("run.size_info", lang), elem_id="run-size"),
                                   label="run.size_label", info="run.size_info")
                    run_device = device_picker(reg, lang, "run", label="run.device_label", info="run.device_info")
                controls = precision_controls(app, lang=lang, language=language)
                reg(controls.matmul, label="controls.matmul_label")  # its info follows the preset too (below)
                reg(controls.preset, label="controls.preset_label", info="controls.preset_info", choices=preset_choices)
                reg(controls.upcast_attention, label="controls.upcast_label", info="controls.upcast_info")
                reg(controls.button, value="controls.init_button")
                reg(controls.heading, value="controls.heading")
                with gr.Row():
                    slots = [gr.Dropdown(list(DTYPES), value="fp32", visible=False, info=t("controls.dtype_info", lang),
                                         elem_id=f"dtype-{i}") for i in range(MAX_COMPONENTS)]
                run_button = reg(gr.Button(t("run.button", lang), variant="primary", elem_id="run-button"), value="run.button")
                with gr.Row():
                    fp32_audio = reg(gr.Audio(label=t("run.fp32_output", lang), visible=False, elem_id="run-fp32-audio"),
                                     label="run.fp32_output")
                    mixed_audio = reg(gr.Audio(label=t("run.mixed_output", lang), visible=False, elem_id="run-mixed-audio"),
                                      label="run.mixed_output")
                    fp32_image = reg(gr.Image(label=t("run.fp32_output", lang), visible=False, elem_id="run-fp32-image"),
                                     label="run.fp32_output")
                    mixed_image = reg(gr.Image(label=t("run.mixed_output", lang), visible=False, elem_id="run-mixed-image"),
                                      label="run.mixed_output")
                figures = gr.Markdown(t("run.figures_empty", lang), elem_id="run-figures")
            with reg(gr.Tab(t("tab.benchmark", lang), id="benchmark", elem_id="tab-benchmark"), label="tab.benchmark"):
                build_bench_tab(lang, reg, language)
            with reg(gr.Tab(t("tab.diagnose", lang), id="diagnose", elem_id="tab-diagnose"), label="tab.diagnose"):
                with gr.Row():
                    diag_pipe = reg(gr.Dropdown(names, value=first, label=t("run.pipeline_label", lang),
                                                info=t("run.pipeline_info", lang), elem_id="diag-pipeline"),
                                    label="run.pipeline_label", info="run.pipeline_info")
                    diag_size = reg(gr.Radio(list(SIZES), value=SIZES[0], label=t("run.size_label", lang),
                                             info=t("run.size_info", lang), elem_id="diag-size"),
                                    label="run.size_label", info="run.size_info")
                    diag_preset = reg(gr.Dropdown(list(mixprec.PRESETS), value="fast", label=t("diag.preset_label", lang),
                                                  info=t("diag.preset_info", lang), elem_id="diag-preset"),
                                      label="diag.preset_label", info="diag.preset_info")
                diag_button = reg(gr.Button(t("diag.button", lang), variant="primary", elem_id="diag-button"), value="diag.button")
                diag_summary = gr.Markdown(elem_id="diag-summary")
                diag_table = gr.HTML(elem_id="diagnose-table")
                diag_toml = reg(gr.Code(language=None, lines=12, max_lines=40, wrap_lines=True, label=t("diag.suggest_label", lang), elem_id="diag-toml"),
                                label="diag.suggest_label")
            with reg(gr.Tab(t("tab.tune", lang), id="tune", elem_id="tab-tune"), label="tab.tune"):
                build_tune_tab(lang, reg, language)

        def slot_updates(name: str, size: str, lg: str, state: Cache, preset: str = NO_PRESET,
                         device: str = "cpu") -> tuple[list[Any], Cache]:
            given: dict[str, tuple[str, tuple[str, ...]]] = {}
            try:
                pipe, state = _pipeline(state, name, size, device if device in devices() else "cpu")
                comps = list(pipe.components)[:MAX_COMPONENTS]
                if preset and preset != NO_PRESET:
                    given = preset_storage(preset, pipe.components, tuple(pipe.sensitive))
            except (ValueError, RuntimeError, OSError, ImportError):
                comps = []
            # A preset decides the weight types: the selectors are locked, show what the preset gives
            # each component and say so; with "none" they start at fp32.
            ups = [{"value": "fp32", **dtype_selector_update(preset, lg, given.get(comps[i]) if i < len(comps) else None),
                    "visible": i < len(comps),
                    "label": t("controls.dtype_label", lg, component=comps[i]) if i < len(comps) else None}
                   for i in range(MAX_COMPONENTS)]
            return ups, state

        def on_pipeline(name: str, size: str, lg: str, state: Cache, preset: str = NO_PRESET, device: str = "cpu") -> list[Any]:
            ups, state = slot_updates(name, size, lg, state, preset, device)
            return [*ups, state]

        def on_language(lg: str, name: str, size: str, state: Cache, status: str, shown: str, preset: str, device: str,
                        *slot_values: str) -> list[Any]:
            # The status keeps what was applied; only the untouched defaults line is translated.
            untouched = status in {defaults_message(app, code) for code in LANGUAGES}
            empty = shown in {t("run.figures_empty", code) for code in LANGUAGES}
            out = [_header(lg), defaults_message(app, lg) if untouched else gr.update(),
                   t("run.figures_empty", lg) if empty else gr.update()]
            for _component, spec in texts:
                out.append(gr.update(**{prop: (key(lg) if callable(key) else t(key, lg)) for prop, key in spec.items()}))
            ups, state = slot_updates(name, size, lg, state, preset, device)
            if not preset or preset == NO_PRESET:
                for up, value in zip(ups, slot_values):
                    up["value"] = value  # the user's own choices stay
            return [*out, *ups, state]

        def run_comparison_endpoint(lang: str, pipeline: str, size: str, device: str, preset: str,
                                    upcast_attention: bool, state: Cache, **dtypes: str) -> list[Any]:
            """Run a pipeline in fp32 and under the chosen precision (``dtype_0``...: each component's storage
            type, in order); the two outputs, and the figures: latency, weight memory, quality against fp32."""
            values = [dtypes[f"dtype_{i}"] for i in range(MAX_COMPONENTS) if f"dtype_{i}" in dtypes]
            problem = check_choice(device, devices(), "run.device_label", lang)
            if problem:
                return [gr.update(visible=False)] * 4 + [problem, state]
            try:
                result = run_comparison(pipeline, size, preset, upcast_attention, values, lang=lang, cache=state, device=device)
            except (ValueError, RuntimeError, OSError, ImportError) as exc:
                hidden = gr.update(visible=False)
                return [hidden] * 4 + [error_text("run.error", lang, exc), state]
            audio, image = result["kind"] == "audio", result["kind"] == "image"

            def player(which: str, key: str) -> Any:
                if not audio:
                    return gr.update(value=None, visible=False)
                rate, wave = result[which]
                # The player's clock shows whole seconds: the label gives the exact length.
                return gr.update(value=result[which], visible=True,
                                 label=t("run.audio_label", lang, output=t(key, lang), seconds=f"{wave.shape[0] / rate:.2f}",
                                         rate=rate))

            return [player("fp32", "run.fp32_output"), player("mixed", "run.mixed_output"),
                    gr.update(value=result["fp32"] if image else None, visible=image),
                    gr.update(value=result["mixed"] if image else None, visible=image),
                    result["figures"], result["cache"]]

        def diagnose_endpoint(lang: str, pipeline: str, size: str, preset: str, state: Cache) -> list[Any]:
            """Profile a pipeline under a preset: a summary, the per-module table, the suggested rules as TOML."""
            try:
                return list(diagnose(pipeline, size, preset, lang=lang, cache=state))
            except (ValueError, RuntimeError, OSError, ImportError) as exc:
                return [error_text("diag.error", lang, exc), "", "", state]

        dir_js = _DIR_JS.format(rtl=json.dumps([code for code in LANGUAGES if direction(code) == "rtl"]))
        language.change(None, inputs=language, js=dir_js, **INTERNAL)
        demo.load(None, inputs=language, js=dir_js, **INTERNAL)
        language.change(on_language, inputs=[language, run_pipe, run_size, cache, controls.status, figures, controls.preset,
                                             run_device, *slots],
                        outputs=[header, controls.status, figures, *(c for c, _ in texts), *slots, cache], **INTERNAL)
        for trigger in (run_pipe.change, run_size.change, run_device.change, controls.preset.change, demo.load):
            trigger(on_pipeline, inputs=[run_pipe, run_size, language, cache, controls.preset, run_device],
                    outputs=[*slots, cache], **INTERNAL)
        language.change(lambda lg, chosen: gr.update(info=matmul_info(app, lg, preset=chosen)),
                        inputs=[language, controls.preset], outputs=controls.matmul, **INTERNAL)
        run_button.click(run_comparison_endpoint,
                         inputs=[language, run_pipe, run_size, run_device, controls.preset, controls.upcast_attention, cache],
                         inputs_kwargs={f"dtype_{i}": slot for i, slot in enumerate(slots)},
                         outputs=[fp32_audio, mixed_audio, fp32_image, mixed_image, figures, cache],
                         **endpoint("run_comparison"))
        diag_button.click(diagnose_endpoint, inputs=[language, diag_pipe, diag_size, diag_preset, cache],
                          outputs=[diag_summary, diag_table, diag_toml, cache], **endpoint("diagnose"))
    return demo


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class PortInUseError(OSError):
    """The UI's port cannot be listened on: another program holds it."""


def launch(host: str = "127.0.0.1", port: int = 7860, lang: str = DEFAULT_LANGUAGE, *,
           store_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> Any:
    """Serve the UI (blocks until stopped unless ``prevent_thread_lock=True`` is passed).

    While it serves, the store boxes open files only inside one folder (see
    :mod:`mixprec.ui.stores`): ``store_dir``, or the user data folder of the default store.
    With ``prevent_thread_lock=True`` that limit stays on for the rest of the process.

    Args:
        host: interface to bind; a non-loopback address exposes the UI to the network (warned).
        port: TCP port.
        lang: initial language.
        store_dir: the folder benchmark stores may be created in (default: the user data folder).
        **kwargs: passed on to ``gr.Blocks.launch``.

    Raises:
        PortInUseError: ``port`` is taken on ``host``.
    """
    from mixprec.bench.store import default_db_path
    from mixprec.ui.stores import stores_confined_to

    if not _is_loopback(host):
        warnings.warn(f"mixprec UI bound to {host}: anyone who can reach this address can run models "
                      "and change this process's precision settings", stacklevel=2)
    confinement = ExitStack()
    confinement.enter_context(stores_confined_to(store_dir if store_dir is not None else default_db_path().parent))
    try:
        demo = build_app(lang)
        try:
            result = demo.launch(server_name=host, server_port=port, **kwargs)
        except OSError as exc:
            # Gradio's own text names its server_port argument and an environment variable.
            if "port" in str(exc).lower() or exc.errno == errno.EADDRINUSE:
                raise PortInUseError(errno.EADDRINUSE, f"port {port} on {host} is in use by another program") from None
            raise
    except BaseException:
        confinement.close()
        raise
    if not kwargs.get("prevent_thread_lock"):
        confinement.close()  # the server has stopped
    return result
