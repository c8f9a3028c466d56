"""A job started in Pipe input mode anyway (not through our builders): its channel arrives as a FIFO
(`training_0`), and the job ends with a failure reason that names Pipe mode and File/FastFile."""

from __future__ import annotations

import json
import os
from pathlib import Path

from yolov5_smddp.sagemaker import main
from yolov5_smddp.sagemaker.dataset import channel_not_a_folder


def _pipe_job(base: Path) -> Path:
    config = base / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    (config / "hyperparameters.json").write_text("{}")
    (config / "inputdataconfig.json").write_text(json.dumps({"training": {"TrainingInputMode": "Pipe"}}))
    data = base / "input" / "data"
    data.mkdir(parents=True)
    os.mkfifo(data / "training_0")  # what SageMaker gives a Pipe channel: no folder, a FIFO per epoch
    return base


def test_a_pipe_channel_ends_the_job_naming_pipe_mode_and_what_to_use(tmp_path: Path):
    base = _pipe_job(tmp_path)
    code = main(["--epochs", "1", "--cfg", "yolov5n"], environ={"SAGEMAKER_BASE_DIR": str(base)})
    assert code == 2
    first = (base / "output" / "failure").read_text().splitlines()[0]
    assert "training channel" in first and "Pipe input mode" in first and "training_0" in first
    assert "'FastFile'" in first and "'File'" in first
    assert not (base / "model").exists()


def test_a_channel_that_is_simply_missing_keeps_the_mount_hint(tmp_path: Path):
    assert channel_not_a_folder("validation", tmp_path / "validation") == (
        f"validation channel {tmp_path / 'validation'} is not a folder (is the channel mounted?)"
    )
