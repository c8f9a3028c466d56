"""Optional MLflow tracking for rank 0: the resolved config and hyperparameters as params, every epoch's
metrics, at the end the final metrics per class (`class/<id>_<name>/mAP50-95` ...), and the plots and
best.pt as artefacts.

Active only when MLFLOW_TRACKING_URI is set and `mlflow` imports (`mlflow-skinny` is enough; SageMaker managed
MLflow takes the tracking server's ARN as the URI and needs the `sagemaker-mlflow` plugin too). The run is
named after the SageMaker training job (`--run-name`, passed by sagemaker/driver.py), the experiment is
MLFLOW_EXPERIMENT_NAME or "yolov5-smddp". Tracking never fails or stops training: the first failure is logged
as ONE warning naming the step, and nothing more is sent for that run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("yolov5_smddp.mlflow")

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
DEFAULT_EXPERIMENT = "yolov5-smddp"
MAX_PARAM_CHARS = 6000
"""MLflow's limit on a param value (longer values are cut, ending in "...")."""
PARAMS_PER_BATCH = 100
"""MLflow's limit on params in one log_batch call."""
METRICS_PER_BATCH = 1000
"""MLflow's limit on metrics in one log_batch call."""
PLOT_SUFFIXES = (".png", ".jpg", ".jpeg")


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{"epochs": 3, "hyp": {"lr0": 0.01}} -> {"epochs": "3", "hyp.lr0": "0.01"}: nested mappings become
    dotted keys, lists JSON, None "None"; every value at most MAX_PARAM_CHARS."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_params(value, f"{name}."))
            continue
        text = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
        if len(text) > MAX_PARAM_CHARS:
            text = text[: MAX_PARAM_CHARS - 3] + "..."
        out[name] = text
    return out


def epoch_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of an epoch's results row, "epoch" left out (it is the step)."""
    out = {}
    for key, value in row.items():
        if key == "epoch" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


PER_CLASS_VALUES = ("precision", "recall", "mAP50", "mAP50-95", "images", "instances")


def per_class_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The final per-class rows (`DetectionMetrics.per_class`) as MLflow metrics: `class/<id>_<name>/<value>`
    for each of PER_CLASS_VALUES; characters MLflow does not allow in a key become "_" (the id keeps two
    names that read the same apart)."""
    out = {}
    for row in rows:
        name = re.sub(r"[^A-Za-z0-9_\-. ]", "_", str(row["name"]))
        for value in PER_CLASS_VALUES:
            out[f"class/{int(row['class'])}_{name}/{value}"] = float(row[value])
    return out


def artefacts(output_dir: Path, model_dir: Path) -> list[tuple[Path, str]]:
    """(file, artefact folder) to upload at the end: the plots in output_dir, then model_dir/best.pt."""
    found: list[tuple[Path, str]] = []
    if output_dir.is_dir():
        plots = sorted(p for p in output_dir.iterdir() if p.is_file() and p.suffix.lower() in PLOT_SUFFIXES)
        found += [(p, "plots") for p in plots]
    best = model_dir / "best.pt"
    if best.is_file():
        found.append((best, "model"))
    return found


class MlflowRun:
    """One MLflow run on rank 0. Every method swallows failures (one warning per run)."""

    def __init__(self, client: Any, run_id: str, metric_class: type) -> None:
        self._client = client
        self._metric = metric_class
        self.run_id = run_id

    def _failed(self, step: str, exc: BaseException) -> None:
        log.warning(
            "MLflow: %s failed (%s: %s); training goes on without MLflow", step, type(exc).__name__, exc
        )
        self._client = None

    def log_epoch(self, epoch: int, row: Mapping[str, Any]) -> None:
        if self._client is None:
            return
        stamp = int(time.time() * 1000)
        metrics = [self._metric(key, value, stamp, epoch) for key, value in epoch_metrics(row).items()]
        try:
            self._client.log_batch(self.run_id, metrics=metrics)
        except Exception as exc:  # a tracking problem must never stop training
            self._failed(f"logging epoch {epoch}", exc)

    def log_per_class(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """The final validation's per-class rows at `step` (the epochs trained)."""
        if self._client is None:
            return
        stamp = int(time.time() * 1000)
        metrics = [self._metric(k, v, stamp, step) for k, v in per_class_metrics(rows).items()]
        try:
            for i in range(0, len(metrics), METRICS_PER_BATCH):
                self._client.log_batch(self.run_id, metrics=metrics[i : i + METRICS_PER_BATCH])
        except Exception as exc:
            self._failed("logging the per-class metrics", exc)

    def finish(self, output_dir: Path, model_dir: Path, *, interrupted: bool = False) -> None:
        if self._client is None:
            return
        try:
            for path, folder in artefacts(Path(output_dir), Path(model_dir)):
                self._client.log_artifact(self.run_id, str(path), folder)
            self._client.set_terminated(self.run_id, "KILLED" if interrupted else "FINISHED")
        except Exception as exc:
            self._failed("uploading the artefacts", exc)


def start(
    params: Mapping[str, Any], *, run_name: str | None, environ: Mapping[str, str] | None = None
) -> MlflowRun | None:
    """A new MLflow run holding `params`, or None when MLflow is not configured or cannot be reached."""
    environ = os.environ if environ is None else environ
    uri = environ.get(TRACKING_URI_ENV)
    if not uri:
        return None
    try:  # optional dependency, imported only when asked for (importing mlflow takes a while)
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        log.warning(
            "MLflow: %s is set but mlflow cannot be imported (%s); install mlflow-skinny "
            "(and sagemaker-mlflow for a SageMaker MLflow ARN). Training goes on without MLflow",
            TRACKING_URI_ENV,
            exc,
        )
        return None
    experiment = environ.get(EXPERIMENT_ENV) or DEFAULT_EXPERIMENT
    try:
        client = MlflowClient(tracking_uri=uri)
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else _create_experiment(client, experiment)
        run = client.create_run(experiment_id, run_name=run_name or None)
        flat = sorted(flatten_params(params).items())
        for i in range(0, len(flat), PARAMS_PER_BATCH):
            chunk = flat[i : i + PARAMS_PER_BATCH]
            client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in chunk])
    except Exception as exc:
        log.warning(
            "MLflow: starting a run in experiment %r failed (%s: %s); training goes on without MLflow",
            experiment,
            type(exc).__name__,
            exc,
        )
        return None
    log.info("MLflow: run %s (%s) in experiment %r", run.info.run_id, run.info.run_name, experiment)
    return MlflowRun(client, run.info.run_id, Metric)


def _create_experiment(client: Any, name: str) -> str:
    """Create the experiment; another job may have created it meanwhile, then use that one."""
    try:
        return client.create_experiment(name)
    except Exception:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id
