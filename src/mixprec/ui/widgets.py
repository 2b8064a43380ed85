"""Component groups the Run, Benchmark and Tune tabs share: pipeline pickers, device, store path, Start/Cancel.

Each helper creates its components in the enclosing Gradio layout, registers their
translated properties through ``reg`` (so the language selector relabels them) and
gives them ``elem_id`` values under the tab's ``prefix`` (``bench-size``, ``tune-path``).
"""

from __future__ import annotations

from typing import Any, Callable

import gradio as gr

from mixprec import pipelines
from mixprec.ui.endpoints import INTERNAL
from mixprec.ui.forms import SIZES, devices
from mixprec.ui.i18n import t

__all__ = ["device_picker", "pipeline_pickers", "run_id_box", "start_cancel", "store_path", "wire_cancel"]

Reg = Callable[..., Any]


def pipeline_pickers(reg: Reg, lang: str, prefix: str, *, prefer: str = "minilm") -> tuple[gr.Dropdown, gr.Radio]:
    """The pipeline dropdown (``prefer`` first when registered) and the size radio."""
    names = pipelines.available()
    first = prefer if prefer in names else names[0]
    pipe = reg(gr.Dropdown(names, value=first, label=t("run.pipeline_label", lang), info=t("run.pipeline_info", lang),
                           elem_id=f"{prefix}-pipeline"), label="run.pipeline_label", info="run.pipeline_info")
    size = reg(gr.Radio(list(SIZES), value=SIZES[0], label=t("run.size_label", lang), info=t("run.size_info", lang),
                        elem_id=f"{prefix}-size"), label="run.size_label", info="run.size_info")
    return pipe, size


def device_picker(reg: Reg, lang: str, prefix: str, *, label: str, info: str) -> gr.Dropdown:
    """The device dropdown (``cpu``, and ``cuda`` where this machine has a GPU); ``label`` and ``info`` are locale keys."""
    return reg(gr.Dropdown(devices(), value="cpu", label=t(label, lang), info=t(info, lang), elem_id=f"{prefix}-device"),
               label=label, info=info)


def store_path(reg: Reg, lang: str, prefix: str) -> gr.Textbox:
    """The benchmark-store path box (empty: the default store)."""
    return reg(gr.Textbox(value="", label=t("bench.path_label", lang), info=t("bench.path_info", lang),
                          elem_id=f"{prefix}-path"), label="bench.path_label", info="bench.path_info")


def start_cancel(reg: Reg, lang: str, prefix: str, *, start_key: str, start_id: str) -> tuple[gr.Button, gr.Button, gr.HTML]:
    """The Start and Cancel buttons in one row, and the status line (progress bar) under them.

    Cancel starts inactive: :func:`wire_cancel` makes it active only while the session's job runs.
    """
    with gr.Row():
        start = reg(gr.Button(t(start_key, lang), variant="primary", elem_id=start_id), value=start_key)
        cancel = reg(gr.Button(t("job.cancel_button", lang), variant="stop", interactive=False, elem_id=f"{prefix}-cancel"),
                     value="job.cancel_button")
    return start, cancel, gr.HTML(elem_id=f"{prefix}-status")


def run_id_box(reg: Reg, lang: str, prefix: str) -> gr.Textbox:
    """The id of the run this session started (empty while none runs): the start endpoint's last output and
    the cancel endpoint's input. Not shown on the page; the Cancel button sends it with the session's job."""
    return reg(gr.Textbox(value="", visible=False, label=t("job.run_id_label", lang), elem_id=f"{prefix}-run-id"),
               label="job.run_id_label")


def wire_cancel(start: gr.Button, handler: Callable[..., Any], cancel: gr.Button, job: gr.State, **event: Any) -> Any:
    """Wire ``start`` to run ``handler`` (``event``: its ``inputs``, ``outputs`` and options) with ``cancel``
    active only meanwhile: active when ``start`` is clicked, inactive again once the handler ends unless this
    session's job still runs (a click refused while the first job runs leaves Cancel active).

    The steps around the handler only keep the page in step: they are not in the API
    (``event`` gives the handler its endpoint name, see :mod:`mixprec.ui.endpoints`).

    Returns:
        The event of the last step.
    """
    return (start.click(lambda: gr.update(interactive=True), outputs=cancel, show_progress="hidden", **INTERNAL)
            .then(handler, **event)
            .then(lambda session: gr.update(interactive=session.running), inputs=job, outputs=cancel,
                  show_progress="hidden", **INTERNAL))
