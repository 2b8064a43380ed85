"""Factory specs: ``module.path:factory`` and ``path/to/file.py:factory`` instead of registered names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from mixprec import pipelines
from mixprec.bench.worker import job_for
from mixprec.pipelines import portable_spec
from mixprec.pipelines import _factory

_FACTORIES = '''
"""Pipelines a user keeps in their own file."""

import torch
from torch import nn

from mixprec.pipelines import EmbeddingOutput, Pipeline, wrap

CALLS = []


class Tiny(Pipeline):
    name = "tiny"
    output_kind = "embedding"

    def __init__(self, width, seed=0, device="cpu"):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))
        super().__init__({"net": net}, device=device)

    def _example_inputs(self, batch, seed):
        return torch.randn(batch, 4, generator=torch.Generator().manual_seed(seed))

    def _run(self, inputs):
        return EmbeddingOutput(output=self.components["net"](inputs))


def build(size="small", seed=0):
    CALLS.append(("build", size, seed))
    return Tiny({"small": 16, "test": 3}[size], seed)


def needs_size(size):
    CALLS.append(("needs_size", size))
    return Tiny(5)


def no_arguments():
    CALLS.append(("no_arguments",))
    return Tiny(4)


def with_options(size="small", *, width=7):
    return Tiny(width)


def everything(**options):
    CALLS.append(("everything", options))
    return Tiny(6)


def raw_module():
    return nn.Sequential(nn.Linear(4, 2))


def sequential_with_inputs():
    return wrap(
        nn.Sequential(nn.Linear(4, 3)),
        example_inputs=lambda batch, seed: torch.randn(batch, 4, generator=torch.Generator().manual_seed(seed)),
    )


class Builder:
    @staticmethod
    def create(size="small"):
        return Tiny(2)


def fails(size="small"):
    raise RuntimeError(f"no weights for size {size!r}")


def returns_number():
    return 42


NOT_CALLABLE = 3
'''


@pytest.fixture
def factory_file(tmp_path):
    path = tmp_path / "my_pipelines.py"
    path.write_text(_FACTORIES)
    return path


def _module(spec: str):
    return _factory.load_factory(spec).__globals__


def test_file_factory_builds_a_pipeline_with_size_and_seed(factory_file):
    pipe = pipelines.get(f"{factory_file}:build", size="test", seed=3)
    assert isinstance(pipe, pipelines.Pipeline) and pipe.name == "tiny"
    assert pipe.components["net"][0].out_features == 3
    out = pipe.run(pipe.example_inputs(2, 0))
    assert out.embeddings.shape == (2, 2)
    calls = _module(f"{factory_file}:build")["CALLS"]
    assert calls[-1] == ("build", "test", 3)
    # the same seed gives the same weights, another seed others
    again = pipelines.get(f"{factory_file}:build", size="test", seed=3)
    other = pipelines.get(f"{factory_file}:build", size="test", seed=4)
    w = pipe.components["net"][0].weight
    assert torch.equal(w, again.components["net"][0].weight)
    assert not torch.equal(w, other.components["net"][0].weight)


def test_size_default_means_the_factorys_own_default(factory_file):
    spec = f"{factory_file}:build"
    pipe = pipelines.get(spec)  # size="default" is not passed on: the factory's "small" applies
    assert pipe.components["net"][0].out_features == 16
    calls = _module(spec)["CALLS"]
    assert calls[-1] == ("build", "small", 0)
    pipelines.get(f"{factory_file}:needs_size")  # a required size gets "default"
    assert calls[-1] == ("needs_size", "default")


def test_factories_get_only_the_keywords_they_accept(factory_file):
    calls = _module(f"{factory_file}:build")["CALLS"]
    pipelines.get(f"{factory_file}:no_arguments", size="test", seed=5)
    assert calls[-1] == ("no_arguments",)
    pipelines.get(f"{factory_file}:everything", size="test", seed=5, device="cpu")
    assert calls[-1] == ("everything", {"size": "test", "seed": 5, "device": "cpu"})
    assert pipelines.get(f"{factory_file}:with_options", width=9).components["net"][0].out_features == 9
    assert pipelines.get(f"{factory_file}:Builder.create").components["net"][0].out_features == 2
    # a device the factory does not take is applied afterwards
    assert pipelines.get(f"{factory_file}:no_arguments", device="cpu").device == torch.device("cpu")


def test_results_that_are_not_pipelines_are_wrapped(factory_file):
    raw = pipelines.get(f"{factory_file}:raw_module")
    assert isinstance(raw, pipelines.WrappedPipeline)
    assert raw.name == "my_pipelines:raw_module" and list(raw.components) == ["model"]
    seq = pipelines.get(f"{factory_file}:sequential_with_inputs")
    out = seq.run(seq.example_inputs(2, 0))
    assert seq.output_kind == "embedding" and out.output.shape == (2, 3)


def test_relative_file_specs_resolve_from_the_current_directory(factory_file, monkeypatch):
    monkeypatch.chdir(factory_file.parent)
    spec = "my_pipelines.py:build"
    absolute = pipelines.normalize_spec(spec)
    assert absolute == f"{factory_file}:build" and Path(absolute.rpartition(':')[0]).is_absolute()
    assert pipelines.normalize_spec("./sub/../my_pipelines.py:build") == absolute
    assert pipelines.normalize_spec("tts") == "tts"  # registered names are left alone
    assert pipelines.normalize_spec("mixprec.pipelines.tts:build") == "mixprec.pipelines.tts:build"
    assert pipelines.get(spec, size="test").name == "tiny"


def test_specs_sent_to_worker_processes_are_absolute(factory_file, monkeypatch):
    from mixprec.bench.configs import ConfigSpec

    monkeypatch.chdir(factory_file.parent)
    job = job_for(ConfigSpec(name="fp32", kind="baseline"), pipeline="my_pipelines.py:build", size="test", seed=0, batch=1,
                  hardware=None)
    assert job["pipeline"] == f"{factory_file}:build"
    # from another directory the absolute spec still resolves
    monkeypatch.chdir(os.path.dirname(factory_file.parent))
    assert pipelines.get(job["pipeline"], size="test").name == "tiny"
    # a spec that cannot resolve is sent as given: the worker reports the error
    assert portable_spec("gone.py:build") == "gone.py:build"
    assert portable_spec("minilm") == "minilm"


def test_module_factory_spec(tmp_path, monkeypatch):
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(_FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    pipe = pipelines.get("userpkg.models:build", size="test")
    assert pipe.components["net"][0].out_features == 3
    assert pipelines.load_factory("mixprec.pipelines.tts:build") is __import__(
        "mixprec.pipelines.tts", fromlist=["build"]
    ).build


def test_a_file_is_executed_once_per_version(factory_file):
    spec = f"{factory_file}:build"
    first = pipelines.load_factory(spec)
    assert pipelines.load_factory(spec) is first
    factory_file.write_text(_FACTORIES + "\n\ndef build(size='small', seed=0):\n    return Tiny(11, seed)\n")
    stat = factory_file.stat()
    os.utime(factory_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert pipelines.get(spec).components["net"][0].out_features == 11


def test_files_import_their_siblings(tmp_path):
    (tmp_path / "helper_sizes.py").write_text("WIDTH = 13\n")
    (tmp_path / "uses_helper.py").write_text(
        _FACTORIES + "\nimport helper_sizes\n\ndef build2():\n    return Tiny(helper_sizes.WIDTH)\n"
    )
    assert pipelines.get(f"{tmp_path / 'uses_helper.py'}:build2").components["net"][0].out_features == 13


# -- errors ---------------------------------------------------------------------------------


def _error(spec: str, **kwargs) -> str:
    with pytest.raises(pipelines.FactoryError) as info:
        pipelines.get(spec, **kwargs)
    message = str(info.value)
    assert message.startswith(f"pipeline factory {spec!r}:"), message
    return message


def test_missing_file(tmp_path):
    message = _error(f"{tmp_path}/nope.py:build")
    assert f"file '{tmp_path}/nope.py' does not exist" in message


def test_not_a_python_file(tmp_path):
    (tmp_path / "weights.bin").write_text("x")
    assert "is not a .py file" in _error(f"{tmp_path}/weights.bin:build")
    assert "is not a file" in _error(f"{tmp_path}/:build")


def test_module_that_does_not_import(tmp_path, monkeypatch):
    message = _error("no_such_package_xyz.models:build")
    assert "cannot import module 'no_such_package_xyz.models': ModuleNotFoundError: No module named 'no_such_package_xyz'" in message
    (tmp_path / "broken_dep_mod.py").write_text("import missing_dependency_abc\n\ndef build():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    message = _error("broken_dep_mod:build")
    assert "ModuleNotFoundError: No module named 'missing_dependency_abc'" in message


def test_file_that_does_not_import(tmp_path):
    (tmp_path / "dep.py").write_text("import os\nimport missing_dependency_abc\n")
    message = _error(f"{tmp_path}/dep.py:build")
    assert "raised ModuleNotFoundError: No module named 'missing_dependency_abc' (dep.py line 2)" in message
    (tmp_path / "syntax.py").write_text("def build(:\n    pass\n")
    assert "raised SyntaxError: invalid syntax (syntax.py line 1)" in _error(f"{tmp_path}/syntax.py:build")
    (tmp_path / "raises.py").write_text("x = 1\nraise RuntimeError('config file missing')\n")
    assert "raised RuntimeError: config file missing (raises.py line 2)" in _error(f"{tmp_path}/raises.py:build")


def test_missing_attribute_lists_close_names(factory_file):
    message = _error(f"{factory_file}:biuld")
    assert f"file '{factory_file}' has no attribute 'biuld'. Did you mean 'build'" in message
    assert "Callables defined there: Tiny, build, needs_size, no_arguments" in message
    assert "'Builder' in file" in _error(f"{factory_file}:Builder.craete")
    message = _error("mixprec.pipelines.tts:biuld")
    assert "module 'mixprec.pipelines.tts' has no attribute 'biuld'. Did you mean 'build'?" in message


def test_not_callable(factory_file):
    assert "'NOT_CALLABLE' is a int (3), not a callable" in _error(f"{factory_file}:NOT_CALLABLE")


def test_factory_that_raises(factory_file):
    message = _error(f"{factory_file}:fails", size="test")
    assert "the factory raised RuntimeError: no weights for size 'test' (my_pipelines.py line" in message
    assert "when called as fails(size='test')" in message


def test_factory_returning_neither_pipeline_nor_wrappable(factory_file):
    message = _error(f"{factory_file}:returns_number")
    assert "returned int (42), which is neither a mixprec.pipelines.Pipeline nor an object" in message
    assert "found no torch.nn.Module" in message


def test_keyword_the_factory_does_not_accept(factory_file):
    message = _error(f"{factory_file}:build", width=3)
    assert "the factory does not accept width; its parameters: size, seed" in message


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("my.py:", "no factory name after ':'"),
        (":build", "nothing before ':'"),
        ("tts:", "no factory name after ':'"),
        ("my.py:bad-name", "'bad-name' is not a Python name"),
        ("not a module:build", "'not a module' is neither a path to a .py file nor a dotted module name"),
    ],
)
def test_bad_spec_syntax(spec, needle):
    assert needle in _error(spec)


def test_colon_names_are_never_looked_up_in_the_registry():
    # 'tts' is registered, but 'tts:build' is a spec for a module called tts, which does not exist
    with pytest.raises(pipelines.FactoryError, match="cannot import module 'tts'"):
        pipelines.get("tts:build")
    assert issubclass(pipelines.FactoryError, ValueError)  # the CLI reports it with exit status 2
    assert not issubclass(pipelines.FactoryError, pipelines.UnknownPipelineError)
    with pytest.raises(ValueError, match="contains ':', which marks a factory spec"):
        pipelines.register("mine:v2", lambda **_: None)


def test_invalid_seed_is_still_rejected(factory_file):
    with pytest.raises(ValueError, match="seed must be an int"):
        pipelines.get(f"{factory_file}:build", seed="zero")
