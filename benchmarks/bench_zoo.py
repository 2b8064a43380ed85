"""Each preset's speed against fp32 on real third-party apps, in one run.

The apps of the real-code tests, at sizes where timing means something: diffusers'
``StableAudioPipeline`` (a 4-layer DiT of width 256 over an Oobleck VAE, 8 steps with
guidance), Vocos at its released 24 kHz mel configuration (8 ConvNeXt layers of 512,
decoding 4 s) and, where it is installed, ACE-Step (``examples/acestep_music.py`` at its
default size). Seeded random weights; nothing is downloaded.

For every round, each configuration is applied, timed on one run and reverted, in turn
(interleaved, so a busy moment of a shared machine hits them all); the ratio fp32 time /
configuration time is taken within the round. The table gives the median ratio over the
rounds and its range, and whether the configuration was measurably slower than fp32
(every round slower).

Usage:
    HF_HUB_OFFLINE=1 python benchmarks/bench_zoo.py [--rounds 7] [--apps stable_audio,vocos,acestep] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from _report import finish

import mixprec
from mixprec import hardware

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("quality", "balanced", "fast", "memory")


def stable_audio() -> tuple[Any, Callable[[], Any]]:
    from diffusers import AutoencoderOobleck, EDMDPMSolverMultistepScheduler, StableAudioDiTModel, StableAudioPipeline
    from diffusers.pipelines.stable_audio import StableAudioProjectionModel
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    prompt = "a calm piano melody with soft strings"
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(prompt.split())}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                        model_max_length=32)
    torch.manual_seed(0)
    pipe = StableAudioPipeline(
        vae=AutoencoderOobleck(encoder_hidden_size=32, downsampling_ratios=[2, 4, 4, 8], channel_multiples=[1, 2, 4, 8],
                               decoder_channels=32, decoder_input_channels=16, audio_channels=2, sampling_rate=16000),
        text_encoder=T5EncoderModel(T5Config(vocab_size=len(vocab), d_model=128, d_kv=32, d_ff=512, num_layers=2,
                                             num_heads=4)),
        projection_model=StableAudioProjectionModel(text_encoder_dim=128, conditioning_dim=128, min_value=0, max_value=64),
        tokenizer=tokenizer,
        transformer=StableAudioDiTModel(sample_size=256, in_channels=16, num_layers=4, attention_head_dim=32,
                                        num_attention_heads=8, num_key_value_attention_heads=4, out_channels=16,
                                        cross_attention_dim=128, time_proj_dim=64, global_states_input_dim=256,
                                        cross_attention_input_dim=128),
        scheduler=EDMDPMSolverMultistepScheduler(solver_order=2, prediction_type="v_prediction", sigma_data=1.0,
                                                 sigma_schedule="exponential"))
    pipe.set_progress_bar_config(disable=True)

    def run():
        return pipe(prompt, negative_prompt="rain", num_inference_steps=8, audio_end_in_s=4.0, guidance_scale=3.0,
                    generator=torch.Generator().manual_seed(0), output_type="pt").audios

    return pipe, run


def vocos() -> tuple[Any, Callable[[], Any]]:
    from vocos import Vocos
    from vocos.feature_extractors import MelSpectrogramFeatures
    from vocos.heads import ISTFTHead
    from vocos.models import VocosBackbone

    torch.manual_seed(0)
    model = Vocos(MelSpectrogramFeatures(sample_rate=24000, n_fft=1024, hop_length=256, n_mels=100, padding="center"),
                  VocosBackbone(input_channels=100, dim=512, intermediate_dim=1536, num_layers=8),
                  ISTFTHead(dim=512, n_fft=1024, hop_length=256, padding="center")).eval()
    with torch.no_grad():
        mel = model.feature_extractor(torch.randn(1, 4 * 24000, generator=torch.Generator().manual_seed(1)) * 0.1)
    return model, lambda: model.decode(mel)


def acestep() -> tuple[Any, Callable[[], Any]]:
    sys.path.insert(0, str(ROOT / "examples"))
    import acestep_music

    pipe = acestep_music.pipeline(size="default", seed=0)
    inputs = pipe.example_inputs(1, 0)
    return pipe, lambda: pipe.run(inputs).output


APPS: dict[str, tuple[Callable[[], tuple[Any, Callable[[], Any]]], str | None]] = {
    "stable_audio": (stable_audio, "diffusers"), "vocos": (vocos, "vocos"), "acestep": (acestep, "acestep")}


def bench(target: Any, run: Callable[[], Any], rounds: int) -> dict[str, list[float]]:
    """Per configuration, the fp32 / configuration time ratio of every round."""
    times: dict[str, list[float]] = {name: [] for name in ("fp32", *CONFIGS)}
    with torch.no_grad():
        run()  # warm-up
        for round_index in range(rounds + 1):
            order = ("fp32", *CONFIGS) if round_index % 2 else (*reversed(CONFIGS), "fp32")
            for name in order:
                applied = mixprec.apply(target, mixprec.preset(name)) if name != "fp32" else None
                try:
                    if round_index == 0:
                        run()  # each configuration's own warm-up
                        continue
                    start = time.perf_counter()
                    run()
                    times[name].append(time.perf_counter() - start)
                finally:
                    if applied is not None:
                        applied.revert()
    return {name: [f / t for f, t in zip(times["fp32"], times[name])] for name in CONFIGS} | {"fp32": times["fp32"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", default=",".join(APPS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    hw = hardware.probe()
    fast16 = [d for d in ("bf16", "fp16") if hw.dtypes[d].klass == "fast"] or ["none"]
    lines = [f"$ HF_HUB_OFFLINE=1 python benchmarks/bench_zoo.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip(),
             "", f"device: {hw.device_type} ({hw.name}; CPU flags: {', '.join(hw.cpu_flags) or 'none of avx512*/amx*'}), "
             f"{hw.threads} threads, torch {torch.__version__}; 16-bit types the probe measured fast: {', '.join(fast16)}; "
             f"batch 1, {args.rounds} interleaved rounds after a warm-up", "",
             "| app | fp32, median | " + " | ".join(f"{c}: fp32 time / its time, median (min-max)" for c in CONFIGS)
             + " | slower than fp32 in every round |", "|---|---|" + "---|" * len(CONFIGS) + "---|"]
    for app in args.apps.split(","):
        build, module = APPS[app.strip()]
        if module and importlib.util.find_spec(module) is None:
            lines.append(f"| {app} | not installed | " + " | ".join("-" for _ in CONFIGS) + " | - |")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            target, run = build()
            ratios = bench(target, run, args.rounds)
        slower = [c for c in CONFIGS if max(ratios[c]) < 1.0]
        lines.append(f"| {app} | {statistics.median(ratios['fp32']) * 1e3:.0f} ms | "
                     + " | ".join(f"{statistics.median(ratios[c]):.2f}x ({min(ratios[c]):.2f}-{max(ratios[c]):.2f})"
                                  for c in CONFIGS) + f" | {', '.join(slower) or 'none'} |")
        print(lines[-1], flush=True)
    return finish(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
