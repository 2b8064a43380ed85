"""Keep torchaudio's compiled library out when it cannot load with the installed torch.

torchaudio's wheels are built for one torch release each. The newest on the index
(2.11.0) ships ``lib/_torchaudio.abi3.so``, which raises ``OSError: Could not load this
library`` under torch 2.13; since transformers imports torchaudio when it is present,
that breaks ``import transformers`` users such as Chatterbox's T3. The pure-Python
parts Chatterbox needs (``compliance.kaldi.fbank``, ``transforms.Resample``) work
without the library, and torchaudio imports cleanly when the library files are absent.

This script tries ``import torchaudio`` in a fresh interpreter; only if that fails with
the library-loading error does it remove the compiled files. It is idempotent.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path


def main() -> int:
    spec = importlib.util.find_spec("torchaudio")
    if spec is None or spec.origin is None:
        print("torchaudio is not installed; nothing to do")
        return 0
    probe = subprocess.run([sys.executable, "-c", "import torchaudio"], capture_output=True, text=True)
    if probe.returncode == 0:
        print("torchaudio imports cleanly; left as installed")
        return 0
    if "Could not load this library" not in probe.stderr:
        sys.stderr.write(probe.stderr)
        print("torchaudio fails to import for another reason; not touching it", file=sys.stderr)
        return 1
    lib = Path(spec.origin).parent / "lib"
    removed = sorted(p.name for p in lib.glob("*.so"))
    for name in removed:
        (lib / name).unlink()
    check = subprocess.run([sys.executable, "-c", "import torchaudio.compliance.kaldi"], capture_output=True, text=True)
    if check.returncode != 0:
        sys.stderr.write(check.stderr)
        return 1
    print(f"torchaudio's compiled library does not load with this torch; removed {', '.join(removed)} (pure-Python parts kept)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
