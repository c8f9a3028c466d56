"""What a run reports: results.csv and JSON files, TensorBoard, the per-epoch results row and metric
line, the final per-class table, and the model folder written after the last epoch (or a SIGTERM).

Outputs: `model_dir/best.pt` (the best EMA weights in our format, float16), `model_dir/config.json`
(resolved config and hyperparameters), `model_dir/metrics.json` (final metrics and throughput),
`model_dir/best.torchscript` (+ `best.onnx`) and `model_dir/code/inference.py` (see serving);
`output_dir/results.csv` (one row per epoch) and the plots (see plots; not with --noplots).
"""

from __future__ import annotations

import csv
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from yolov5_smddp import plots
from yolov5_smddp.detection.metrics import DetectionMetrics, results_table
from yolov5_smddp.files.atomic import atomic_write
from yolov5_smddp.models.weights import save_weights
from yolov5_smddp.models.wrappers import unwrap
from yolov5_smddp.serving import write_handler, write_serving_files
from yolov5_smddp.telemetry import emit, metric_line, peak_memory_gb
from yolov5_smddp.train import checkpoint, mlflow_log
from yolov5_smddp.train.engine import EpochResult

if TYPE_CHECKING:
    from yolov5_smddp.train.run_state import EpochsOutcome, Run

log = logging.getLogger("yolov5_smddp")

RESULT_COLUMNS = (
    "epoch",
    "box_loss",
    "obj_loss",
    "cls_loss",
    "precision",
    "recall",
    "mAP50",
    "mAP50-95",
    "fitness",
    "lr_bias",
    "lr_weight",
    "lr_norm",
    "samples_per_sec",
    "data_wait",
    "epoch_seconds",
)


def write_results_csv(path: Path, rows: list[dict[str, float]]) -> None:
    with atomic_write(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=RESULT_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in RESULT_COLUMNS})


def write_json(path: Path, obj: Any) -> None:
    with atomic_write(path, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def open_tensorboard(folder: Path | None):
    """A SummaryWriter for `folder`, or None without a folder or without the tensorboard package."""
    if folder is None:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        log.warning("--tensorboard-dir %s ignored: the tensorboard package is not installed", folder)
        return None
    return SummaryWriter(str(folder))


def report_per_class(
    metrics: DetectionMetrics, names: list[str], epochs: int, tracking: mlflow_log.MlflowRun | None
) -> None:
    """The final results table in the log, a row per class (as the release prints it after training),
    and the per-class values in MLflow at step `epochs`."""
    log.info("final validation (best.pt unless cut short):\n%s", results_table(metrics, names))
    if tracking is not None:
        tracking.log_per_class(epochs, metrics.per_class(names))


def epoch_row(
    epoch: int, result: EpochResult, metrics: DetectionMetrics | None, lrs: dict[str, float], seconds: float
) -> dict[str, float]:
    """The results row of `epoch` (1-based): losses, learning rates per group (`lrs`), throughput, the
    epoch's seconds, and the validation metrics when it validated."""
    row = {
        "epoch": epoch,
        "box_loss": result.losses[0],
        "obj_loss": result.losses[1],
        "cls_loss": result.losses[2],
        "lr_bias": lrs["bias"],
        "lr_weight": lrs["weight"],
        "lr_norm": lrs["norm"],
        "samples_per_sec": result.throughput["samples_per_sec"],
        "data_wait": result.throughput["data_wait"],
        "epoch_seconds": seconds,
    }
    if metrics is not None:
        row.update(metrics.to_dict())
    return row


def emit_epoch_line(row: dict[str, float], result: EpochResult, *, epochs: int, device: torch.device) -> None:
    """The epoch's metric line (telemetry) from its results `row`, of `epochs` in all."""
    emit(
        metric_line(
            epoch=row["epoch"],
            epochs=epochs,
            **{k: v for k, v in row.items() if k != "epoch"},
            samples_per_sec_per_gpu=result.throughput["samples_per_sec_per_gpu"],
            peak_mem_gb=peak_memory_gb(device),
        ),
        main=True,
    )


def write_epoch_outputs(
    output_dir: Path,
    history: list[dict[str, float]],
    names: list[str],
    *,
    noplots: bool,
    recorder: plots.ValidationPlots | None,
    board,
    tracking: mlflow_log.MlflowRun | None,
) -> None:
    """After rank 0 ended an epoch (the last row of `history`): results.csv, the plots (results.png; the
    validation plots from `recorder`, None when the epoch did not validate), TensorBoard, MLflow."""
    row = history[-1]
    epoch = row["epoch"]
    write_results_csv(output_dir / "results.csv", history)
    if not noplots:
        plots.after_epoch(output_dir, history, recorder, names)
    if board is not None:
        for key, value in row.items():
            board.add_scalar(key, value, epoch)
        if not noplots:
            plots.add_to_tensorboard(board, output_dir, epoch)
        board.flush()
    if tracking is not None:
        tracking.log_epoch(epoch, row)


def write_final_outputs(
    run: Run,
    state: checkpoint.RunState,
    outcome: EpochsOutcome,
    started: float,
    time_left: Callable[[], float | None] | None = None,
) -> None:
    """model_dir after the last epoch and after a SIGTERM alike, the cheap files first: best.pt (the best
    checkpoint's EMA weights; the current EMA when no validation has improved yet; float16, our format),
    code/inference.py, config.json (resolved config), metrics.json, then the exports (best.torchscript,
    best.onnx) while `time_left()` (seconds until SIGKILL after a SIGTERM) allows."""
    config, info, dirs, ema = run.config, run.info, run.dirs, run.stack.ema
    best_path = dirs.checkpoint_dir / checkpoint.BEST
    weights_from = "last"
    if best_path.is_file():
        ema.load_state_dict(checkpoint.load_checkpoint(best_path)["ema"])
        weights_from = "best"
    meta = {"train_config": config.to_dict(), "hyp": run.hyp.to_dict(), "epochs_trained": len(state.history)}
    save_weights(dirs.model_dir / "best.pt", ema.module, meta=meta, half=True)
    write_handler(dirs.model_dir)
    write_json(
        dirs.model_dir / "config.json",
        {
            "train_config": config.to_dict(),
            "hyp": run.hyp.to_dict(),
            "names": list(unwrap(run.model).names),
            "world_size": info.world_size,
        },
    )
    summary = metrics_summary(
        run, state, outcome, wall_seconds=time.perf_counter() - started, weights_from=weights_from
    )
    write_json(dirs.model_dir / "metrics.json", summary)
    # best.torchscript (+ best.onnx): seconds of CPU work, while the other ranks wait in the final barrier
    # (its timeout is --dist-timeout, 1800 s by default); after a SIGTERM only while the window allows
    write_serving_files(dirs.model_dir, ema.module, config.imgsz, time_left=time_left)
    if outcome.stopped is not None:
        log.info(
            "model folder written after the SIGTERM %s: %s (best.pt: %s weights)",
            outcome.stopped,
            dirs.model_dir,
            weights_from,
        )
    log.info("%s: %s", "done" if outcome.stopped is None else "stopped", json.dumps(summary["final"]))


def metrics_summary(
    run: Run, state: checkpoint.RunState, outcome: EpochsOutcome, *, wall_seconds: float, weights_from: str
) -> dict[str, Any]:
    """metrics.json: the final metrics (overall and per class), the best epoch's row, the epochs, the
    mean throughput over the epochs (all ranks, per GPU, data wait) and peak memory, the wall time,
    where best.pt's weights come from ("best" checkpoint or "last" EMA) and whether a SIGTERM stopped
    the run (where)."""
    info, dirs = run.info, run.dirs
    history, throughputs = state.history, outcome.throughputs
    best_row = max((r for r in history if "fitness" in r), key=lambda r: r["fitness"], default=None)
    rates = [t["samples_per_sec"] for t in throughputs]
    summary = {
        "final": outcome.final_metrics.to_dict() if outcome.final_metrics is not None else None,
        "per_class": (
            outcome.final_metrics.per_class(list(unwrap(run.model).names))
            if outcome.final_metrics is not None
            else None
        ),
        "best": best_row,
        "epochs": len(history),
        "world_size": info.world_size,
        "throughput": {
            "samples_per_sec": float(np.mean(rates)) if rates else None,
            "samples_per_sec_per_gpu": float(np.mean(rates)) / info.world_size if rates else None,
            "data_wait": float(np.mean([t["data_wait"] for t in throughputs])) if throughputs else None,
            "peak_mem_gb": peak_memory_gb(run.device),
        },
        "wall_seconds": wall_seconds,
        "weights": str(dirs.model_dir / "best.pt"),
        "weights_precision": "float16",
        "weights_from": weights_from,
        "interrupted": outcome.stopped is not None,
        "stopped": outcome.stopped,
    }
    return summary
