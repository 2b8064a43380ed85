"""describe_all() and run_to_file()."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mixprec import pipelines


def test_run_to_file_wav(tmp_path):
    import soundfile

    path = tmp_path / "speech.wav"
    info = pipelines.run_to_file("tts", path, seed=0, size="test")
    assert info["path"] == str(path) and info["sample_rate"] == 24000
    assert info["wall_seconds"] > 0 and "seconds" not in info  # how long the run took, named as such
    meta = soundfile.info(str(path))
    assert meta.samplerate == 24000 and meta.channels == 1 and meta.subtype == "PCM_16"
    assert meta.frames == info["shape"][1]
    assert info["audio_seconds"] == pytest.approx(meta.frames / 24000, abs=1e-4)  # the audio's own length
    data, rate = soundfile.read(str(path))
    assert rate == 24000 and np.abs(data).max() > 0


def test_run_to_file_png(tmp_path):
    from PIL import Image

    path = tmp_path / "out" / "image.png"
    info = pipelines.run_to_file("diffusion", path, seed=1, batch=2, size="test")
    assert info["shape"][0] == 2
    with Image.open(path) as image:
        assert image.format == "PNG" and image.mode == "RGB"
        assert list(image.size) == info["image_size"]


def test_run_to_file_embeddings(tmp_path):
    info = pipelines.run_to_file("minilm", tmp_path / "emb.npy", batch=3, size="test", device="cpu")
    assert np.load(tmp_path / "emb.npy").shape == (3, 384) == tuple(info["shape"])
    assert info["device"] == "cpu"  # where it was built and run
    pipelines.run_to_file("minilm", tmp_path / "emb.json", batch=2, size="test")
    payload = json.loads((tmp_path / "emb.json").read_text())
    assert len(payload["embeddings"]) == 2 and len(payload["sentences"]) == 2


def test_run_to_file_rejects_bad_extension_and_args(tmp_path):
    with pytest.raises(ValueError, match=r"'\.png' is not one of \.wav"):
        pipelines.run_to_file("tts", tmp_path / "speech.png", size="test")
    with pytest.raises(ValueError, match=r"\.json, \.npy, \.png, \.wav"):
        pipelines.run_to_file("tts", tmp_path / "speech.mp3", size="test")
    with pytest.raises(ValueError, match="batch"):
        pipelines.run_to_file("tts", tmp_path / "speech.wav", batch=0, size="test")
    with pytest.raises(pipelines.UnknownPipelineError):
        pipelines.run_to_file("nope", tmp_path / "x.wav")
    assert not list(tmp_path.iterdir())


def test_describe_all():
    rows = {row["name"]: row for row in pipelines.describe_all(size="test")}
    assert {"tts", "diffusion", "minilm"} <= set(rows)
    tts = rows["tts"]
    assert tts["output_kind"] == "audio" and tts["sample_rate"] == 24000
    assert list(tts["components"]) == ["ve", "t3_cond", "t3", "s3gen", "vocoder"]
    assert tts["total"] == sum(tts["components"].values())
    assert rows["minilm"]["total"] == 22_713_216
    assert rows["diffusion"]["output_kind"] == "image"
