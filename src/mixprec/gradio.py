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


def _check_the_surface() -> None:
    """Every public function checks its arguments at the door (:mod:`mixprec._surface`)."""
    import inspect

    from mixprec._surface import checked

    for name in __all__:
        value = globals()[name]
        if inspect.isfunction(value) and not getattr(value, "__mixprec_checked__", False):
            globals()[name] = checked(value, f"mixprec.gradio.{name}")


_check_the_surface()

