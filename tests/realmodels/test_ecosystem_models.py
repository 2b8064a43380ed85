"""Models as other libraries hand them over, under the presets, applied alone and guarded.

Each is built from the real library, tiny and seeded:

* a transformers Llama under accelerate's ``cpu_offload`` (its weights in the offload
  hook's map, meta placeholders in the modules), one tied to its head, and a diffusers
  ``UNet2DModel`` under it;
* a transformers Llama with peft LoRA adapters (non-zero adapters, so they count);
* a convolution stack under ``weight_norm``, both APIs (``nn.utils.weight_norm`` and
  ``nn.utils.parametrizations.weight_norm``);
* a component wrapped by ``torch.compile`` before apply, called as its own component;
* a Llama whose embedding is tied to its head;
* a model with ``torch.ao`` dynamically quantized int8 Linear layers beside float ones;
* a model with a parametrization of its own (a symmetric weight);
* a text encoder and a decoder the app calls separately, sharing one embedding.

See ``realmodels_harness`` for what each combination checks (bit-exact revert, no hook
or flag left, output within the precision tier's bound of fp32).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import mixprec
from tiny_llama import tiny_llama
from mixprec.casting.kinds import stored_bytes
from realmodels_harness import Case, check_combination, check_guarded, compare_generation, compare_waveform

NEW_TOKENS = 6
IDS = torch.tensor([[1, 5, 9, 23, 42, 7, 64, 100]])
PRESETS = [pytest.param(p, "measured", id=f"{p}-measured") for p in ("quality", "balanced", "fast", "memory")] + [
    pytest.param(p, "bf16-fast", id=f"{p}-bf16-fast") for p in ("balanced", "fast", "memory")]
GUARDED = [("balanced", "measured"), ("fast", "bf16-fast"), ("memory", "measured"), ("fp16-storage-fp32-compute", "measured")]


def _llama(*, tied: bool = False):
    return tiny_llama(tied=tied)


def _generation_case(model, vocab_size: int = 128, target=None) -> Case:
    def run():
        return model.generate(input_ids=IDS, attention_mask=torch.ones_like(IDS), max_new_tokens=NEW_TOKENS,
                              do_sample=False, eos_token_id=None, output_logits=True, return_dict_in_generate=True)

    def compare(ref, out, tier):
        return compare_generation(ref, out, tier, vocab_size=vocab_size)

    target = model if target is None else target
    return Case(target, {"": target}, run, compare).record_reference()


def _waveform_case(target, run) -> Case:
    modules = target if isinstance(target, dict) else {"": target}
    return Case(target, modules, run, compare_waveform).record_reference()


# --- accelerate offload -----------------------------------------------------------------

def _offload_store(model) -> dict[str, torch.Tensor]:
    """The state dict ``cpu_offload`` keeps the weights in (every offload hook's map views it)."""
    return next(m._hf_hook.weights_map.dataset for m in model.modules()
                if getattr(getattr(m, "_hf_hook", None), "weights_map", None) is not None)


def _offloaded_case(tied: bool) -> Case:
    accelerate = pytest.importorskip("accelerate")
    model = _llama(tied=tied)
    fp32_bytes = mixprec.weight_bytes(model)
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    assert model.model.layers[0].mlp.up_proj.weight.is_meta
    case = _generation_case(model)
    case.state["fp32 bytes"] = fp32_bytes

    def inside(case, tier):
        # What the hook moves in is already stored as planned: each map value has its placeholder's dtype.
        store = _offload_store(model)
        placeholders = dict(model.named_parameters(remove_duplicate=False))
        wrong = {name: (store[name].dtype, p.dtype) for name, p in placeholders.items() if store[name].dtype != p.dtype}
        assert not wrong, f"the offload map holds other dtypes than the placeholders say: {wrong}"
        kept = sum(stored_bytes(t) for t in {t.data_ptr(): t for t in store.values()}.values() if t.is_floating_point())
        buffers = sum(stored_bytes(b) for b in model.buffers())
        assert mixprec.weight_bytes(model) == kept + buffers, "weight bytes do not count what the offload keeps"
        if tier not in ("exact", "fp32-math"):
            assert kept + buffers < 0.6 * case.state["fp32 bytes"], (kept, case.state["fp32 bytes"])
        return {"offloaded bytes": kept}

    case.inside = inside
    return case


@pytest.fixture(scope="module")
def offloaded_llama() -> Case:
    return _offloaded_case(tied=False)


@pytest.fixture(scope="module")
def offloaded_tied_llama() -> Case:
    return _offloaded_case(tied=True)


def _check_offloaded(case: Case, policy: str, hw, record_property, *, guard: bool) -> None:
    """A combination on an offloaded model; after revert the offload map holds its original
    tensors again (the same objects, the same values)."""
    store = _offload_store(case.target)
    before = {name: (t, t.clone()) for name, t in store.items()}
    if guard:
        check_guarded(case, policy, hw, record_property)
    else:
        check_combination(case, policy, hw, record_property)
    changed = [name for name, (t, values) in before.items()
               if store[name] is not t or t.dtype != values.dtype or not torch.equal(t, values)]
    assert not changed, f"the offload map was not restored: {changed[:5]}"


def test_offloaded_weights_count_in_weight_bytes(offloaded_llama):
    assert mixprec.weight_bytes(offloaded_llama.target) == offloaded_llama.state["fp32 bytes"]


def test_explain_names_offloaded_weights(offloaded_llama, measured_hw):
    rows = {r["module"]: r for r in mixprec.explain(offloaded_llama.target, mixprec.preset("memory", hardware=measured_hw))}
    assert "offloaded (weight)" in rows["model.layers.0.mlp.up_proj"]["reason"]
    assert "host memory" in rows["model.layers.0.mlp.up_proj"]["reason"]
    assert "offloaded" not in rows["model.layers.0.mlp"]["reason"]  # a container keeps nothing itself


@pytest.mark.parametrize(("policy", "hw"), PRESETS, indirect=["hw"])
def test_offloaded_llama(offloaded_llama, policy, hw, record_property):
    _check_offloaded(offloaded_llama, policy, hw, record_property, guard=False)


@pytest.mark.parametrize(("policy", "hw"), PRESETS + [pytest.param("fp16-storage-fp32-compute", "measured",
                                                                    id="fp16-storage-fp32-compute-measured")],
                         indirect=["hw"])
def test_offloaded_llama_guarded(offloaded_llama, policy, hw, record_property):
    _check_offloaded(offloaded_llama, policy, hw, record_property, guard=True)


@pytest.mark.parametrize(("policy", "hw"), [("memory", "measured"), ("fast", "bf16-fast")], indirect=["hw"])
def test_offloaded_tied_llama(offloaded_tied_llama, policy, hw, record_property):
    """The head's entry in the offload map is a view of the embedding's: cast once, still one tensor."""
    store = _offload_store(offloaded_tied_llama.target)
    assert store["lm_head.weight"].data_ptr() == store["model.embed_tokens.weight"].data_ptr()
    _check_offloaded(offloaded_tied_llama, policy, hw, record_property, guard=False)
    assert store["lm_head.weight"].data_ptr() == store["model.embed_tokens.weight"].data_ptr()


@pytest.fixture(scope="module")
def offloaded_unet() -> Case:
    """A diffusers ``UNet2DModel`` (attention blocks included) under ``cpu_offload``: one denoising call."""
    accelerate = pytest.importorskip("accelerate")
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(sample_size=8, in_channels=3, out_channels=3, block_out_channels=(16, 32),
                                 layers_per_block=1, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                 up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8).eval()
    accelerate.cpu_offload(unet, execution_device=torch.device("cpu"))
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    return _waveform_case(unet, lambda: unet(x, torch.tensor([10])).sample)


@pytest.mark.parametrize(("policy", "hw"), [("memory", "measured"), ("fast", "bf16-fast")], indirect=["hw"])
def test_offloaded_unet(offloaded_unet, policy, hw, record_property):
    _check_offloaded(offloaded_unet, policy, hw, record_property, guard=False)


@pytest.mark.parametrize(("policy", "hw"), [("balanced", "measured"), ("fp16-storage-fp32-compute", "measured")],
                         indirect=["hw"])
def test_offloaded_unet_guarded(offloaded_unet, policy, hw, record_property):
    _check_offloaded(offloaded_unet, policy, hw, record_property, guard=True)


# --- peft, weight_norm, compile, tied, quantized, parametrized, split ----------------------

@pytest.fixture(scope="module")
def lora_llama() -> Case:
    peft = pytest.importorskip("peft")
    model = _llama()
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    torch.manual_seed(1)
    lora = peft.get_peft_model(model, config).eval()
    return _generation_case(lora)


def _conv_stack() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(4, 16, 5, padding=2), nn.GELU(), nn.Conv1d(16, 16, 5, padding=2), nn.GELU(),
                         nn.Conv1d(16, 1, 3, padding=1)).eval()


def _signal(channels: int = 4) -> torch.Tensor:
    return torch.randn(1, channels, 200, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def weight_normed() -> Case:
    model = _conv_stack()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the old API is deprecated, and still what many models use
        nn.utils.weight_norm(model[0])
    nn.utils.parametrizations.weight_norm(model[2])
    x = _signal()
    return _waveform_case(model, lambda: model(x))


@pytest.fixture(scope="module")
def compiled_component() -> Case:
    """An encoder compiled by the app before apply (``OptimizedModule``), and a head it calls separately."""
    torch.manual_seed(0)
    encoder = torch.compile(nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 32), nn.LayerNorm(32)).eval(),
                            backend="eager", dynamic=False)
    head = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    return _waveform_case({"encoder": encoder, "head": head}, lambda: head(encoder(x)))


@pytest.fixture(scope="module")
def tied_llama() -> Case:
    model = _llama(tied=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return _generation_case(model)


class _Mixed(nn.Module):
    """Float layers around an int8 dynamically quantized MLP (torch.ao), as a partly quantized checkpoint loads."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        self.out = nn.Linear(32, 8)

    def forward(self, x):
        h = self.norm(self.embed(x))
        return self.out(h + self.mlp(h))


@pytest.fixture(scope="module")
def quantized_mixed() -> Case:
    torch.manual_seed(0)
    model = _Mixed().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation of eager quantization
        model.mlp = torch.ao.quantization.quantize_dynamic(model.mlp, {nn.Linear}, dtype=torch.qint8)
    assert type(model.mlp[0]).__module__.startswith("torch.ao.nn.quantized")
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    return _waveform_case(model, lambda: model(x))


class _Symmetric(nn.Module):
    """The model's own parametrization: the weight is the symmetric part of what is stored."""

    def forward(self, w):
        return (w + w.transpose(0, 1)) / 2


@pytest.fixture(scope="module")
def parametrized() -> Case:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4)).eval()
    nn.utils.parametrize.register_parametrization(model[2], "weight", _Symmetric())
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    return _waveform_case(model, lambda: model(x))


@pytest.fixture(scope="module")
def split_components() -> Case:
    """A text encoder and a decoder the app calls one after the other, sharing one embedding module."""
    torch.manual_seed(0)
    embed = nn.Embedding(64, 32)
    encoder = nn.Sequential(embed, nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)).eval()
    decoder = nn.ModuleDict({"embed": embed, "layer": nn.TransformerDecoderLayer(32, 4, 64, batch_first=True, dropout=0.0),
                             "head": nn.Linear(32, 64)}).eval()
    src = torch.tensor([[3, 9, 27, 40, 11, 5]])
    tgt = torch.tensor([[1, 7, 21, 33]])

    def run():
        memory = encoder(src)
        h = decoder["layer"](decoder["embed"](tgt), memory)
        return decoder["head"](h)

    return _waveform_case({"encoder": encoder, "decoder": decoder}, run)


CASES = ["lora_llama", "weight_normed", "compiled_component", "tied_llama", "quantized_mixed", "parametrized",
         "split_components"]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize(("policy", "hw"), PRESETS, indirect=["hw"])
def test_ecosystem_model(name, policy, hw, record_property, request):
    check_combination(request.getfixturevalue(name), policy, hw, record_property)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize(("policy", "hw"), GUARDED, indirect=["hw"])
def test_ecosystem_model_guarded(name, policy, hw, record_property, request):
    check_guarded(request.getfixturevalue(name), policy, hw, record_property)
