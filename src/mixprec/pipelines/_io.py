"""Helpers behind the command line: describe the pipelines, run one into a file."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from mixprec.pipelines._base import Pipeline, PipelineOutput, check_batch_seed
from mixprec.pipelines._registry import available, get
from mixprec.pipelines._sizes import build_for_counting

__all__ = ["EXTENSIONS", "describe", "describe_all", "run_to_file", "write_output"]

#: File extensions :func:`run_to_file` writes, per output kind.
EXTENSIONS: dict[str, tuple[str, ...]] = {
    "audio": (".wav",),
    "image": (".png",),
    "embedding": (".npy", ".json"),
}


def describe(pipeline: Pipeline) -> dict[str, Any]:
    """Summarise one pipeline: name, output kind, components with parameter counts, total."""
    counts = pipeline.parameter_counts()
    total = counts.pop("total")
    info: dict[str, Any] = {
        "name": pipeline.name,
        "output_kind": pipeline.output_kind,
        "components": counts,
        "total": total,
    }
    if pipeline.sample_rate:
        info["sample_rate"] = pipeline.sample_rate
    return info


def describe_all(*, size: str = "default", seed: int = 0) -> list[dict[str, Any]]:
    """Build every available pipeline and describe it (see :func:`describe`).

    Each is built on the ``meta`` device where its factory allows, so no weights
    are allocated, whatever the size (see :func:`~mixprec.pipelines._sizes.build_for_counting`).
    A pipeline that cannot be built is listed with an ``"error"`` entry
    instead of stopping the listing.
    """
    rows = []
    for name in available():
        try:
            rows.append(describe(build_for_counting(name, size=size, seed=seed)))
        except Exception as exc:  # report every pipeline, even if one is broken
            rows.append({"name": name, "error": f"{type(exc).__name__}: {exc}"})
    return rows


def _check_extension(kind: str, path: Path) -> str:
    suffix = path.suffix.lower()
    valid = EXTENSIONS[kind]
    if suffix not in valid:
        raise ValueError(
            f"cannot write {kind} output to {str(path)!r}: extension {suffix or '(none)'!r} "
            f"is not one of {', '.join(valid)}"
        )
    return suffix


class PipelineRunError(RuntimeError):
    """The pipeline's own code raised while :func:`run_to_file` ran it (before anything was written)."""


def write_output(pipeline: Pipeline, output: PipelineOutput, path: str | Path) -> dict[str, Any]:
    """Write the first batch item of ``output`` (all embeddings) to ``path``.

    Audio goes to 16-bit PCM ``.wav`` (soundfile), images to ``.png`` (Pillow),
    embeddings to ``.npy`` (NumPy) or ``.json``.

    Returns:
        ``{"path", "shape"}`` plus ``"sample_rate"`` and ``"audio_seconds"`` (the written
        audio's length) or ``"image_size"`` (width, height).

    Raises:
        ValueError: If the extension does not suit the pipeline's output kind.
    """
    path = Path(path)
    suffix = _check_extension(pipeline.output_kind, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = output.output.detach().to("cpu", torch.float32)
    info: dict[str, Any] = {"path": str(path), "shape": list(data.shape)}
    if pipeline.output_kind == "audio":
        import soundfile

        rate = int(getattr(output, "sample_rate", None) or pipeline.sample_rate or 0)
        wave = data.reshape(data.shape[0], -1)[0].clamp(-1.0, 1.0).numpy()
        soundfile.write(str(path), wave, rate, subtype="PCM_16", format="WAV")
        info["sample_rate"] = rate
        info["audio_seconds"] = round(wave.shape[0] / rate, 4) if rate else None
    elif pipeline.output_kind == "image":
        from PIL import Image

        pixels = (data[0].clamp(0.0, 1.0) * 255.0).round().to(torch.uint8)
        Image.fromarray(pixels.permute(1, 2, 0).numpy()).save(path, format="PNG")
        info["image_size"] = [int(pixels.shape[2]), int(pixels.shape[1])]
    elif suffix == ".npy":
        import numpy

        numpy.save(path, data.numpy())
    else:
        payload = {
            "pipeline": pipeline.name,
            "sentences": list(getattr(output, "sentences", ())),
            "embeddings": data.tolist(),
        }
        path.write_text(json.dumps(payload), encoding="utf-8")
    return info


def run_to_file(
    name: str,
    out_path: str | Path,
    *,
    seed: int = 0,
    batch: int = 1,
    size: str = "default",
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """Build pipeline ``name``, run it once on its example inputs and write the result.

    Args:
        name: A registered pipeline name.
        out_path: Destination; its extension must suit the output kind
            (``.wav`` audio, ``.png`` image, ``.npy``/``.json`` embedding).
        seed: Seed of the weights and of the example inputs.
        batch: Batch size of the run (only the first item is written for audio/images).
        size: Pipeline size.
        device: Device the pipeline is built and run on (see :func:`get`; ``None``:
            the factory's own default).

    Returns:
        A summary: ``pipeline``, ``device``, ``path``, ``shape`` (of the whole output),
        ``wall_seconds`` (how long the run alone took), and ``sample_rate`` with
        ``audio_seconds`` (the audio's length) or ``image_size``.

    Raises:
        ValueError: For an unknown pipeline, a bad extension, batch or seed.
        PipelineRunError: The pipeline raised while building its inputs or running.
    """
    check_batch_seed(batch, seed)
    known = sorted({ext for exts in EXTENSIONS.values() for ext in exts})
    if Path(out_path).suffix.lower() not in known:
        raise ValueError(
            f"cannot write to {str(out_path)!r}: extension must be one of {', '.join(known)}"
        )
    pipeline = get(name, size=size, seed=seed, device=device)
    _check_extension(pipeline.output_kind, Path(out_path))
    cuda = pipeline.device.type == "cuda"
    try:
        inputs = pipeline.example_inputs(batch, seed)
        if cuda:
            torch.cuda.synchronize(pipeline.device)
        start = time.perf_counter()
        output = pipeline.run(inputs)
        if cuda:  # the kernels have run, not only been launched
            torch.cuda.synchronize(pipeline.device)
        seconds = time.perf_counter() - start
    except (ValueError, NotImplementedError):
        raise
    except Exception as exc:  # the pipeline's own code; an OSError here is not about the output file
        raise PipelineRunError(f"pipeline {name!r} raised {type(exc).__name__}: {exc}") from exc
    info = write_output(pipeline, output, out_path)
    return {"pipeline": pipeline.name, "device": str(pipeline.device), **info, "wall_seconds": round(seconds, 4)}
