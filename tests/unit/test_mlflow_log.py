"""yolov5_smddp.train.mlflow_log: the pure parts value by value, then a REAL MLflow (mlflow-skinny, in the test image)
with a local file store, read back with MlflowClient: params, metric history per epoch, artefacts, run name;
and tracking failures that warn once and never raise."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from yolov5_smddp.train import mlflow_log
from yolov5_smddp.train.mlflow_log import artefacts, epoch_metrics, flatten_params, per_class_metrics


def test_params_are_flattened_to_strings():
    params = {
        "cfg": "yolov5n",
        "epochs": 3,
        "freeze": [0, 1],
        "weights": None,
        "hyp_overrides": {},
        "hyp": {"lr0": 0.01, "mosaic": 1.0},
        "noval": False,
    }
    assert flatten_params(params) == {
        "cfg": "yolov5n",
        "epochs": "3",
        "freeze": "[0, 1]",
        "weights": "None",
        "hyp.lr0": "0.01",
        "hyp.mosaic": "1.0",
        "noval": "False",
    }
    long = flatten_params({"data": "x" * 7000})["data"]
    assert len(long) == mlflow_log.MAX_PARAM_CHARS and long.endswith("...")


def test_epoch_metrics_are_the_finite_numbers_without_the_epoch():
    row = {"epoch": 2, "box_loss": 0.05, "mAP50-95": 0.3125, "lr_bias": 0.001, "precision": math.nan}
    row.update(fitness=math.inf, note="text", flag=True, samples=12)
    assert epoch_metrics(row) == {"box_loss": 0.05, "mAP50-95": 0.3125, "lr_bias": 0.001, "samples": 12.0}


def test_per_class_rows_become_named_metrics():
    rows = [
        {"class": 0, "name": "person", "images": 3, "instances": 5, "precision": 0.5, "recall": 0.25,
         "mAP50": 0.75, "mAP50-95": 0.375},
        {"class": 7, "name": "traffic light (red)?", "images": 1, "instances": 1, "precision": 1.0,
         "recall": 1.0, "mAP50": 1.0, "mAP50-95": 0.5},
    ]  # fmt: skip
    got = per_class_metrics(rows)
    assert got["class/0_person/mAP50-95"] == 0.375 and got["class/0_person/instances"] == 5.0
    assert got["class/0_person/images"] == 3.0 and got["class/0_person/recall"] == 0.25
    assert got["class/7_traffic light _red__/precision"] == 1.0
    assert len(got) == 12


def test_artefacts_are_the_plots_then_best_pt(tmp_path: Path):
    out, model = tmp_path / "out", tmp_path / "model"
    out.mkdir()
    model.mkdir()
    for name in ("results.png", "labels.JPG", "results.csv", "a.jpeg"):
        (out / name).write_bytes(b"x")
    (out / "sub").mkdir()
    (out / "sub" / "deep.png").write_bytes(b"x")
    assert artefacts(out, model) == [
        (out / "a.jpeg", "plots"),
        (out / "labels.JPG", "plots"),
        (out / "results.png", "plots"),
    ]
    (model / "best.pt").write_bytes(b"x")
    assert artefacts(out, model)[-1] == (model / "best.pt", "model")
    assert artefacts(tmp_path / "missing", model) == [(model / "best.pt", "model")]


def test_nothing_happens_without_a_tracking_uri(caplog):
    with caplog.at_level(logging.WARNING):
        assert mlflow_log.start({"epochs": 1}, run_name="job", environ={}) is None
    assert caplog.records == []


# ---- a real MLflow -------------------------------------------------------------------------------------


@pytest.fixture
def mlflow_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A local file store. MLflow 3.7+ refuses new file stores unless MLFLOW_ALLOW_FILE_STORE=true (it wants a
    database; mlflow-skinny has no SQLAlchemy)."""
    pytest.importorskip(
        "mlflow", reason="mlflow-skinny is not installed (docker/test.Dockerfile installs it)"
    )
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return (tmp_path / "mlruns").as_uri()


def test_a_run_is_logged_and_read_back(mlflow_store: str, tmp_path: Path, caplog):
    from mlflow.tracking import MlflowClient

    environ = {"MLFLOW_TRACKING_URI": mlflow_store, "MLFLOW_EXPERIMENT_NAME": "issue-16"}
    params = {"cfg": "yolov5n", "epochs": 2, "hyp": {"lr0": 0.01, "mosaic": 1.0}, "weights": None}
    with caplog.at_level(logging.WARNING):
        run = mlflow_log.start(params, run_name="yolov5-smddp-2026-12-03-07-00-00-123", environ=environ)
        assert run is not None
        run.log_epoch(1, {"epoch": 1, "box_loss": 0.08, "mAP50-95": 0.125, "precision": math.nan})
        run.log_epoch(2, {"epoch": 2, "box_loss": 0.06, "mAP50-95": 0.25, "precision": 0.5})
        row = {"class": 1, "name": "car", "images": 2, "instances": 3, "precision": 0.5, "recall": 1.0}
        run.log_per_class(2, [{**row, "mAP50": 0.75, "mAP50-95": 0.5}])
        out, model = tmp_path / "out", tmp_path / "model"
        out.mkdir()
        model.mkdir()
        (out / "results.png").write_bytes(b"\x89PNG fake")
        (model / "best.pt").write_bytes(b"PK weights")
        run.finish(out, model)
    assert [r for r in caplog.records if r.name.startswith("yolov5_smddp")] == []

    client = MlflowClient(tracking_uri=mlflow_store)
    got = client.get_run(run.run_id)
    assert got.info.run_name == "yolov5-smddp-2026-12-03-07-00-00-123"
    assert got.info.status == "FINISHED"
    assert client.get_experiment(got.info.experiment_id).name == "issue-16"
    assert got.data.params == {
        "cfg": "yolov5n",
        "epochs": "2",
        "hyp.lr0": "0.01",
        "hyp.mosaic": "1.0",
        "weights": "None",
    }
    history = client.get_metric_history(run.run_id, "mAP50-95")
    assert [(m.step, m.value) for m in history] == [(1, 0.125), (2, 0.25)]
    assert [(m.step, m.value) for m in client.get_metric_history(run.run_id, "precision")] == [(2, 0.5)]
    assert got.data.metrics["class/1_car/mAP50-95"] == 0.5 and got.data.metrics["class/1_car/instances"] == 3
    assert [a.path for a in client.list_artifacts(run.run_id)] == ["model", "plots"]
    assert [a.path for a in client.list_artifacts(run.run_id, "plots")] == ["plots/results.png"]
    best = Path(client.download_artifacts(run.run_id, "model/best.pt", str(tmp_path / "dl")))
    assert best.read_bytes() == b"PK weights"


def test_a_second_job_reuses_the_experiment(mlflow_store: str):
    from mlflow.tracking import MlflowClient

    environ = {"MLFLOW_TRACKING_URI": mlflow_store}
    first = mlflow_log.start({"epochs": 1}, run_name="job-a", environ=environ)
    second = mlflow_log.start({"epochs": 1}, run_name=None, environ=environ)
    client = MlflowClient(tracking_uri=mlflow_store)
    a, b = client.get_run(first.run_id), client.get_run(second.run_id)
    assert a.info.experiment_id == b.info.experiment_id
    assert client.get_experiment(a.info.experiment_id).name == mlflow_log.DEFAULT_EXPERIMENT
    assert a.info.run_name == "job-a" and b.info.run_name  # MLflow names an unnamed run itself


def test_an_unusable_store_is_one_warning_and_no_run(tmp_path: Path, mlflow_store: str, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store's folder would go")
    with caplog.at_level(logging.WARNING):
        assert (
            mlflow_log.start({"epochs": 1}, run_name="j", environ={"MLFLOW_TRACKING_URI": blocker.as_uri()})
            is None
        )
    warnings = [r.getMessage() for r in caplog.records if r.name == "yolov5_smddp.mlflow"]
    assert len(warnings) == 1 and warnings[0].startswith(
        "MLflow: starting a run in experiment 'yolov5-smddp' failed"
    )
    assert "training goes on without MLflow" in warnings[0]


def test_a_failure_mid_run_warns_once_and_stops_sending(
    mlflow_store: str, tmp_path: Path, caplog, monkeypatch
):
    run = mlflow_log.start({"epochs": 3}, run_name="j", environ={"MLFLOW_TRACKING_URI": mlflow_store})
    calls = []

    def broken(*args, **kwargs):
        calls.append(args)
        raise ConnectionError("tracking server went away")

    monkeypatch.setattr(run._client, "log_batch", broken)
    monkeypatch.setattr(run._client, "log_artifact", broken)
    with caplog.at_level(logging.WARNING):
        run.log_epoch(1, {"box_loss": 0.1})
        run.log_epoch(2, {"box_loss": 0.1})
        run.finish(tmp_path, tmp_path)
    warnings = [r.getMessage() for r in caplog.records if r.name == "yolov5_smddp.mlflow"]
    assert warnings == [
        "MLflow: logging epoch 1 failed (ConnectionError: tracking server went away); "
        "training goes on without MLflow"
    ]
    assert len(calls) == 1


def test_without_mlflow_installed_a_set_uri_is_one_warning(monkeypatch, caplog):
    import builtins

    real_import = builtins.__import__

    def no_mlflow(name, *args, **kwargs):
        if name == "mlflow" or name.startswith("mlflow."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mlflow)
    with caplog.at_level(logging.WARNING):
        assert (
            mlflow_log.start({}, run_name="j", environ={"MLFLOW_TRACKING_URI": "http://mlflow:5000"}) is None
        )
    (record,) = [r for r in caplog.records if r.name == "yolov5_smddp.mlflow"]
    assert "MLFLOW_TRACKING_URI is set but mlflow cannot be imported" in record.getMessage()
    assert "mlflow-skinny" in record.getMessage()


@pytest.mark.slow
def test_a_training_run_logs_to_mlflow(mlflow_store: str, tmp_path: Path):
    """The trainer's wiring: `yolov5-smddp train` (2 epochs, the embedded dataset) in a subprocess, read back."""
    import os
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "OMPI_"))}
    env.update(MLFLOW_TRACKING_URI=mlflow_store, MLFLOW_ALLOW_FILE_STORE="true", OMP_NUM_THREADS="1")
    command = [
        sys.executable,
        "-m",
        "yolov5_smddp",
        "train",
        "--cfg",
        "yolov5n",
        "--epochs",
        "2",
        "--imgsz",
        "64",
    ]
    command += [
        "--batch-size",
        "8",
        "--workers",
        "0",
        "--run-name",
        "sm-job-42",
        "--hyp-override",
        "lr0=0.02",
    ]
    for name in ("model", "output", "checkpoint", "cache"):
        command += [f"--{name}-dir", str(out / name)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]

    client = MlflowClient(tracking_uri=mlflow_store)
    experiment = client.get_experiment_by_name(mlflow_log.DEFAULT_EXPERIMENT)
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "sm-job-42" and run.info.status == "FINISHED"
    assert run.data.params["cfg"] == "yolov5n" and run.data.params["epochs"] == "2"
    assert run.data.params["hyp.lr0"] == "0.02" and run.data.params["run_name"] == "sm-job-42"
    history = client.get_metric_history(run.info.run_id, "mAP50-95")
    assert [m.step for m in history] == [1, 2]
    csv_rows = (out / "output" / "results.csv").read_text().splitlines()
    assert len(csv_rows) == 3  # header + 2 epochs: the same epochs as MLflow's history
    artefact_paths = [a.path for a in client.list_artifacts(run.info.run_id, "model")]
    assert artefact_paths == ["model/best.pt"]
    assert "MLflow:" not in done.stderr.replace("MLflow: run ", "")  # no warning
    per_class = {k: v for k, v in run.data.metrics.items() if k.startswith("class/")}
    assert per_class and all(k.split("/")[-1] in mlflow_log.PER_CLASS_VALUES for k in per_class)


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        ([], {"TRAINING_JOB_NAME": "yolov5-2026-12-03-07-10-00-001"}, ["yolov5-2026-12-03-07-10-00-001"]),
        (["--run-name", "mine"], {"TRAINING_JOB_NAME": "job-7"}, ["mine"]),
        ([], {}, []),
    ],
)
def test_the_sagemaker_job_name_becomes_the_run_name(tmp_path: Path, monkeypatch, argv, environ, expected):
    """sagemaker/env.py (the only reader of the job's environment) reads TRAINING_JOB_NAME; the driver passes it
    as --run-name unless the hyperparameters set one."""
    from yolov5_smddp.sagemaker import driver
    from yolov5_smddp.sagemaker.env import read_environment

    environ = {"SAGEMAKER_BASE_DIR": str(tmp_path), **environ}
    assert read_environment(environ).job_name == environ.get("TRAINING_JOB_NAME")
    seen: list[str | None] = []
    monkeypatch.setattr(driver, "run_config", lambda config, info: seen.append(config.run_name) or 0)
    assert driver.main(["--epochs", "1", *argv], environ=environ) == 0
    assert seen == (expected or [None])
