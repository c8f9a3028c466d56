"""docker/entry.py on SageMaker: container arguments (ContainerArguments) beside a SageMaker config are
refused with a failure reason and exit 2, not dropped with a warning while the job trains on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENTRY = REPO / "docker" / "entry.py"


def _run(base: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "SAGEMAKER_BASE_DIR": str(base),
        "YOLOV5_SMDDP_BASE_ENTRYPOINT": str(base / "no-base-entrypoint"),
    }
    env.pop("YOLOV5_SMDDP_OWNER", None)
    return subprocess.run(
        [sys.executable, str(ENTRY), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("args", [["train", "--epochs", "3"], ["--epochs", "3"]])
def test_container_arguments_beside_a_sagemaker_config_are_refused(tmp_path: Path, args):
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text('{"current_host": "algo-1", "hosts": ["algo-1"]}')
    done = _run(tmp_path, args)
    assert done.returncode == 2, done.stderr
    failure = (tmp_path / "output" / "failure").read_text().splitlines()[0]
    assert "['--epochs', '3'] (ContainerArguments)" in failure and "pass them as hyperparameters" in failure
    assert [line for line in done.stderr.splitlines() if line.startswith("error: ")] == [f"error: {failure}"]


def test_plain_train_beside_a_sagemaker_config_goes_on(tmp_path: Path):
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text('{"current_host": "algo-1", "hosts": ["algo-1"]}')
    done = _run(tmp_path, ["true"])  # no base entrypoint: the command itself runs
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "output" / "failure").exists()
