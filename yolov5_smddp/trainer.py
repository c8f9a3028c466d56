"""The training loop, top to bottom: decide (batch split, backend, precision) → data (scanned on every
rank before the process group exists, so no rank waits in a collective while another scans) → process
group → model, EMA, optimizer groups → resume → epochs (train, validate on rank 0 with the EMA,
checkpoint, early stop agreed by broadcast) → final outputs on rank 0.

Outputs: `checkpoint_dir/{last,best}.pt` (training checkpoints, see checkpoint.py);
`model_dir/best.pt` (the best EMA weights in our format, float16), `model_dir/config.json` (resolved
config and hyperparameters), `model_dir/metrics.json` (final metrics and throughput);
`output_dir/results.csv` (one row per epoch).
"""

from __future__ import annotations

import csv
import json
import logging
import os
import random
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from yolov5_smddp import checkpoint, distributed, mlflow_log
from yolov5_smddp.atomic import atomic_write
from yolov5_smddp.config import TrainConfig, load_hyp, plan_batch
from yolov5_smddp.ema import ModelEMA, unwrap
from yolov5_smddp.engine import TrainStep, evaluate, resolve_amp, step_settings, train_one_epoch
from yolov5_smddp.errors import ConfigError, WeightsError
from yolov5_smddp.metrics import DetectionMetrics
from yolov5_smddp.telemetry import emit, metric_line, peak_memory_gb

log = logging.getLogger("yolov5_smddp")

NOMINAL_BATCH = 64
MIN_WARMUP_ITERS = 100
EXIT_INTERRUPTED = 143  # 128 + SIGTERM: checkpoint written, run again to resume
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


# ------------------------------------------------------------------------------------------ building


def build_optimizer(
    model: nn.Module, name: str, lr: float, momentum: float, weight_decay: float
) -> torch.optim.Optimizer:
    """Three parameter groups named for the schedule: "weight" (conv/linear weights, with decay),
    "norm" (normalisation weights, no decay) and "bias" (all biases, no decay). Frozen parameters are left out."""
    weights, norms, biases = [], [], []
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            if pname == "bias":
                biases.append(p)
            elif isinstance(module, nn.modules.batchnorm._NormBase | nn.GroupNorm | nn.LayerNorm):
                norms.append(p)
            else:
                weights.append(p)
    groups = [
        {"params": biases, "name": "bias", "weight_decay": 0.0},
        {"params": weights, "name": "weight", "weight_decay": weight_decay},
        {"params": norms, "name": "norm", "weight_decay": 0.0},
    ]
    if name == "SGD":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True)
    if name == "Adam":
        return torch.optim.Adam(groups, lr=lr, betas=(momentum, 0.999))
    return torch.optim.AdamW(groups, lr=lr, betas=(momentum, 0.999))


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """DDP as the trainer uses it: default buckets (1 MiB first, then 25 MiB, which the scaling model
    follows) and gradients that live in the all-reduce buckets (one gradient copy fewer per step, less
    memory)."""
    return nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True
    )


def freeze_layers(model: nn.Module, layers: list[int]) -> int:
    """Stop gradients for every parameter of the listed top-level layers (`model.{i}.`); returns the count."""
    prefixes = tuple(f"model.{i}." for i in layers)
    frozen = 0
    for pname, p in model.named_parameters():
        if prefixes and pname.startswith(prefixes):
            p.requires_grad_(False)
            frozen += 1
    return frozen


def accumulation(global_batch: int) -> int:
    """Micro-steps per optimizer step so that each step sees about the nominal batch of 64."""
    return max(round(NOMINAL_BATCH / global_batch), 1)


def default_dataset(cache_dir: Path) -> Path:
    """The embedded dataset under `cache_dir` (never an output folder: SageMaker would upload it):
    generated once, in a temporary folder renamed into place, so concurrent ranks never see a
    half-written dataset (the first rename wins; it is deterministic). The folder name carries the
    generator's version, so a cache kept between jobs (warm pool) never serves an older dataset."""
    from yolov5_smddp.data.synthetic import DATASET_VERSION, make_default_dataset

    name = f"default-dataset-v{DATASET_VERSION}"
    final = cache_dir / name
    if not (final / "data.yaml").is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=cache_dir))
        make_default_dataset(tmp)
        try:
            os.rename(tmp, final)
        except OSError:  # another rank's copy landed first
            shutil.rmtree(tmp, ignore_errors=True)
    return final / "data.yaml"


@dataclass
class DataBundle:
    names: list[str]
    nc: int
    train_index: Any
    val_index: Any


def scan_data(config: TrainConfig, cache_dir: Path) -> DataBundle:
    """Resolve data.yaml (or the embedded dataset) and index train and val labels (every rank does this)."""
    from yolov5_smddp.data.config import load_data_config
    from yolov5_smddp.data.labels import build_label_index

    data_yaml = Path(config.data) if config.data else default_dataset(cache_dir)
    data = load_data_config(data_yaml)
    workers = max(1, min(os.cpu_count() or 1, 16))
    scan = {
        "nc": data.nc,
        "root": data.root,
        "cache_dir": cache_dir,
        "workers": workers,
        "max_pixels": config.max_image_pixels,
    }
    train_index = build_label_index(data.train, **scan)
    val_index = build_label_index(data.val, **scan)
    return DataBundle(list(data.names), data.nc, train_index, val_index)


def build_loaders(config: TrainConfig, bundle: DataBundle, hyp: dict, per_rank: int, info, stride: int):
    """Train loader for this rank; val loader on rank 0 only (None elsewhere). DataError when the
    training set cannot fill one batch per rank."""
    from yolov5_smddp.data.dataset import YoloDataset
    from yolov5_smddp.data.loader import build_dataloader, check_batch_fits, num_workers_per_rank

    check_batch_fits(len(bundle.train_index.images), per_rank, info.world_size)
    workers = num_workers_per_rank(os.cpu_count() or 1, info.local_world_size, per_rank, config.workers)
    train_set = YoloDataset(
        bundle.train_index,
        config.imgsz,
        augment=True,
        hyp=hyp,
        rect=config.rect,
        batch_size=per_rank,
        stride=stride,
        cache_images=config.cache,
        seed=config.seed,
    )
    train_loader = build_dataloader(
        train_set,
        batch_size=per_rank,
        rank=info.rank,
        world_size=info.world_size,
        workers=workers,
        shuffle=not config.rect,
        seed=config.seed,
        drop_last=True,
    )
    val_loader = None
    if info.rank == 0:
        val_batch = per_rank * 2
        val_set = YoloDataset(
            bundle.val_index,
            config.imgsz,
            augment=False,
            hyp=hyp,
            rect=True,
            batch_size=val_batch,
            stride=stride,
            pad=0.5,
        )
        val_loader = build_dataloader(
            val_set,
            batch_size=val_batch,
            rank=0,
            world_size=1,
            workers=workers,
            shuffle=False,
            seed=config.seed,
            drop_last=False,
        )
    return train_loader, val_loader, workers


def load_initial_weights(model: nn.Module, path: str) -> None:
    from yolov5_smddp.models.weights import load_weights, transfer_state

    loaded = load_weights(path)
    report = transfer_state(model, loaded.state_dict, exclude=("anchors",))
    if report.loaded == 0:
        raise WeightsError(f"--weights {path}: no tensor matches the model (different architecture?)")
    log.info(
        "weights %s: %d tensors loaded, %d skipped (shape), %d missing",
        path,
        report.loaded,
        len(report.skipped_shape),
        len(report.missing),
    )


# ------------------------------------------------------------------------------------------ outputs


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


class _StopOnSigterm:
    """SIGTERM (spot interruption, StopTrainingJob: SIGKILL follows 120 s later) sets a flag; the loop
    finishes its step, writes a checkpoint and returns."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def __enter__(self) -> _StopOnSigterm:
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread: no handler
            self._previous = None
        return self

    def _handle(self, signum, frame) -> None:
        if not self.requested:
            print(
                "SIGTERM received: finishing the current step, then writing a checkpoint and exiting",
                flush=True,
            )
        self.requested = True

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


# ------------------------------------------------------------------------------------------ the run


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def train(config: TrainConfig, info: distributed.DistInfo, dirs: dict[str, Path]) -> int:
    """Run (or resume) a training job on this rank; returns 0, or EXIT_INTERRUPTED after SIGTERM."""
    started = time.perf_counter()
    main = info.rank == 0

    # -- decisions: every config problem fails here, before any work
    hyp = load_hyp(config.hyp, config.hyp_overrides)
    plan = plan_batch(config.batch_size, config.batch_per_gpu, info.world_size)
    cuda = torch.cuda.is_available()
    wants_smddp = config.backend == "smddp" or (config.backend == "auto" and cuda)
    backend = distributed.choose_backend(
        config.backend, cuda, distributed.smddp_importable() if wants_smddp else False
    )
    device_type = "cuda" if cuda and backend in ("nccl", "smddp") else "cpu"
    amp = resolve_amp(config.amp, device_type, cuda and torch.cuda.is_bf16_supported())
    if config.compile and device_type == "cpu" and not (shutil.which("g++") or shutil.which("c++")):
        raise ConfigError("--compile on CPU needs a C++ compiler (g++) for torch inductor; none is installed")
    from yolov5_smddp.models.yolo import load_model_config

    load_model_config(config.cfg)  # a bad --cfg fails now, not after the data scan
    if config.weights and not Path(config.weights).is_file():
        raise ConfigError(f"--weights {config.weights}: no such file")
    accumulate = accumulation(plan.global_batch)
    hyp["weight_decay"] *= plan.global_batch * accumulate / NOMINAL_BATCH

    # -- data: scanned on every rank BEFORE the process group exists
    bundle = scan_data(config, dirs["cache_dir"])

    # -- process group and device
    device = distributed.init(info, backend, config.dist_timeout)
    seed_everything(config.seed + info.rank)
    if main:
        log.info(
            "backend=%s world_size=%d global_batch=%d per_rank=%d accumulate=%d amp=%s device=%s",
            backend,
            info.world_size,
            plan.global_batch,
            plan.per_rank,
            accumulate,
            amp.mode,
            device,
        )

    # -- model, loss, EMA, optimizer
    from yolov5_smddp.loss import YoloLoss, scale_loss_gains
    from yolov5_smddp.models.yolo import build_model

    model = build_model(config.cfg, nc=bundle.nc)
    model.names = bundle.names
    if config.weights:
        load_initial_weights(model, config.weights)
    freeze_layers(model, config.freeze)
    model.to(device)
    if config.channels_last:
        model.to(memory_format=torch.channels_last)
    nl = model.detect.nl
    loss_hyp = {
        **scale_loss_gains(hyp, nl, bundle.nc, config.imgsz),
        "label_smoothing": config.label_smoothing,
    }
    criterion = YoloLoss(model, loss_hyp)
    ema = ModelEMA(model)
    optimizer = build_optimizer(model, config.optimizer, hyp["lr0"], hyp["momentum"], hyp["weight_decay"])
    scaler = amp.make_scaler()

    # -- resume from checkpoint_dir/last.pt
    start_epoch, iteration, last_opt, best_fitness, stale, history = 0, 0, -1, -1.0, 0, []
    resumable = checkpoint.find_resumable(dirs["checkpoint_dir"])
    if resumable is not None:
        state = checkpoint.load_checkpoint(resumable)
        try:
            model.load_state_dict(state["model"])
            ema.load_state_dict(state["ema"])
            optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise WeightsError(
                f"checkpoint {resumable} does not fit this model/optimizer ({exc}); "
                f"use another --checkpoint-dir or delete it"
            ) from exc
        scaler.load_state_dict(state["scaler"])
        start_epoch, iteration = int(state["epoch"]), int(state["iteration"])
        last_opt = iteration - 1
        best_fitness, stale, history = (
            float(state["best_fitness"]),
            int(state["stale_epochs"]),
            list(state["history"]),
        )
        if main and state.get("rng") is not None:
            checkpoint.restore_rng_state(state["rng"])
        if main:
            log.info(
                "resuming from %s at epoch %d (iteration %d, trained on %d rank(s), now %d)",
                resumable,
                start_epoch + 1,
                iteration,
                int(state["world_size"]),
                info.world_size,
            )

    # every rank must resume from the same point (a checkpoint folder that is not shared or synced to
    # every node would silently desynchronise optimizer states)
    agreed = distributed.broadcast_object((start_epoch, iteration))
    if tuple(agreed) != (start_epoch, iteration):
        raise WeightsError(
            f"rank {info.rank} would resume at epoch {start_epoch + 1} but rank 0 at epoch {agreed[0] + 1}: "
            f"--checkpoint-dir {dirs['checkpoint_dir']} must hold the same last.pt on every node"
        )
    if config.sync_bn and info.world_size > 1 and device.type == "cuda":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    net: nn.Module = model
    if info.distributed:
        net = wrap_ddp(model, device)
    if config.compile:
        net = torch.compile(net)
    step = TrainStep(
        net,
        criterion,
        optimizer,
        scaler,
        ema,
        amp,
        device,
        loss_multiplier=float(info.world_size) if info.distributed else 1.0,
        channels_last=config.channels_last,
        inject_nonfinite_step=config.inject_nonfinite_step,
    )

    train_loader, val_loader, workers = build_loaders(
        config, bundle, hyp, plan.per_rank, info, int(model.stride.max())
    )
    batches = len(train_loader)
    warmup_iters = max(round(hyp["warmup_epochs"] * batches), MIN_WARMUP_ITERS)
    if main:
        log.info(
            "%d train images, %d batches/epoch per rank, %d val images, %d loader workers/rank, warmup %d iterations",
            len(bundle.train_index.images),
            batches,
            len(bundle.val_index.images),
            workers,
            warmup_iters,
        )

    def settings_for(epoch: int):
        return lambda it: step_settings(
            it,
            epoch,
            epochs=config.epochs,
            warmup_iters=warmup_iters,
            hyp=hyp,
            cosine=config.cos_lr,
            nominal_accumulate=accumulate,
        )

    def checkpoint_state(next_epoch: int, next_iteration: int) -> dict[str, Any]:
        return {
            "model": unwrap(model).state_dict(),
            "ema": ema.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(),
            "schedule": {
                "kind": "cosine" if config.cos_lr else "linear",
                "warmup_iters": warmup_iters,
                "accumulate": accumulate,
            },
            "epoch": next_epoch,
            "iteration": next_iteration,
            "best_fitness": best_fitness,
            "stale_epochs": stale,
            "history": history,
            "rng": checkpoint.capture_rng_state(),
            "config": config.to_dict(),
            "hyp": hyp,
            "world_size": info.world_size,
            "global_batch": plan.global_batch,
        }

    # -- the epochs
    final_metrics: DetectionMetrics | None = None
    throughputs: list[dict[str, float]] = []
    interrupted = False
    board = open_tensorboard(dirs.get("tensorboard_dir")) if main else None
    tracking = mlflow_log.start({**config.to_dict(), "hyp": hyp}, run_name=config.run_name) if main else None
    with _StopOnSigterm() as stop:
        for epoch in range(start_epoch, config.epochs):
            epoch_started = time.perf_counter()
            train_loader.sampler.set_epoch(epoch)
            epoch_first_iteration = iteration
            result = train_one_epoch(
                step,
                train_loader,
                epoch=epoch,
                first_iteration=iteration,
                last_optimizer_iteration=last_opt,
                settings_for=settings_for(epoch),
                log_every=config.log_every,
                max_nonfinite_steps=config.max_nonfinite_steps,
                imgsz=config.imgsz,
                multi_scale=config.multi_scale,
                stop_requested=lambda: stop.requested,
                main=main,
                world_size=info.world_size,
            )
            iteration, last_opt = iteration + result.iterations, result.last_optimizer_iteration
            if result.stopped:
                # restart this epoch on resume (same learning rates as an uninterrupted run)
                if main:
                    checkpoint.save_checkpoint(
                        dirs["checkpoint_dir"], checkpoint_state(epoch, epoch_first_iteration)
                    )
                    print(
                        f"interrupted in epoch {epoch + 1}: checkpoint {dirs['checkpoint_dir'] / checkpoint.LAST} "
                        f"written; run the same command again to resume",
                        flush=True,
                    )
                interrupted = True
                break
            throughputs.append(result.throughput)
            lrs = {g["name"]: g["lr"] for g in optimizer.param_groups}
            # -- validate on rank 0 with the EMA weights; the others wait in the broadcast below
            metrics = None
            last_epoch = epoch + 1 == config.epochs
            if main and val_loader is not None and (not config.noval or last_epoch):
                metrics = evaluate(
                    ema.module,
                    val_loader,
                    device=device,
                    amp=amp,
                    conf_thres=config.val_conf,
                    iou_thres=config.val_iou,
                    max_det=config.max_det,
                    should_stop=lambda: stop.requested,
                )  # None when SIGTERM cut it short
            improved = False
            if main:
                fit = metrics.fitness if metrics is not None else -1.0
                improved = metrics is not None and fit > best_fitness
                if improved:
                    best_fitness, stale = fit, 0
                elif metrics is not None:
                    stale += 1
                row = {
                    "epoch": epoch + 1,
                    "box_loss": result.losses[0],
                    "obj_loss": result.losses[1],
                    "cls_loss": result.losses[2],
                    "lr_bias": lrs["bias"],
                    "lr_weight": lrs["weight"],
                    "lr_norm": lrs["norm"],
                    "samples_per_sec": result.throughput["samples_per_sec"],
                    "data_wait": result.throughput["data_wait"],
                    "epoch_seconds": time.perf_counter() - epoch_started,
                }
                if metrics is not None:
                    row.update(metrics.to_dict())
                    final_metrics = metrics
                history.append(row)
                emit(
                    metric_line(
                        epoch=epoch + 1,
                        epochs=config.epochs,
                        **{k: v for k, v in row.items() if k != "epoch"},
                        samples_per_sec_per_gpu=result.throughput["samples_per_sec_per_gpu"],
                        peak_mem_gb=peak_memory_gb(device),
                    ),
                    main=True,
                )
                checkpoint.save_checkpoint(
                    dirs["checkpoint_dir"], checkpoint_state(epoch + 1, iteration), best=improved
                )
                write_results_csv(dirs["output_dir"] / "results.csv", history)
                if tracking is not None:
                    tracking.log_epoch(epoch + 1, row)
                if board is not None:
                    for key, value in row.items():
                        board.add_scalar(key, value, epoch + 1)
                    board.flush()
            # rank 0 decides for everyone: early stop, or SIGTERM seen during validation
            stop_early = main and config.patience > 0 and stale >= config.patience
            stop_early, sigterm = distributed.broadcast_object((stop_early, main and stop.requested))
            if sigterm and epoch + 1 < config.epochs:
                if main:
                    print(
                        f"interrupted after epoch {epoch + 1}: checkpoint {dirs['checkpoint_dir'] / checkpoint.LAST} "
                        f"written; run the same command again to resume",
                        flush=True,
                    )
                interrupted = True
                break
            if stop_early:
                if main:
                    log.info("early stop: no fitness improvement for %d epochs", config.patience)
                break

    if board is not None:
        board.close()
    if main and not interrupted:
        write_final_outputs(
            config, hyp, model, ema, dirs, history, final_metrics, throughputs, info, started, device
        )
    if tracking is not None:
        tracking.finish(dirs["output_dir"], dirs["model_dir"], interrupted=interrupted)
    distributed.barrier()
    return EXIT_INTERRUPTED if interrupted else 0


def write_final_outputs(
    config, hyp, model, ema, dirs, history, final_metrics, throughputs, info, started, device
) -> None:
    """best EMA weights (float16, our format), resolved config and metrics.json in model_dir."""
    from yolov5_smddp.models.weights import save_weights

    best_path = dirs["checkpoint_dir"] / checkpoint.BEST
    if best_path.is_file():
        ema.load_state_dict(checkpoint.load_checkpoint(best_path)["ema"])
    meta = {"train_config": config.to_dict(), "hyp": hyp, "epochs_trained": len(history)}
    save_weights(dirs["model_dir"] / "best.pt", ema.module, meta=meta, half=True)
    write_json(
        dirs["model_dir"] / "config.json",
        {
            "train_config": config.to_dict(),
            "hyp": hyp,
            "names": list(unwrap(model).names),
            "world_size": info.world_size,
        },
    )
    best_row = max((r for r in history if "fitness" in r), key=lambda r: r["fitness"], default=None)
    rates = [t["samples_per_sec"] for t in throughputs]
    summary = {
        "final": final_metrics.to_dict() if final_metrics is not None else None,
        "best": best_row,
        "epochs": len(history),
        "world_size": info.world_size,
        "throughput": {
            "samples_per_sec": float(np.mean(rates)) if rates else None,
            "samples_per_sec_per_gpu": float(np.mean(rates)) / info.world_size if rates else None,
            "data_wait": float(np.mean([t["data_wait"] for t in throughputs])) if throughputs else None,
            "peak_mem_gb": peak_memory_gb(device),
        },
        "wall_seconds": time.perf_counter() - started,
        "weights": str(dirs["model_dir"] / "best.pt"),
        "weights_precision": "float16",
    }
    write_json(dirs["model_dir"] / "metrics.json", summary)
    log.info("done: %s", json.dumps(summary["final"]))
