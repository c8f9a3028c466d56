"""The SageMaker entry without a distribution on one host with two workers: the driver parses the
hyperparameters once and its elastic launcher starts two workers, each handed that TrainConfig as one
JSON word (`python -m yolov5_smddp.launch --config-json ...`). The model folder records what the workers
trained: the driver's rebased data.yaml, the job's folders and its name as the run name."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from child_env import REPO, child_env, free_port

from yolov5_smddp.data.synthetic import make_default_dataset

pytestmark = pytest.mark.slow


def test_two_elastic_workers_train_the_drivers_config(tmp_path: Path):
    base = tmp_path / "ml"
    config = base / "input" / "config"
    config.mkdir(parents=True)
    # no resourceconfig.json: one host named as this machine, so the rendezvous address resolves
    (config / "hyperparameters.json").write_text("{}")
    (config / "inputdataconfig.json").write_text(json.dumps({"training": {"TrainingInputMode": "File"}}))
    make_default_dataset(base / "input" / "data" / "training", n_train=8, n_val=4, imgsz=64, seed=3)
    env = {**child_env(), "SAGEMAKER_BASE_DIR": str(base), "SM_NUM_GPUS": "0", "TRAINING_JOB_NAME": "job-42"}
    hyperparameters = [
        "--epochs",
        "1",
        "--imgsz",
        "64",
        "--batch-size",
        "4",
        "--workers",
        "0",
        "--cfg",
        "yolov5n",
    ]
    hyperparameters += [
        "--noplots",
        "--backend",
        "gloo",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
    ]
    proc = subprocess.run(
        [sys.executable, str(REPO / "entrypoint.py"), *hyperparameters],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "launch: elastic, 1 host(s) x 2 worker(s)" in log and "world_size=2" in log, log[-4000:]
    recorded = json.loads((base / "model" / "config.json").read_text())["train_config"]
    assert recorded["data"] != str(
        base / "input" / "data" / "training" / "data.yaml"
    )  # rebased by the driver
    assert Path(recorded["data"]).name == "data.yaml" and Path(recorded["data"]).is_file()
    assert (recorded["run_name"], recorded["epochs"], recorded["imgsz"], recorded["cfg"]) == (
        "job-42",
        1,
        64,
        "yolov5n",
    )
    assert (recorded["model_dir"], recorded["checkpoint_dir"]) == (
        str(base / "model"),
        str(base / "checkpoints"),
    )
    assert (base / "model" / "best.pt").is_file() and (base / "checkpoints" / "last.pt").is_file()
