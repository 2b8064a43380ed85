"""Workers started from a plain script, without ``if __name__ == "__main__":``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from executor_helpers import echo
from mixprec.measure.executor import LocalProcessExecutor

print("module level ran", flush=True)
worker = LocalProcessExecutor().start(echo, {{"name": "plain"}})
print(worker.request("ping", 42, timeout=60), flush=True)
worker.request("stop", timeout=60)
worker.close()
"""


def test_a_script_without_a_main_guard_starts_workers_that_do_not_run_it_again(tmp_path):
    script = tmp_path / "plain_script.py"
    script.write_text(SCRIPT.format(tests=str(TESTS)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert "{'command': 'ping', 'payload': 42, 'job': 'plain'}" in done.stdout
    assert done.stdout.count("module level ran") == 1  # the workers never ran the script
