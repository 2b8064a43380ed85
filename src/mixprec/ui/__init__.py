"""Web UI and embeddable Gradio controls for mixprec (needs the ``gradio`` package).

Importing :mod:`mixprec` never imports Gradio; only this package does.

Example:
    >>> import gradio as gr
    >>> from mixprec.ui import precision_controls
    >>> with gr.Blocks() as demo:
    ...     controls = precision_controls("ACE_STEP")
"""

from mixprec.ui.app import build_app, launch
from mixprec.ui.controls import PrecisionControls, build_policy, initialize_service, precision_controls
from mixprec.ui.i18n import LANGUAGES, direction, t

__all__ = [
    "LANGUAGES",
    "PrecisionControls",
    "build_app",
    "build_policy",
    "direction",
    "initialize_service",
    "launch",
    "precision_controls",
    "t",
]
