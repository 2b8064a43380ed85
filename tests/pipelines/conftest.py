"""Shared fixtures: tiny ("test" size) pipelines built once per session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from mixprec import pipelines  # noqa: E402

BUILTINS = ("tts", "diffusion", "minilm")


@pytest.fixture(scope="session")
def built() -> dict[str, pipelines.Pipeline]:
    """One test-size instance of every built-in pipeline (seed 0)."""
    return {name: pipelines.get(name, size="test", seed=0) for name in BUILTINS}


@pytest.fixture(scope="session")
def tts(built):
    return built["tts"]


@pytest.fixture(scope="session")
def diffusion(built):
    return built["diffusion"]


@pytest.fixture(scope="session")
def minilm(built):
    return built["minilm"]
