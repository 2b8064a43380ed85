"""A pipeline factory for the budget tests: the test-size diffusion pipeline with 8 denoising steps."""

from mixprec.pipelines.diffusion import build


def pipeline(size="test", seed=0, device="cpu", **overrides):
    return build(size=size, seed=seed, device=device, **{"steps": 8, **overrides})
