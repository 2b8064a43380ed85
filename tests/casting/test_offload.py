"""Weights accelerate's offload hooks keep outside their modules (mixprec.casting.offload).

A tiny seeded transformers Llama, offloaded by the real accelerate: ``cpu_offload`` (a
state dict in host memory, with and without ``preload_module_classes``) and a
``device_map`` with layers on disk (``from_pretrained(..., offload_folder=...)``).
"""

from __future__ import annotations

import hashlib
import types
import warnings

import pytest
import torch

import mixprec
from tiny_llama import tiny_llama
from mixprec import Policy, Rule
from mixprec.casting.targets import ApplyError

accelerate = pytest.importorskip("accelerate")
pytest.importorskip("transformers")

IDS = torch.tensor([[1, 5, 9, 23, 42, 7, 64, 100]])
BF16 = Policy(rules=(Rule("*", storage="bf16"),))


def _llama(*, tied: bool = False):
    return tiny_llama(tied=tied)


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def _store(model) -> dict[str, torch.Tensor]:
    return model.model.embed_tokens._hf_hook.weights_map.dataset


def _snapshot(store) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {k: (t, t.clone()) for k, t in store.items()}


def _restored(store, before, *, same_objects: bool = True) -> list[str]:
    return [k for k, (t, values) in before.items()
            if (same_objects and store[k] is not t) or store[k].dtype != values.dtype or not torch.equal(store[k], values)]


def _forwards(model) -> dict[str, tuple]:
    """What every hooked module's ``forward`` and ``_old_forward`` are (accelerate's chain)."""
    return {name: (m.__dict__.get("forward"), m.__dict__.get("_old_forward")) for name, m in model.named_modules()
            if "_hf_hook" in m.__dict__}


@pytest.fixture
def offloaded():
    model = _llama()
    ref = _logits(model)
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    return model, ref


def test_cast_where_the_hook_keeps_them_and_reverted_exactly(offloaded):
    model, ref = offloaded
    store, forwards = _store(model), _forwards(model)
    before = _snapshot(store)
    fp32_bytes = mixprec.weight_bytes(model)
    with mixprec.apply(model, BF16) as applied:
        layer = model.model.layers[0].mlp.up_proj
        assert layer.weight.is_meta and layer.weight.dtype == torch.bfloat16
        assert store["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
        assert applied.weight_bytes() == fp32_bytes // 2
        out = _logits(model)
    assert torch.isfinite(out).all() and (out.float() - ref).abs().max() < 0.5
    assert not _restored(store, before)
    assert _forwards(model) == forwards
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.float32
    assert torch.equal(_logits(model), ref)


def test_weights_read_by_fp32_compute_are_moved_in_first(offloaded):
    """fp32 compute from 16-bit weights reads them inside the call: beneath the hook that moves them in."""
    model, ref = offloaded
    forwards = _forwards(model)
    with mixprec.apply(model, Policy(rules=(Rule("*", storage="fp16", compute="fp32"),))):
        out = _logits(model)
    assert out.dtype == torch.float32 and (out - ref).abs().max() < 0.05
    assert _forwards(model) == forwards
    assert torch.equal(_logits(model), ref)


def test_preloaded_submodules():
    """``preload_module_classes``: one hook on the MLP moves its children's weights in."""
    model = _llama()
    ref = _logits(model)
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"), preload_module_classes=["LlamaMLP"])
    assert "_hf_hook" not in model.model.layers[0].mlp.up_proj.__dict__
    store = _store(model)
    before = _snapshot(store)
    with mixprec.apply(model, BF16):
        assert store["model.layers.1.mlp.down_proj.weight"].dtype == torch.bfloat16
        assert torch.isfinite(_logits(model)).all()
    assert not _restored(store, before)
    assert torch.equal(_logits(model), ref)


def test_tied_weights_stay_one_tensor_and_keep_original_disk():
    model = _llama(tied=True)
    ref = _logits(model)
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    store = _store(model)
    before = _snapshot(store)
    fp32_bytes = mixprec.weight_bytes(model)
    with mixprec.apply(model, BF16, keep_original="disk") as applied:
        assert store["lm_head.weight"].data_ptr() == store["model.embed_tokens.weight"].data_ptr()
        assert applied.original_bytes == fp32_bytes  # in a file: the tied weight once
        assert torch.isfinite(_logits(model)).all()
    assert not _restored(store, before, same_objects=False)
    assert store["lm_head.weight"].data_ptr() == store["model.embed_tokens.weight"].data_ptr()
    assert torch.equal(_logits(model), ref)


def test_guard_fallback_reapplies_beneath_the_hooks(offloaded, tmp_path):
    model, ref = offloaded
    store, forwards = _store(model), _forwards(model)
    before = _snapshot(store)
    applied = mixprec.apply(model, BF16)
    guard = mixprec.guard(applied, on_nonfinite="fallback", store=mixprec.FallbackStore(tmp_path / "fallbacks.json"))
    applied.reapply(Policy(rules=(Rule("*", storage="fp16", compute="fp32"),)))  # what a fallback pin does
    assert store["model.layers.0.mlp.up_proj.weight"].dtype == torch.float16
    out = _logits(model)
    guard.remove()
    applied.revert()
    assert (out - ref).abs().max() < 0.05
    assert not _restored(store, before)
    assert _forwards(model) == forwards
    assert torch.equal(_logits(model), ref)


def test_fp8_keeps_offloaded_weights_in_their_compute_dtype(offloaded):
    model, ref = offloaded
    store = _store(model)
    before = _snapshot(store)
    with pytest.warns(UserWarning, match="offloaded weight.*planned in fp8"):
        applied = mixprec.apply(model, Policy(rules=(Rule("*", storage="fp8"),)))
    try:
        rows = {r["module"]: r for r in applied.explain()}
        assert "offloaded by accelerate" in rows["model.layers.0.mlp.up_proj"]["reason"]
        assert store["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
        assert torch.isfinite(_logits(model)).all()
    finally:
        applied.revert()
    assert not _restored(store, before)
    assert torch.equal(_logits(model), ref)


def test_a_map_it_cannot_write_is_refused_before_anything_changes(offloaded):
    model, ref = offloaded
    hook = model.model.layers[0].mlp.up_proj._hf_hook
    hook.weights_map = types.MappingProxyType({"weight": _store(model)["model.layers.0.mlp.up_proj.weight"]})
    with pytest.raises(ApplyError, match=r"mappingproxy \(first: 'model.layers.0.mlp.up_proj.weight'\).*nothing was changed"):
        mixprec.apply(model, BF16)
    assert all(t.dtype == torch.float32 for t in _store(model).values() if t.is_floating_point())
    assert torch.equal(_logits(model), ref)
    with mixprec.apply(model, Policy(rules=(Rule("*", storage="fp32"),))):  # nothing to cast: nothing to write
        assert torch.equal(_logits(model), ref)


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_device_map_with_layers_on_disk(tmp_path, bf16_cpu):
    from transformers import LlamaForCausalLM

    model = _llama()
    ref = _logits(model)
    model.save_pretrained(tmp_path / "model")
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.layers.1": "disk", "model.norm": "cpu",
                  "model.rotary_emb": "cpu", "lm_head": "cpu"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = LlamaForCausalLM.from_pretrained(tmp_path / "model", device_map=device_map,
                                                  offload_folder=tmp_path / "offload").eval()
    files = {p: _digest(p) for p in tmp_path.rglob("*") if p.is_file()}
    layer = loaded.model.layers[0].mlp.up_proj
    loader = layer._hf_hook.weights_map.dataset
    index = dict(loader.index)
    assert layer.weight.is_meta and "model.layers.0.mlp.up_proj.weight" not in loader.state_dict
    fp32_bytes = mixprec.weight_bytes(loaded)
    assert fp32_bytes == mixprec.weight_bytes(model)
    policy = mixprec.preset("memory", hardware=bf16_cpu)
    rows = {r["module"]: r for r in mixprec.explain(loaded, policy)}
    assert "offloaded (weight)" in rows["model.layers.0.mlp.up_proj"]["reason"] and "on disk" in rows["model.layers.0.mlp.up_proj"]["reason"]
    with mixprec.apply(loaded, policy) as applied:
        assert layer._hf_hook.weights_map["weight"].dtype == torch.bfloat16
        assert applied.weight_bytes() < 0.6 * fp32_bytes
        out = _logits(loaded)
    assert torch.isfinite(out).all() and (out.float() - ref).abs().max() < 0.5
    assert all(loader.index[k] is v for k, v in index.items()) and loader.index.keys() == index.keys()
    assert {p: _digest(p) for p in files} == files  # the model's files and the offload folder are never written
    assert torch.equal(_logits(loaded), ref)


def test_disk_offload_to_accelerate_files(tmp_path):
    """``accelerate.disk_offload``: each weight in a ``.dat`` file of its own, the index naming dtype and shape."""
    model = _llama()
    ref = _logits(model)
    fp32_bytes = mixprec.weight_bytes(model)
    accelerate.disk_offload(model, tmp_path / "offload", execution_device=torch.device("cpu"))
    loader = model.model.layers[0].mlp.up_proj._hf_hook.weights_map.dataset
    assert not loader.state_dict and (tmp_path / "offload" / "model.layers.0.mlp.up_proj.weight.dat").exists()
    files = {p: _digest(p) for p in (tmp_path / "offload").iterdir()}
    assert mixprec.weight_bytes(model) == fp32_bytes
    with mixprec.apply(model, BF16) as applied:
        assert loader["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
        assert applied.weight_bytes() == fp32_bytes // 2
        assert torch.isfinite(_logits(model)).all()
    assert {p: _digest(p) for p in files} == files
    assert torch.equal(_logits(model), ref)


def test_guard_fallback_on_an_overflow(tmp_path):
    """An MLP whose activations overflow fp16: the guard's fallback pins it and re-applies beneath the hooks, mid-call."""
    model = _llama()
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.mul_(3000.0)
        model.model.layers[1].mlp.gate_proj.weight.mul_(3000.0)
    ref = _logits(model)
    assert torch.isfinite(ref).all()
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    store, forwards = _store(model), _forwards(model)
    before = _snapshot(store)
    applied = mixprec.apply(model, Policy(rules=(Rule("*", storage="fp16"),)))
    assert not torch.isfinite(_logits(model)).all()
    guard = mixprec.guard(applied, on_nonfinite="fallback", store=mixprec.FallbackStore(tmp_path / "fallbacks.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the guard says what it pinned
        out = _logits(model)
    guard.remove()
    applied.revert()
    assert "model.layers.1.mlp.down_proj" in guard.pins
    assert torch.isfinite(out).all() and (out.float() - ref).abs().max() < 0.5
    assert not _restored(store, before)
    assert _forwards(model) == forwards
    assert all(p.is_meta for p in model.parameters())
    assert torch.equal(_logits(model), ref)
