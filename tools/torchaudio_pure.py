"""Keep torchaudio's compiled library out when it cannot load with the installed torch.

torchaudio's wheels are built for one torch release each. The newest on the index
(2.11.0) ships ``lib/_torchaudio.abi3.so``, which raises ``OSError: Could not load this
library`` under torch 2.13, and ``OSError: ...: undefined symbol: aoti_torch_abi_version``
under torch 2.6 (the side venv of ``make test-torch TORCH=2.6.0``); since transformers
imports torchaudio when it is present, that breaks ``import transformers`` users such as
Chatterbox's T3. The pure-Python parts Chatterbox needs (``compliance.kaldi.fbank``,
``transforms.Resample``, ``functional.resample``) work without the library, and
torchaudio imports cleanly when the library files are absent.

This script tries ``import torchaudio`` in a fresh interpreter; only if that fails with
a library-loading error does it remove the compiled files. It is idempotent.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path


def library_failed(stderr: str, lib: Path) -> bool:
    """Whether ``import torchaudio`` failed loading its compiled library (built for another torch)."""
    lines = stderr.strip().splitlines()
    last = lines[-1] if lines else ""
    return "Could not load this library" in stderr or (last.startswith("OSError:") and str(lib) in last)


def main() -> int:
    spec = importlib.util.find_spec("torchaudio")
    if spec is None or spec.origin is None:
        print("torchaudio is not installed; nothing to do")
        return 0
    probe = subprocess.run([sys.executable, "-c", "import torchaudio"], capture_output=True, text=True)
    if probe.returncode == 0:
        print("torchaudio imports cleanly; left as installed")
        return 0
    lib = Path(spec.origin).parent / "lib"
    if not library_failed(probe.stderr, lib):
        sys.stderr.write(probe.stderr)
        print("torchaudio fails to import for another reason; not touching it", file=sys.stderr)
        return 1
    removed = sorted(p.name for p in lib.glob("*.so"))
    for name in removed:
        (lib / name).unlink()
    check = subprocess.run([sys.executable, "-c", "import torchaudio.compliance.kaldi, torchaudio.transforms, torchaudio.functional"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        sys.stderr.write(check.stderr)
        return 1
    print(f"torchaudio's compiled library does not load with this torch; removed {', '.join(removed)} (pure-Python parts kept)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
