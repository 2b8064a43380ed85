"""The registry: explicit registration and entry-point plugins."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from torch import nn

from mixprec import pipelines
from mixprec.pipelines import _registry

_PLUGIN_SOURCE = '''
"""A tiny third-party pipeline used by the registry tests."""

import torch
from torch import nn

from mixprec.pipelines import EmbeddingOutput, Pipeline


class DemoEmbed(Pipeline):
    name = "demo-embed"
    output_kind = "embedding"
    sensitive = ("proj",)

    def __init__(self, *, size, seed):
        self.size = size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            proj = nn.Linear(4, 2)
        super().__init__({"proj": proj})

    def _example_inputs(self, batch, seed):
        return torch.randn(batch, 4, generator=torch.Generator().manual_seed(seed))

    def _run(self, inputs):
        return EmbeddingOutput(output=self.components["proj"](inputs))


def build(*, size="default", seed=0):
    return DemoEmbed(size=size, seed=seed)
'''

_BROKEN_SOURCE = 'raise ImportError("simulated missing dependency of the broken plugin")\n'

_ENTRY_POINTS = """\
[mixprec.pipelines]
demo-embed = mixprec_demo_plugin:build
broken-one = mixprec_broken_plugin:build
"""


@pytest.fixture
def clean_registry():
    _registry._reset()
    yield
    _registry._reset()


@pytest.fixture
def plugin_site(tmp_path, monkeypatch, clean_registry):
    """A real installed distribution declaring one good and one broken entry point."""
    (tmp_path / "mixprec_demo_plugin.py").write_text(textwrap.dedent(_PLUGIN_SOURCE))
    (tmp_path / "mixprec_broken_plugin.py").write_text(_BROKEN_SOURCE)
    info = tmp_path / "mixprec_demo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: mixprec-demo-plugin\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(_ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("mixprec_demo_plugin", "mixprec_broken_plugin"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    yield tmp_path
    for module in ("mixprec_demo_plugin", "mixprec_broken_plugin"):
        sys.modules.pop(module, None)


def test_entry_point_plugins(plugin_site):
    with pytest.warns(pipelines.PluginWarning, match="broken-one"):
        names = pipelines.available()
    assert "demo-embed" in names
    assert {"tts", "diffusion", "minilm"} <= set(names)
    assert "broken-one" not in names
    errors = pipelines.plugin_errors()
    assert list(errors) == ["broken-one"]
    assert "ImportError" in errors["broken-one"]
    assert "simulated missing dependency" in errors["broken-one"]

    pipe = pipelines.get("demo-embed", size="test", seed=3)
    assert pipe.name == "demo-embed" and pipe.size == "test"
    out = pipe.run(pipe.example_inputs(2, 0))
    assert out.embeddings.shape == (2, 2)

    with pytest.raises(pipelines.UnknownPipelineError, match="failed to load.*ImportError"):
        pipelines.get("broken-one")
    # Built-ins still build while a plugin is broken.
    assert pipelines.get("tts", size="test").name == "tts"


def test_discovery_is_lazy_and_refreshable(tmp_path, monkeypatch, clean_registry):
    assert "demo-embed" not in pipelines.available()
    (tmp_path / "mixprec_demo_plugin.py").write_text(textwrap.dedent(_PLUGIN_SOURCE))
    info = tmp_path / "mixprec_demo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: mixprec-demo-plugin\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[mixprec.pipelines]\ndemo-embed = mixprec_demo_plugin:build\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mixprec_demo_plugin", raising=False)
    assert "demo-embed" not in pipelines.available()  # cached discovery
    pipelines.refresh()
    assert "demo-embed" in pipelines.available()
    assert pipelines.plugin_errors() == {}


class _Tiny(pipelines.Pipeline):
    name = "tiny"
    output_kind = "embedding"

    def __init__(self, *, size="default", seed=0):
        super().__init__({"lin": nn.Linear(2, 2)})

    def _example_inputs(self, batch, seed):
        return torch.zeros(batch, 2)

    def _run(self, inputs):
        return pipelines.EmbeddingOutput(output=self.components["lin"](inputs))


def test_register(clean_registry):
    pipelines.register("tiny", _Tiny)
    assert "tiny" in pipelines.available()
    assert isinstance(pipelines.get("tiny"), _Tiny)
    with pytest.raises(ValueError, match="already registered"):
        pipelines.register("tiny", _Tiny)
    with pytest.raises(ValueError, match="already registered"):
        pipelines.register("tts", _Tiny)
    pipelines.register("tiny", _Tiny, replace=True)
    with pytest.raises(ValueError, match="callable"):
        pipelines.register("other", 42)
    with pytest.raises(ValueError, match="name"):
        pipelines.register("has space", _Tiny)
    pipelines.register("not-a-pipeline", lambda **kwargs: object())
    with pytest.raises(TypeError, match="not a Pipeline"):
        pipelines.get("not-a-pipeline")


def test_pipeline_base_validates_components():
    class Bad(pipelines.Pipeline):
        name = "bad"
        output_kind = "embedding"

    with pytest.raises(ValueError, match="torch.nn.Module"):
        Bad({"x": 3})
    with pytest.raises(ValueError, match="'total'"):
        Bad({"total": nn.Linear(1, 1)})
    with pytest.raises(ValueError, match="no components"):
        Bad({})

    class NoKind(pipelines.Pipeline):
        name = "nokind"

    with pytest.raises(ValueError, match="output_kind must be one of"):
        NoKind({"x": nn.Linear(1, 1)})


def test_a_device_goes_to_the_factory_that_accepts_it_and_moves_the_others(clean_registry):
    seen = []

    def with_device(*, size="default", seed=0, device="cpu"):
        seen.append(device)
        return _Tiny().to(device)

    pipelines.register("tiny", _Tiny)
    pipelines.register("tiny-device", with_device)
    assert pipelines.get("tiny-device", device="cpu").device == torch.device("cpu") and seen == ["cpu"]
    assert pipelines.get("tiny-device").device == torch.device("cpu") and seen == ["cpu", "cpu"]  # its own default
    # _Tiny takes no device: built as it is, then moved there (as for a factory spec)
    moved = pipelines.get("tiny", device="meta")
    assert moved.device == torch.device("meta") and moved.components["lin"].weight.device.type == "meta"
    assert pipelines.get("tiny", device="cpu").device == torch.device("cpu")
