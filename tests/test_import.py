"""Importing mixprec does nothing: no torch flag moves, no probe, no heavy imports."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import json, sys, torch
from torch import backends as b
def state():
    return [torch.get_float32_matmul_precision(), b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32,
            getattr(b, "fp32_precision", None), str(torch.get_default_dtype()), torch.get_num_threads()]
before = state()
import mixprec, mixprec.pipelines
after = state()
heavy = sorted(m for m in ("transformers", "diffusers", "gradio", "platformdirs") if m in sys.modules)
print(json.dumps({"before": before, "after": after, "heavy": heavy}))
"""


def test_import_is_side_effect_free(tmp_path):
    env = {"MIXPREC_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "MIXPREC_FLOAT32_MATMUL_PRECISION": "medium"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, check=True)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["before"] == data["after"]
    assert data["heavy"] == []
    assert list(tmp_path.iterdir()) == []  # no probe result was written


PUBLIC_API = r"""
import importlib, json, pkgutil, sys
import mixprec

def describe():
    out = {}
    for name in mixprec.__all__:
        obj = getattr(mixprec, name)
        out[name] = f"{type(obj).__name__}:{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', ''))}"
    return out

before = describe()
skipped = []
for info in pkgutil.walk_packages(mixprec.__path__, "mixprec."):
    try:
        importlib.import_module(info.name)
    except ImportError as exc:  # an optional extra that is not installed
        skipped.append(f"{info.name}: {exc}")
print(json.dumps({"before": before, "after": describe(), "skipped": skipped}))
"""


def test_every_public_name_survives_importing_every_submodule():
    """``mixprec.tune`` / ``numerics`` / ``profile`` / ``guard`` are functions; no sub-package may shadow them."""
    out = subprocess.run([sys.executable, "-c", PUBLIC_API], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["before"] == data["after"]
    kinds = {name: desc.split(":")[0] for name, desc in data["after"].items()}
    assert {kinds[n] for n in ("tune", "numerics", "profile", "guard", "apply", "init", "preset")} == {"function"}
    assert kinds["hardware"] == kinds["presets"] == "module"
    defined_here = [d.split(":")[1] for d in data["after"].values() if d.split(":")[0] in ("function", "type", "ABCMeta")]
    assert defined_here and all(d.startswith("mixprec.") for d in defined_here)
