"""Embeddable Gradio precision controls.

Call :func:`precision_controls` inside your own ``gr.Blocks()``: it adds the
float32-matmul-precision dropdown, a preset dropdown, per-component weight-type
selectors, an attention-upcast checkbox, an "Initialize service" button and a
status line, pre-filled from :func:`mixprec.resolve` (so environment variables
and config files show up as defaults, with their source).

Examples:
    >>> import gradio as gr
    >>> with gr.Blocks() as demo:
    ...     controls = precision_controls("ACE_STEP", lang="ja")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

import gradio as gr

import mixprec
from mixprec._quote import clip, quote
from mixprec._words import normalise
from mixprec.policy import PolicyError
from mixprec.ui.endpoints import INTERNAL, endpoint
from mixprec.ui.i18n import bidi, check_language, t

__all__ = [
    "DTYPES",
    "NO_PRESET",
    "PrecisionControls",
    "build_policy",
    "default_matmul",
    "defaults_message",
    "initialize_service",
    "matmul_info",
    "matmul_update",
    "preset_matmul",
    "preset_storage",
    "preset_choices",
    "precision_controls",
    "policy_line",
    "dtype_selector_update",
    "not_used_lines",
]

#: Weight storage types a component can be given.
DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8")
#: The preset dropdown value meaning "use the per-component types".
NO_PRESET = "none"


def default_matmul(app: str | None) -> tuple[str, str, str | None]:
    """The float32 matmul precision that config files and the environment give.

    Returns:
        ``(value, source, error)``: the value and where it came from, or the
        built-in default with the configuration error message when any source is invalid.
    """
    try:
        resolved = mixprec.resolve(app)
    except mixprec.ConfigError as exc:
        return mixprec.MATMUL_LEVELS[0], "default", str(exc)
    return resolved.numeric.matmul, str(resolved.source_of("float32_matmul_precision")), None


def preset_matmul(preset: str | None) -> str | None:
    """The float32 matmul precision ``preset`` sets on this machine, or ``None`` for :data:`NO_PRESET`."""
    if not preset or preset == NO_PRESET:
        return None
    return mixprec.preset(preset).numerics.matmul


def matmul_info(app: str | None, lang: str, *, preset: str | None = None) -> str:
    """The matmul dropdown's info text: what ``preset`` sets (and that another value overrides it),
    else the source of its default."""
    chosen = preset_matmul(preset)
    if chosen is not None:
        return t("controls.matmul_info_preset", lang, preset=preset, value=chosen)
    source = default_matmul(app)[1]
    if source == "default":
        return t("controls.matmul_info_builtin", lang)
    return t("controls.matmul_info", lang, source=source)


def matmul_update(app: str | None, preset: str | None, lang: str) -> dict[str, Any]:
    """The matmul dropdown when the preset changes: the preset's level (its info says another value
    overrides it), or with "none" the default of the configuration sources again."""
    chosen = preset_matmul(preset)
    value = chosen if chosen is not None else default_matmul(app)[0]
    return gr.update(value=value, info=matmul_info(app, lang, preset=preset))


def preset_storage(preset: str, components: Mapping[str, Any], hints: Sequence[str] = ()) -> dict[str, tuple[str, tuple[str, ...]]]:
    """What ``preset`` stores each component's weights in on this machine.

    Args:
        preset: a name of :data:`mixprec.PRESETS`.
        components: the pipeline's components (name -> module).
        hints: the pipeline's precision-sensitive module hints.

    Returns:
        component -> ``(type of most of its weights, modules whose weights are kept in another type)``.
    """
    from mixprec.policy.select import resolve_modules

    plans, _ = resolve_modules(dict(components), mixprec.preset(preset, hints=tuple(hints)))
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for name in components:
        own = [(plan, sum(p.numel() for p in plan.module.parameters(recurse=False))) for plan in plans
               if plan.qualname == name or plan.qualname.startswith(f"{name}.")]
        weighed: dict[str, int] = {}
        for plan, count in own:
            weighed[plan.storage] = weighed.get(plan.storage, 0) + count
        main = max(weighed, key=lambda k: weighed[k]) if any(weighed.values()) else "fp32"
        out[name] = main, tuple(plan.qualname for plan, count in own if count and plan.storage != main)
    return out


def defaults_message(app: str | None, lang: str) -> str:
    """The status text shown before anything was applied, and what the configuration sources
    held that looks like a setting and is not read (:func:`not_used_lines`)."""
    value, source, error = default_matmul(app)
    if error is not None:
        return t("controls.error_resolve", lang, message=error)
    try:
        notes = not_used_lines(mixprec.resolve(app), lang)
    except mixprec.ConfigError:  # default_matmul resolved the same sources without an error
        notes = []
    return "\n".join([t("controls.status_defaults", lang, value=value, source=source), *([""] + notes if notes else [])])


def not_used_lines(resolved: Any, lang: str) -> list[str]:
    """Markdown list lines of what the sources held that was not used and is most likely a mistake
    (a near miss of a setting's name, another app's prefix, a value read without its invisible
    characters: :class:`mixprec.config.sources.Unused`), in the words of ``mixprec config show``.
    English, as the log lines are: in a right-to-left language each line is isolated."""
    items = [f"not used: {item}" for item in resolved.unused if item.warns] + list(resolved.warnings)
    return [f"- {bidi(clip(line, limit=400), lang)}" for line in items]


def preset_choices(lang: str) -> list[tuple[str, str]]:
    """``(label, value)`` choices of the preset dropdown: "none" then every preset."""
    return [(t("controls.preset_none", lang), NO_PRESET)] + [(name, name) for name in mixprec.PRESETS]


def build_policy(
    *,
    preset: str | None = NO_PRESET,
    upcast_attention: bool = False,
    dtypes: Mapping[str, str] | None = None,
    hints: Sequence[str] = (),
) -> mixprec.Policy | None:
    """The policy the controls describe, or ``None`` when everything stays fp32.

    A preset wins over the per-component types; the attention upcast is added on top.

    Args:
        preset: a name of :data:`mixprec.PRESETS`, or :data:`NO_PRESET`.
        upcast_attention: compute attention in fp32 in every component.
        dtypes: component name -> storage type (one of :data:`DTYPES`).
        hints: the pipeline's precision-sensitive module hints, for the preset.

    Raises:
        ValueError: for an unknown preset or storage type (``PolicyError`` is one).
    """
    # typed or pasted values are read as every source's words are (case, invisible characters, NFKC)
    dtypes = {name: normalise(dtype) if isinstance(dtype, str) else dtype for name, dtype in (dtypes or {}).items()}
    preset = normalise(preset) if isinstance(preset, str) and preset else NO_PRESET
    if preset != NO_PRESET and preset not in mixprec.PRESETS:
        raise ValueError(f"unknown preset {quote(preset)}; valid: {', '.join((NO_PRESET, *mixprec.PRESETS))}")
    for name, dtype in dtypes.items():
        if dtype not in DTYPES:
            raise PolicyError(f"component {quote(name)}: storage {quote(dtype)} is not one of {', '.join(DTYPES)}")
    if preset != NO_PRESET:
        base = mixprec.preset(preset, hints=tuple(hints))
        rules = base.rules
    else:
        base = None
        rules = tuple(mixprec.Rule(name, storage=dtype) for name, dtype in dtypes.items() if dtype != "fp32")
    if upcast_attention:
        rules = rules + tuple(mixprec.Rule(name, upcast_attention=True, optional=True) for name in dtypes or ("*",))
    if not rules:
        return None
    if base is not None:
        return mixprec.Policy(rules=rules, numerics=base.numerics, name=base.name)
    return mixprec.Policy(rules=rules)


def initialize_service(
    app: str | None,
    *,
    matmul: str,
    preset: str | None = NO_PRESET,
    upcast_attention: bool = False,
    dtypes: Mapping[str, str] | None = None,
    lang: str = "en",
    on_initialize: Callable[[mixprec.Policy | None], Any] | None = None,
) -> str:
    """Validate the choices, apply them with :func:`mixprec.init`, then hand the policy to the app.

    Everything is validated before anything is applied: on an invalid value the
    returned message explains it and torch's flags stay as they were. When
    ``on_initialize`` raises, the numeric settings are restored too, so a failed
    initialization changes nothing.

    Args:
        app: the application's env-var prefix, passed to :func:`mixprec.init`.
        matmul: float32 matmul precision (one of :data:`mixprec.MATMUL_LEVELS`).
        preset, upcast_attention, dtypes: the model policy (see :func:`build_policy`).
        lang: language of the returned message.
        on_initialize: the app's model loading: called with the chosen policy
            (``None``: everything fp32) after the numeric settings are applied; a
            returned string is shown under the status.

    Returns:
        Markdown: what was applied and from where, or the inline error.
    """
    check_language(lang)
    preset = normalise(preset) if isinstance(preset, str) and preset else NO_PRESET
    try:
        policy = build_policy(preset=preset, upcast_attention=upcast_attention, dtypes=dtypes)
    except ValueError as exc:
        return t("controls.error_config", lang, message=str(exc))
    typed = matmul
    matmul = normalise(matmul) if isinstance(matmul, str) else matmul  # a typed value, read as every source's words
    if matmul not in mixprec.MATMUL_LEVELS:
        return t("controls.error_choice", lang, value=clip(typed, escape=True), field=t("controls.matmul_label", lang),
                 choices=", ".join(mixprec.MATMUL_LEVELS))
    try:
        resolved = mixprec.init(app, matmul=matmul)
    except mixprec.ConfigError as exc:
        return t("controls.error_config", lang, message=str(exc))
    loaded = None
    if on_initialize is not None:
        try:
            loaded = on_initialize(policy)
        except Exception as exc:  # the app's own loading failed: undo the settings, show why
            mixprec.restore(resolved.previous)
            return t("controls.error_config", lang, message=f"{type(exc).__name__}: {exc}")
    state = mixprec.describe()
    backends = ", ".join(f"`{name}`: {value}" for name, value in state["backends"].items())
    lines = [t("controls.status_applied", lang), ""]
    # The log lines are English: in a right-to-left language each is isolated (bidi).
    # The model policy is the one these controls chose, not the preset/policy settings of the
    # config sources ("precision preset = not set" while a preset was applied).
    lines += [f"- {bidi(line, lang)}" for key, line in zip(resolved.settings, resolved.log_lines())
              if key not in ("preset", "policy")]
    lines += [f"- {policy_line(preset, upcast_attention, dtypes, lang)}"]
    lines += not_used_lines(resolved, lang)
    from_preset = preset_matmul(preset)
    if from_preset is not None and from_preset != matmul:
        lines += [f"- {t('controls.status_matmul_override', lang, value=matmul, preset=preset, preset_value=from_preset)}"]
    lines += ["", t("controls.status_backends", lang, backends=bidi(backends, lang))]
    if isinstance(loaded, str) and loaded:
        lines += ["", loaded]
    return "\n".join(lines)


def policy_line(preset: str | None, upcast_attention: bool, dtypes: Mapping[str, str] | None, lang: str) -> str:
    """What the controls apply to the model, for the status: the preset, or each component's type."""
    upcast = t("controls.status_upcast", lang) if upcast_attention else ""
    if preset and preset != NO_PRESET:
        return t("controls.status_policy_preset", lang, preset=preset, upcast=upcast)
    types = ", ".join(f"{name} {dtype}" for name, dtype in (dtypes or {}).items()) or "fp32"
    return t("controls.status_policy_types", lang, types=types, upcast=upcast)


def dtype_selector_update(preset: str | None, lang: str, storage: tuple[str, tuple[str, ...]] | None = None) -> dict[str, Any]:
    """A per-component type selector under ``preset``: a preset decides the types, so the selector is
    locked, shows the type the preset gives the component (``storage``, an entry of
    :func:`preset_storage`) and says so; with "none" it is the user's choice again."""
    if preset and preset != NO_PRESET:
        kept = ""
        extra: dict[str, Any] = {}
        if storage is not None:
            main, others = storage
            extra["value"] = main
            if others:
                names = ", ".join(others[:3]) + (", …" if len(others) > 3 else "")
                kept = t("controls.dtype_kept", lang, count=len(others), names=names)
        return gr.update(interactive=False, info=t("controls.dtype_info_preset", lang, preset=preset, kept=kept,
                                                   none=t("controls.preset_none", lang)), **extra)
    return gr.update(interactive=True, info=t("controls.dtype_info", lang))


class HasComponents(Protocol):
    """A pipeline, as the controls read one: anything with ``components`` (its named modules)."""

    components: Mapping[str, Any]


@dataclass
class PrecisionControls:
    """The components :func:`precision_controls` created, and their handler.

    Attributes:
        app: env-var prefix the defaults and :func:`mixprec.init` use.
        lang: language of labels and messages.
        matmul: float32 matmul precision dropdown (accepts typed values).
        preset: preset dropdown (``"none"`` or a preset name).
        upcast_attention: attention-upcast checkbox.
        dtypes: component name -> storage-type dropdown (empty without a pipeline).
        button: the "Initialize service" button.
        status: Markdown showing defaults, what was applied, or an inline error.
    """

    app: str | None
    lang: str
    matmul: gr.Dropdown
    preset: gr.Dropdown
    upcast_attention: gr.Checkbox
    button: gr.Button
    status: gr.Markdown
    heading: gr.Markdown | None = None
    dtypes: dict[str, gr.Dropdown] = field(default_factory=dict)
    on_initialize: Callable[[mixprec.Policy | None], Any] | None = None

    @property
    def inputs(self) -> list[gr.components.Component]:
        """The handler's inputs in order: matmul, preset, upcast, then each dtype selector."""
        return [self.matmul, self.preset, self.upcast_attention, *self.dtypes.values()]

    def initialize(self, matmul: str, preset: str | None = NO_PRESET, upcast_attention: bool = False,
                   *dtypes: str) -> str:
        """Apply the chosen values (see :func:`initialize_service`); returns the status Markdown."""
        return initialize_service(self.app, matmul=matmul, preset=preset, upcast_attention=upcast_attention,
                                  dtypes=dict(zip(self.dtypes, dtypes)), lang=self.lang, on_initialize=self.on_initialize)

    def initialize_in(self, lang: str, matmul: str, preset: str | None = NO_PRESET, upcast_attention: bool = False,
                      *dtypes: str) -> str:
        """Like :meth:`initialize`, with the message language given first."""
        return initialize_service(self.app, matmul=matmul, preset=preset, upcast_attention=upcast_attention,
                                  dtypes=dict(zip(self.dtypes, dtypes)), lang=lang, on_initialize=self.on_initialize)


def precision_controls(
    app: str | None = None, *, pipeline: HasComponents | None = None, lang: str = "en", language: gr.components.Component | None = None,
    on_initialize: Callable[[mixprec.Policy | None], Any] | None = None,
) -> PrecisionControls:
    """Create the precision controls in the enclosing ``gr.Blocks`` and wire the button.

    Args:
        app: the application's env-var prefix (``"ACE_STEP"`` reads
            ``ACE_STEP_FLOAT32_MATMUL_PRECISION``); defaults come from :func:`mixprec.resolve`.
        pipeline: a pipeline (anything with ``components``): adds one storage-type
            selector per component.
        lang: a code of :data:`mixprec.ui.i18n.LANGUAGES`.
        language: a component holding the language code; when given, the
            handler writes its messages in that component's current language.
        on_initialize: called by "Initialize service" with the chosen policy once
            the numeric settings are applied: load and :func:`mixprec.apply` your
            models there. If it raises, the settings are restored and the error shown.

    Returns:
        The created components; ``initialize`` is wired to the button.
    """
    check_language(lang)
    value, _source, _error = default_matmul(app)
    heading = gr.Markdown(t("controls.heading", lang))
    with gr.Row():
        matmul = gr.Dropdown(list(mixprec.MATMUL_LEVELS), value=value, allow_custom_value=True,
                             label=t("controls.matmul_label", lang), info=matmul_info(app, lang),
                             elem_id="matmul-precision")
        preset = gr.Dropdown(preset_choices(lang), value=NO_PRESET, label=t("controls.preset_label", lang),
                             info=t("controls.preset_info", lang), elem_id="preset")
    dtypes: dict[str, gr.Dropdown] = {}
    if pipeline is not None:
        with gr.Row():
            for name in pipeline.components:
                dtypes[name] = gr.Dropdown(list(DTYPES), value="fp32", label=t("controls.dtype_label", lang, component=name),
                                           info=t("controls.dtype_info", lang), elem_id=f"dtype-{name}")
    upcast = gr.Checkbox(value=False, label=t("controls.upcast_label", lang), info=t("controls.upcast_info", lang),
                         elem_id="upcast-attention")
    button = gr.Button(t("controls.init_button", lang), variant="primary", elem_id="initialize")
    status = gr.Markdown(defaults_message(app, lang), elem_id="init-status")
    controls = PrecisionControls(app=app, lang=lang, matmul=matmul, preset=preset, upcast_attention=upcast,
                                 button=button, status=status, heading=heading, dtypes=dtypes, on_initialize=on_initialize)
    # The button is the endpoint scripts call; the events that follow the preset only keep the page in step.
    if language is None:
        button.click(controls.initialize, inputs=controls.inputs, outputs=status, **endpoint("initialize_service"))
    else:
        button.click(controls.initialize_in, inputs=[language, *controls.inputs], outputs=status,
                     **endpoint("initialize_service"))
    def follow(chosen: str, lg: str = lang) -> dict[str, Any]:
        return matmul_update(app, chosen, lg)

    preset.change(follow, inputs=[preset] if language is None else [preset, language], outputs=matmul, **INTERNAL)
    if dtypes:
        def lock(chosen: str, lg: str = lang) -> list[dict[str, Any]]:
            if not chosen or chosen == NO_PRESET:
                return [{**dtype_selector_update(chosen, lg), "value": "fp32"} for _ in dtypes]
            given = preset_storage(chosen, pipeline.components, tuple(getattr(pipeline, "sensitive", ())))
            return [dtype_selector_update(chosen, lg, given[name]) for name in dtypes]

        preset.change(lock, inputs=[preset] if language is None else [preset, language], outputs=list(dtypes.values()),
                      **INTERNAL)
    return controls
