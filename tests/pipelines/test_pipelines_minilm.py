"""The trained all-MiniLM-L6-v2 pipeline."""

from __future__ import annotations

import pytest
import torch

from mixprec import pipelines
from mixprec.pipelines.minilm import SENTENCES


@pytest.mark.parametrize("batch", [1, 2])
def test_minilm_shapes_and_unit_norm(minilm, batch):
    out = minilm.run(minilm.example_inputs(batch, 0))
    assert out.embeddings.shape == (batch, 384)
    assert torch.allclose(out.embeddings.norm(dim=-1), torch.ones(batch), atol=1e-5)
    assert len(out.sentences) == batch and all(s in SENTENCES for s in out.sentences)


def test_minilm_paraphrase_closer_than_unrelated(minilm):
    guitar, strum, market = minilm.embed(
        [
            "A man is playing a guitar.",
            "Someone is strumming a guitar.",
            "The stock market fell sharply today.",
        ]
    )
    paraphrase = float(guitar @ strum)
    unrelated = float(guitar @ market)
    assert paraphrase > unrelated + 0.3
    assert paraphrase > 0.5


def test_minilm_is_deterministic(minilm):
    inputs = minilm.example_inputs(2, 4)
    assert inputs.sentences == minilm.example_inputs(2, 4).sentences
    first = minilm.run(inputs).embeddings
    assert torch.equal(first, minilm.run(inputs).embeddings)
    other = pipelines.get("minilm", size="test")
    assert torch.equal(other.run(other.example_inputs(2, 4)).embeddings, first)


def test_minilm_examples_depend_on_seed_and_cover_large_batches(minilm):
    picks = {minilm.example_inputs(3, seed).sentences for seed in range(5)}
    assert len(picks) > 1
    big = minilm.example_inputs(len(SENTENCES) + 3, 0)
    assert len(big.sentences) == len(SENTENCES) + 3
    assert set(big.sentences[: len(SENTENCES)]) == set(SENTENCES)


def test_minilm_embed_rejects_bad_input(minilm):
    with pytest.raises(ValueError):
        minilm.embed("not a list")
    with pytest.raises(ValueError):
        minilm.embed([])
