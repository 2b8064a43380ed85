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
