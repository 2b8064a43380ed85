"""Every public function of mixprec (and of mixprec.gradio) refuses an argument of the wrong kind at the
door, in mixprec's words: a TypeError naming the function, the parameter, what was given and what is
accepted, and nothing of Python's internals (AttributeError, KeyError, IndexError).

The functions and their parameters are read from the signatures: a public function added later is
covered without this file changing. For each parameter, Hypothesis draws values of other kinds than
its annotation allows (``None`` included where an object is needed); the other required parameters
get a valid value of their kind.
"""

from __future__ import annotations

import inspect
import typing

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixprec
import mixprec.gradio
from mixprec._surface import accepts, describe

FUNCTIONS = [(f"{module.__name__}.{name}", getattr(module, name))
             for module in (mixprec, mixprec.gradio) for name in module.__all__
             if inspect.isfunction(getattr(module, name))]

#: Values of many kinds; for each parameter, those its annotation does not accept are the wrong ones.
ANY_KIND = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=4),
                     st.binary(max_size=3), st.lists(st.integers(0, 2), max_size=2),
                     st.dictionaries(st.text(max_size=2), st.integers(0, 2), max_size=2), st.just(object()),
                     st.just(torch.zeros(1)), st.just(b"x"), st.just(1j))


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4))


def _valid(name: str, annotation, fn_name: str):
    """A valid value for a required parameter, from its name and annotation."""
    if name in ("target", "pipeline"):
        return _model()
    if name == "inputs":
        return (torch.zeros(1, 4),)
    if name == "applied":
        return mixprec.apply(_model(), mixprec.Policy())
    if name in ("bound", "text"):
        return "cosine>=0.9"
    if name == "name":
        return "fast"
    if name == "matmul":
        return "highest"
    for kind, value in ((mixprec.Policy, mixprec.Policy()), (mixprec.NumericSettings, mixprec.NumericSettings()),
                        (mixprec.Snapshot, None)):
        if accepts(value if value is not None else mixprec.snapshot(), annotation):
            return value if value is not None else mixprec.snapshot()
    if accepts("x", annotation):
        return "MYAPP"
    raise AssertionError(f"{fn_name}: no valid value known for the required parameter {name}: {annotation}")


def _cases():
    for qualname, fn in FUNCTIONS:
        hints = typing.get_type_hints(inspect.unwrap(fn))
        for name, param in inspect.signature(fn).parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            annotation = hints.get(name, typing.Any)
            if annotation is typing.Any and name != "target":
                continue  # anything goes: nothing is of the wrong kind
            yield pytest.param(qualname, fn, name, annotation, id=f"{qualname}:{name}")


def test_every_public_function_is_checked():
    assert len(FUNCTIONS) >= 18
    unchecked = [name for name, fn in FUNCTIONS if not getattr(fn, "__mixprec_checked__", False)]
    assert unchecked == []


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
    signature = inspect.signature(fn)
    kwargs = {p: _valid(p, typing.get_type_hints(inspect.unwrap(fn)).get(p, typing.Any), qualname)
              for p, param in signature.parameters.items()
              if p != name and param.default is param.empty and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)}
    kwargs[name] = value
    args = [kwargs.pop(p) for p, param in signature.parameters.items() if param.kind is param.POSITIONAL_ONLY and p in kwargs]
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
