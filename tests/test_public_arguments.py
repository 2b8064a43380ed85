"""Every public function and class of mixprec (and of mixprec.gradio) refuses an argument of the wrong kind
at the door, in mixprec's words: a TypeError naming the callable, the parameter, what was given and what is
accepted, and nothing of Python's internals (AttributeError, KeyError, IndexError).

The callables (everything callable in ``__all__``) and their parameters are read from the signatures: a
public function or class added later is covered without this file changing. For each parameter,
Hypothesis draws values of other kinds than its annotation allows (``None`` included where an object is
needed); the other required parameters get a value of their kind, made from their annotation.
"""

from __future__ import annotations

import collections.abc
import inspect
import os
import pathlib
import pickle
import sys
import types
import typing
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixprec
import mixprec.gradio
from mixprec._surface import accepts, describe, parameters

CALLABLES = [(f"{module.__name__}.{name}", getattr(module, name))
             for module in (mixprec, mixprec.gradio) for name in module.__all__ if callable(getattr(module, name))]

#: Values of many kinds; for each parameter, those its annotation does not accept are the wrong ones.
ANY_KIND = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=4),
                     st.binary(max_size=3), st.lists(st.integers(0, 2), max_size=2),
                     st.dictionaries(st.text(max_size=2), st.integers(0, 2), max_size=2), st.just(object()),
                     st.just(torch.zeros(1)), st.just(b"x"), st.just(1j))


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4))


def _of_kind(name: str, annotation):
    """A value the door accepts for a parameter, made from its annotation. The call it goes into is refused
    at another parameter before its body runs, so an instance of a class need not be initialised."""
    if annotation is typing.Any:
        return _model() if name == "target" else None  # a target is checked as apply reads one
    if accepts(None, annotation):
        return None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return _of_kind(name, args[0])
    if origin is typing.Literal:
        return args[0]
    if annotation is collections.abc.Callable or origin is collections.abc.Callable:
        return lambda *a, **k: None
    if origin is not None:
        return {tuple: (), list: [], dict: {}, set: set(), frozenset: frozenset(), collections.abc.Sequence: (),
                collections.abc.Mapping: {}, collections.abc.Set: frozenset()}.get(origin) or origin()
    scalar = {bool: True, int: 1, float: 1.0, str: "x", os.PathLike: pathlib.Path("x")}
    if annotation in scalar:
        return scalar[annotation]
    if getattr(annotation, "_is_protocol", False):
        return mock.NonCallableMock()  # has every member
    return annotation.__new__(annotation)  # an instance of the class, never initialised


def _cases():
    for qualname, fn in CALLABLES:
        for param, annotation in parameters(fn):
            if annotation is typing.Any and param.name != "target":
                continue  # anything goes (what the model takes): nothing is of the wrong kind
            yield pytest.param(qualname, fn, param.name, annotation, id=f"{qualname}:{param.name}")


def test_every_public_callable_is_checked():
    functions = [name for name, fn in CALLABLES if inspect.isfunction(fn)]
    classes = [name for name, fn in CALLABLES if isinstance(fn, type)]
    assert len(functions) >= 18 and len(classes) >= 20 and len(functions) + len(classes) == len(CALLABLES)
    unchecked = [name for name, fn in CALLABLES
                 if not getattr(fn.__init__ if isinstance(fn, type) else fn, "__mixprec_checked__", False)
                 and parameters(fn)]  # a class whose constructor is built in takes a message: anything
    assert unchecked == []


@pytest.mark.parametrize("qualname, fn", CALLABLES, ids=[name for name, _ in CALLABLES])
def test_a_checked_callable_keeps_its_signature_and_docstring_and_pickles_by_its_public_name(qualname, fn):
    assert pickle.loads(pickle.dumps(fn)) is fn
    if inspect.isfunction(fn):
        original = inspect.unwrap(fn)
        assert inspect.signature(fn) == inspect.signature(original) and fn.__doc__ == original.__doc__
        assert f"{fn.__module__}.{fn.__qualname__}" == qualname


@pytest.mark.parametrize("qualname, fn, name, annotation", list(_cases()))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=ANY_KIND)
def test_a_value_of_the_wrong_kind_is_refused_in_mixprecs_words(qualname, fn, name, annotation, value):
    if name == "target" and annotation is typing.Any:  # a model, a mapping of named modules (empty included) or a pipeline
        wrong = not (isinstance(value, torch.nn.Module) or (
            isinstance(value, dict) and all(isinstance(v, torch.nn.Module) for v in value.values())))
    else:
        wrong = not accepts(value, annotation)
    if not wrong or (isinstance(value, str) and "Policy" in describe(annotation)):
        return  # of an accepted kind (a preset's name where a Policy is): not this test's concern
    params = parameters(fn)
    kwargs = {p.name: _of_kind(p.name, ann) for p, ann in params if p.name != name and p.default is p.empty}
    kwargs[name] = value
    args = [kwargs.pop(p.name) for p, _ in params if p.kind is p.POSITIONAL_ONLY and p.name in kwargs]
    with pytest.raises(TypeError) as raised:
        fn(*args, **kwargs)
    message = str(raised.value)
    assert not isinstance(raised.value, (AttributeError, KeyError, IndexError))
    assert message.startswith(f"{qualname}: {name} must be "), message
    assert message.endswith(f", not {type(value).__name__}" if value is not None else ", not None") or \
        f", not {type(value).__name__} " in message, message


def test_the_examples_users_met():
    model = _model()
    with pytest.raises(TypeError, match=r"^mixprec.explain: policy must be a Policy or a preset's name .*, not None$"):
        mixprec.explain(model, None)
    with pytest.raises(TypeError, match=r"^mixprec.preset: hints must be a tuple of strs or a list of strs, not int 3$"):
        mixprec.preset("fast", hints=3)
    with pytest.raises(TypeError, match=r"^mixprec.apply_numerics: settings must be a NumericSettings, not str 'high'$"):
        mixprec.apply_numerics("high")
    # A preset's name wherever a Policy is: explain and profile take it as apply does.
    assert mixprec.explain(model, "fast") == mixprec.explain(model, mixprec.preset("fast"))
    assert isinstance(mixprec.profile(model, (torch.zeros(2, 4),), "quality"), mixprec.Profile)
    # Refused before any change: the model is as it was.
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TypeError, match="mixprec.apply: keep_original must be a str, not int 3"):
        mixprec.apply(model, "fast", keep_original=3)
    assert all(torch.equal(before[k], v) and v.dtype == before[k].dtype for k, v in model.state_dict().items())


def test_a_class_is_checked_where_a_user_builds_it_and_keeps_the_error_it_raised():
    with pytest.raises(mixprec.PolicyError, match=r"^mixprec.Rule: storage must be a str or None, not int 3$") as raised:
        mixprec.Rule("*", storage=3)
    assert isinstance(raised.value, TypeError)
    with pytest.raises(TypeError, match=r"^mixprec.Policy: rules must be a tuple of Rules, not int 3$"):
        mixprec.Policy(rules=3)
    with pytest.raises(ValueError, match=r"^mixprec.NumericSettings: matmul must be a str, not None$"):
        mixprec.NumericSettings(matmul=None)
    # a list of rules is taken as their tuple, as before; numpy's numbers are numbers
    assert mixprec.Policy(rules=[mixprec.Rule("*", storage="bf16")]).rules[0].storage == "bf16"
    assert mixprec.Bound("snr", ">=", __import__("numpy").float32(30.0)).value == 30.0
    # mixprec's own reading of a policy file keeps the file's words (it is not checked at the door)
    with pytest.raises(mixprec.PolicyError, match=r"^policy rules\[0\]: rule '\*' storage: expected a string") as raised:
        mixprec.Policy.from_dict({"rules": [{"match": "*", "storage": 3}]})
    assert not isinstance(raised.value, TypeError)


def test_a_presets_name_is_resolved_only_once_every_argument_is_of_its_kind(monkeypatch):
    def no_probe(*args, **kwargs):
        raise AssertionError("the probe ran for a call that is refused")

    monkeypatch.setattr(sys.modules["mixprec.device.hardware"], "probe", no_probe)
    with pytest.raises(TypeError, match=r"^mixprec.profile: run must be a callable or None, not int 3$"):
        mixprec.profile(_model(), (torch.zeros(2, 4),), "fast", run=3)


def test_parameters_that_were_read_as_anything_are_named():
    with pytest.raises(TypeError, match=r"^mixprec.snapshot: torch_module must be torch \(an object with \.backends\) "
                                        r"or None, not int 3$"):
        mixprec.snapshot(torch_module=3)
    with pytest.raises(TypeError, match=r"^mixprec.tune: pipeline must be a str or a Pipeline, not Sequential$"):
        mixprec.tune(_model(), "snr>=30")
    with pytest.raises(TypeError, match=r"^mixprec.gradio.precision_controls: pipeline must be a pipeline "
                                        r"\(an object with \.components\) or None, not int 3$"):
        mixprec.gradio.precision_controls(pipeline=3)
