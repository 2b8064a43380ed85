"""Precision controls to place in your own Gradio app (needs ``pip install 'mixprec[ui]'``).

:func:`precision_controls` adds the float32-matmul-precision dropdown, a preset
dropdown, per-component weight types, an attention-upcast checkbox, an
"Initialize service" button and a status line to the enclosing ``gr.Blocks``,
pre-filled from your app's environment variables and config files. Importing
:mod:`mixprec` never imports Gradio; importing this module does.

Examples:
    >>> import gradio as gr
    >>> import mixprec.gradio
    >>> with gr.Blocks() as demo:
    ...     controls = mixprec.gradio.precision_controls(app="ACE_STEP")
"""

from mixprec.ui.controls import PrecisionControls, build_policy, initialize_service, precision_controls

__all__ = ["PrecisionControls", "build_policy", "initialize_service", "precision_controls"]


from mixprec._surface import check_exports as _check_exports  # noqa: E402 - after everything it wraps

_check_exports(globals(), "mixprec.gradio")  # every public function checks its arguments at the door
