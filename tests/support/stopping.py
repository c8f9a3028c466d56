"""What the stop tests share: start a job, act (SIGTERM) when a given log line appears, and the file list
of the model folder a stopped job leaves (tests/integration and tests/docker)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


def first_export() -> str:
    """The model folder's first export where the tests run: "pt2" on torch >= 2.10, else "torchscript"
    (serving.serving_formats()[0]; imported here, not at the top: tests/docker use this module without torch)."""
    from yolov5_smddp.serving import serving_formats

    return serving_formats()[0]


def stopped_model_files(first_export: str) -> list[str]:
    """The model folder of a job stopped by SIGTERM with time to spare (more than 30 s of the 120 s left):
    the weights, both exports, the serving handler, the run's config and its metrics (interrupted).
    `first_export`: `first_export()` where the job ran in this process's torch, "torchscript" for the
    container tests' SMDDP stand-in."""
    return sorted(
        ["best.onnx", "best.pt", f"best.{first_export}", "code/inference.py", "config.json", "metrics.json"]
    )


def model_files(model_dir: Path) -> list[str]:
    """Every file under `model_dir`, relative and sorted."""
    return sorted(str(p.relative_to(model_dir)) for p in model_dir.rglob("*") if p.is_file())


def sigterm(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)


def run_until(
    cmd: Sequence[str],
    when: Callable[[str], bool],
    then: Callable[[subprocess.Popen], None] = sigterm,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
) -> tuple[int, str]:
    """Run `cmd` (stdout and stderr merged), call `then(proc)` (default: SIGTERM) at the first output line
    for which `when(line)` holds, then wait up to `timeout` s for the exit. Returns (exit code, the whole
    output). A line that never comes leaves the job to end by itself (the caller's asserts then say so)."""
    proc = subprocess.Popen(
        list(cmd),
        env=dict(env) if env is not None else None,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if when(line):
            then(proc)
            break
    rest, _ = proc.communicate(timeout=timeout)
    return proc.returncode, "".join(seen) + rest
