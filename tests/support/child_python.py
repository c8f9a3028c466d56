"""A Python snippet run in a child process with this checkout on PYTHONPATH: for what could hang, crash
or blow up the memory of the test process itself (the hostile-input tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_python(code: str, *args: str | Path, timeout: float | None = None) -> subprocess.CompletedProcess:
    """`python -c code args...` with stdout/stderr captured as text; TimeoutExpired after `timeout` s."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-c", code, *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
