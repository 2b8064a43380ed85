"""Web UI and embeddable Gradio controls for mixprec (needs ``pip install 'mixprec[ui]'``).

Importing :mod:`mixprec` never imports Gradio; only this package does, and it
raises an ``ImportError`` naming the install command when Gradio is missing.

Examples:
    >>> import gradio as gr
    >>> from mixprec.ui import precision_controls
    >>> with gr.Blocks() as demo:
    ...     controls = precision_controls("ACE_STEP")
"""

# The one place the optional dependency is detected.
try:
    import gradio
except ImportError as exc:
    raise ImportError(f"the mixprec web UI needs gradio, which cannot be imported ({exc}); "
                      "install it with: pip install 'mixprec[ui]'") from exc
del gradio

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
