"""The training loop, top to bottom: decide (batch split, backend, precision) → data (scanned on every
rank before the process group exists, so no rank waits in a collective while another scans) → process
group → model, EMA, optimizer groups → resume → epochs (train, validate the EMA — every rank its shard,
metrics on rank 0 — checkpoint, early stop agreed by broadcast) → best.pt re-validated (its numbers are
`final`) → final outputs on rank 0.

Outputs: `checkpoint_dir/{last,best}.pt` (training checkpoints, see checkpoint.py);
`model_dir/best.pt` (the best EMA weights in our format, float16), `model_dir/config.json` (resolved
config and hyperparameters), `model_dir/metrics.json` (final metrics and throughput),
`model_dir/best.torchscript` (+ `best.onnx`) and `model_dir/code/inference.py` (see serving);
`output_dir/results.csv` (one row per epoch) and the plots (see plots; not with --noplots).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import itertools
import json
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from yolov5_smddp import checkpoint, distributed, mlflow_log, plots
from yolov5_smddp.atomic import atomic_write, make_folder
from yolov5_smddp.budget import TimeBudget, counting_clock
from yolov5_smddp.config import (
    BatchPlan,
    OutputDirs,
    TrainConfig,
    check_freeze,
    load_hyp,
    plan_batch,
    resume_run,
    same_data,
    unused_hyp_warnings,
)
from yolov5_smddp.data.pixelcache import DiskPixelCache, check_space, entry_bytes
from yolov5_smddp.data.restart_cache import RestartCache, restart_cache_for
from yolov5_smddp.ema import ModelEMA, unwrap
from yolov5_smddp.engine import (
    NOMINAL_BATCH,
    AmpPolicy,
    EpochResult,
    TrainStep,
    accumulation,
    compile_plan,
    evaluate,
    resolve_amp,
    step_settings,
    train_one_epoch,
)
from yolov5_smddp.errors import EXIT_INTERRUPTED, ConfigError, WeightsError
from yolov5_smddp.loss import YoloLoss, scale_loss_gains
from yolov5_smddp.metrics import DetectionMetrics, results_table
from yolov5_smddp.models.autoanchor import AnchorCheck, autoanchor
from yolov5_smddp.models.initial import initial_model
from yolov5_smddp.models.weights import save_weights
from yolov5_smddp.models.yolo import load_model_config
from yolov5_smddp.runtime import apply_runtime, decide_runtime
from yolov5_smddp.serving import write_handler, write_serving_files
from yolov5_smddp.telemetry import emit, metric_line, peak_memory_gb
from yolov5_smddp.valshard import split_summary

log = logging.getLogger("yolov5_smddp")

MIN_WARMUP_ITERS = 100
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
    # fused: one kernel per group and device (engine.use_fused_kernels says why the step relies on it)
    if name == "SGD":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True, fused=True)
    if name == "Adam":
        return torch.optim.Adam(groups, lr=lr, betas=(momentum, 0.999), fused=True)
    return torch.optim.AdamW(groups, lr=lr, betas=(momentum, 0.999), fused=True)


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """DDP as the trainer uses it: default buckets (1 MiB first, then 25 MiB, which the scaling model
    follows) and gradients that live in the all-reduce buckets (one gradient copy fewer per step, less
    memory)."""
    return nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True
    )


def loss_multiplier(info: distributed.DistInfo) -> float:
    """The loss factor under DDP: the world size, cancelling DDP's gradient average over the ranks, so an
    optimizer step applies the sum of the per-batch gradients, as one process with the global batch does."""
    return float(info.world_size) if info.distributed else 1.0


def freeze_layers(model: nn.Module, layers: list[int]) -> int:
    """Stop gradients for every parameter of the listed top-level layers (`model.{i}.`); returns the count."""
    prefixes = tuple(f"model.{i}." for i in layers)
    frozen = 0
    for pname, p in model.named_parameters():
        if prefixes and pname.startswith(prefixes):
            p.requires_grad_(False)
            frozen += 1
    return frozen


def scale_weight_decay(hyp: dict[str, float], global_batch: int, accumulate: int) -> dict[str, float]:
    """A copy of `hyp` with weight_decay scaled by the images per optimizer step / the nominal 64."""
    return {**hyp, "weight_decay": hyp["weight_decay"] * global_batch * accumulate / NOMINAL_BATCH}


@dataclass
class TrainingStack:
    """What the steps of a run need besides the model and the data; the trainer and `bench train` build it
    with `build_training_stack`, so a benchmark times exactly what training runs."""

    hyp: dict[str, float]
    """the run's hyperparameters: weight_decay scaled to the global batch (as checkpoints record them)."""
    accumulate: int
    criterion: YoloLoss
    ema: ModelEMA
    optimizer: torch.optim.Optimizer
    scaler: Any


def build_training_stack(
    model: nn.Module,
    hyp: dict[str, float],
    *,
    nc: int,
    imgsz: int,
    global_batch: int,
    amp: AmpPolicy,
    optimizer: str = "SGD",
    label_smoothing: float = 0.0,
) -> TrainingStack:
    """Loss (gains scaled to layers, classes and image size; label smoothing), EMA, optimizer groups (weight
    decay scaled to the global batch and accumulation) and the AMP scaler for `model` (already on its device)."""
    accumulate = accumulation(global_batch)
    hyp = scale_weight_decay(hyp, global_batch, accumulate)
    loss_hyp = {**scale_loss_gains(hyp, model.detect.nl, nc, imgsz), "label_smoothing": label_smoothing}
    return TrainingStack(
        hyp=hyp,
        accumulate=accumulate,
        criterion=YoloLoss(model, loss_hyp),
        ema=ModelEMA(model),
        optimizer=build_optimizer(model, optimizer, hyp["lr0"], hyp["momentum"], hyp["weight_decay"]),
        scaler=amp.make_scaler(),
    )


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
    from yolov5_smddp.data.labels import build_label_index, scan_workers

    data_yaml = Path(config.data) if config.data else default_dataset(cache_dir)
    data = load_data_config(data_yaml, cache_dir=cache_dir)
    workers = scan_workers(os.cpu_count() or 1)
    scan = {
        "nc": data.nc,
        "root": data.root,
        "cache_dir": cache_dir,
        "workers": workers,
        "max_pixels": config.max_image_pixels,
    }
    train_index = build_label_index(data.train, image_dir=data.image_dirs.get("train"), **scan)
    val_index = build_label_index(data.val, image_dir=data.image_dirs.get("val"), **scan)
    if config.single_cls:  # the release's --single-cls: one class, named 'item' unless the dataset names it
        for index in (train_index, val_index):
            index.labels[:] = [
                np.concatenate((np.zeros_like(lab[:, :1]), lab[:, 1:]), 1) for lab in index.labels
            ]
            if index.crowd is not None:  # COCO crowd regions: class 0 too
                index.crowd[:] = [np.concatenate((np.zeros_like(c[:, :1]), c[:, 1:]), 1) for c in index.crowd]
        return DataBundle(list(data.names) if data.nc == 1 else ["item"], 1, train_index, val_index)
    return DataBundle(list(data.names), data.nc, train_index, val_index)


def disk_caches(
    config: TrainConfig, bundle: DataBundle, cache_dir: Path, *, main: bool
) -> tuple[DiskPixelCache | None, DiskPixelCache | None]:
    """With `--cache disk`: the train and val pixel caches under cache_dir/pixels (one resize rule each),
    after checking that the folder can hold them (DataError naming sizes and folder); else (None, None)."""
    if config.cache != "disk":
        return None, None
    from yolov5_smddp.data.dataset import resized_hw

    train = DiskPixelCache(cache_dir / "pixels", config.imgsz, augment=True)
    val = DiskPixelCache(cache_dir / "pixels", config.imgsz, augment=False)

    def need(index) -> int:
        shapes = np.asarray(index.shapes).reshape(-1, 2)
        return entry_bytes(resized_hw(shape, config.imgsz) for shape in shapes)

    caches = [(train, need(bundle.train_index))]
    if bundle.val_index is not None and len(bundle.val_index.images):
        caches.append((val, need(bundle.val_index)))
    line = check_space(caches)
    if main:
        log.info("%s", line)
    return train, val if len(caches) > 1 else None


def restart_cache(
    config: TrainConfig, bundle: DataBundle, cache_dir: Path, *, main: bool
) -> RestartCache | None:
    """With `--jpeg-restart-cache on` where tiles are region-decoded (mosaic with the release's sampling,
    no --cache): the restart-marker copies' cache under cache_dir, when its disk has room for them
    (data.restart_cache); else None. The main rank logs which."""
    if config.jpeg_restart_cache != "on" or config.cache is not None or config.mosaic_partners != "random":
        return None
    cache, line = restart_cache_for(cache_dir, list(bundle.train_index.images))
    if main:
        log.info("%s", line)
    return cache


def build_loaders(
    config: TrainConfig,
    bundle: DataBundle,
    hyp: dict,
    per_rank: int,
    info,
    stride: int,
    color_on_device: bool,
    cache_dir: Path,
):
    """Train loader for this rank; val loader over this rank's shard of whole val batches (see valshard).
    `color_on_device`: the train items leave HSV and flips to the device batch; `cache_dir`: where
    `--cache disk` keeps the decoded images. DataError when the training set cannot fill one batch per
    rank, or the cache folder cannot hold the decoded images."""
    from yolov5_smddp.data.dataset import YoloDataset
    from yolov5_smddp.data.loader import (
        build_dataloader,
        build_val_loader,
        check_batch_fits,
        num_workers_per_rank,
    )

    check_batch_fits(len(bundle.train_index.images), per_rank, info.world_size)
    workers = num_workers_per_rank(os.cpu_count() or 1, info.local_world_size, per_rank, config.workers)
    train_pixels, val_pixels = disk_caches(config, bundle, cache_dir, main=info.rank == 0)
    dataset_class = YoloDataset
    if config.loader == "gpu":  # issue 40: the workers read bytes, the device decodes and augments
        from yolov5_smddp.data.bytes_dataset import BytesDataset

        dataset_class = BytesDataset

    train_set = dataset_class(
        bundle.train_index,
        config.imgsz,
        augment=True,
        hyp=hyp,
        rect=config.rect,
        batch_size=per_rank,
        stride=stride,
        cache_images="ram" if config.cache == "ram" else None,  # disk: disk_cache
        mosaic_partners=config.mosaic_partners,
        seed=config.seed,
        color_on_device=color_on_device,
        disk_cache=train_pixels,
        restart_cache=restart_cache(config, bundle, cache_dir, main=info.rank == 0),
    )
    train_loader = build_dataloader(
        train_set,
        batch_size=per_rank,
        rank=info.rank,
        world_size=info.world_size,
        workers=workers,
        shuffle=not config.rect,
        seed=config.seed,
        drop_last=False,  # the release's: each epoch sees every image (last batch may be partial)
    )
    if config.loader == "gpu":  # batches assembled on the device (data.gpu_batch)
        from yolov5_smddp.data.gpu_batch import wrap_loader

        train_loader = wrap_loader(train_loader)
    # every rank validates its shard of whole batches
    val_batch = per_rank * 2
    val_loader = build_val_loader(
        bundle.val_index,
        config.imgsz,
        batch_size=val_batch,
        stride=stride,
        workers=workers,
        rank=info.rank,
        world_size=info.world_size,
        hyp=hyp,
        disk_cache=val_pixels,
    )
    if info.rank == 0:
        log.info("val: %s", split_summary(len(val_loader.dataset), val_batch, info.world_size))
    return train_loader, val_loader, workers


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


STOP_WINDOW_S = 120.0
"""SageMaker's SIGKILL follows its SIGTERM (StopTrainingJob, spot interruption, MaxRuntimeExceeded) after
this many seconds."""
STOP_WATCHDOG_S = 110.0
"""After a SIGTERM the run must have ended within this many seconds: a step blocked for good (a read
that never returns) would otherwise never reach its checkpoint, and outside SageMaker no SIGKILL comes."""


class _StopOnSigterm:
    """SIGTERM (spot interruption, StopTrainingJob, max_run: SIGKILL follows 120 s later) sets a flag; the
    loop finishes its step, writes a checkpoint, then the model folder (see `write_final_outputs`). A
    watchdog started by the signal ends the process with EXIT_INTERRUPTED when the run is still inside the
    block `watchdog_s` later (one line says so); leaving the block stops it."""

    def __init__(self, watchdog_s: float = STOP_WATCHDOG_S) -> None:
        self.requested = False
        self.signalled_at: float | None = None
        self._previous = None
        self._watchdog_s = watchdog_s
        self._watchdog: threading.Timer | None = None

    def time_left(self) -> float | None:
        """Seconds until SIGKILL after the SIGTERM (None before one)."""
        if self.signalled_at is None:
            return None
        return STOP_WINDOW_S - (time.monotonic() - self.signalled_at)

    def __enter__(self) -> _StopOnSigterm:
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread: no handler
            self._previous = None
        return self

    def _handle(self, signum, frame) -> None:
        if not self.requested:
            self.signalled_at = time.monotonic()
            print(
                "SIGTERM received: finishing the current step, then writing a checkpoint and the model "
                "folder and exiting",
                flush=True,
            )
            self._watchdog = threading.Timer(self._watchdog_s, self._give_up)
            self._watchdog.daemon = True
            self._watchdog.start()
        self.requested = True

    def _give_up(self) -> None:
        print(
            f"SIGTERM received {self._watchdog_s:g} s ago and the current step has not finished (blocked); "
            f"exiting with code {EXIT_INTERRUPTED} (a checkpoint written before, if any, resumes the run)",
            flush=True,
        )
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)

    def __exit__(self, *exc) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


# ------------------------------------------------------------------------------------------ the run


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass(frozen=True)
class Decisions:
    """What a run decides before any work (every config problem fails while deciding)."""

    hyp: dict[str, float]
    plan: BatchPlan
    backend: str
    device_type: str
    amp: AmpPolicy
    color_on_device: bool = False
    """HSV jitter and flips on the device batch (`--color-aug`), not in the loader workers."""


def decide(config: TrainConfig, info: distributed.DistInfo) -> Decisions:
    """Hyperparameters, batch split, backend/device and precision; a bad --cfg/--weights fails here too."""
    hyp = load_hyp(config.hyp, config.hyp_overrides)
    if info.rank == 0:
        for warning in unused_hyp_warnings(hyp, load_hyp("scratch-low")):
            log.warning("%s", warning)
    plan = plan_batch(config.batch_size, config.batch_per_gpu, info.world_size)
    cuda = torch.cuda.is_available()
    backend, device_type = distributed.resolve(config.backend, info, cuda)
    amp = resolve_amp(
        config.amp, device_type, torch.cuda.get_device_capability() if device_type == "cuda" else None
    )
    if info.rank == 0:
        log.info("amp %s: %s", amp.mode, amp.reason)
    if config.compile and device_type == "cpu" and not (shutil.which("g++") or shutil.which("c++")):
        raise ConfigError("--compile on CPU needs a C++ compiler (g++) for torch inductor; none is installed")
    if config.cfg:
        load_model_config(config.cfg)  # a bad --cfg fails now, not after the data scan
    if config.weights and not Path(config.weights).is_file():
        raise ConfigError(f"--weights {config.weights}: no such file")
    from yolov5_smddp.data.color import runs_on_device

    return Decisions(hyp, plan, backend, device_type, amp, runs_on_device(config.color_aug, device_type))


AUTO_RESUME_MUST_MATCH = ("cfg", "weights", "data")
"""Options that, given on the command line, must be those of the run a checkpoint folder holds before that
run is resumed automatically (anything else takes the command's value, as a restarted job passes it)."""


def resumable_checkpoint(
    config: TrainConfig, dirs: OutputDirs, main: bool
) -> tuple[TrainConfig, Path | None, dict | None]:
    """The run's config, the checkpoint it resumes from and that checkpoint's contents, read before the
    model exists (its model_cfg defines the model); (config, None, None) for a fresh run.

    --resume (dirs.resume_from): the resumed run's options (config.resume_run: a contradicting option is a
    ConfigError), refused when that run has finished; rank 0 copies its best.pt into checkpoint_dir
    (unless one is there). Else a last.pt in checkpoint_dir is resumed automatically (a restarted job)
    unless --exist-ok, and only when every AUTO_RESUME_MUST_MATCH option given is the run's: a ConfigError
    says how to resume it or start afresh otherwise."""
    if dirs.resume_from is not None:
        path = dirs.resume_from
        saved = checkpoint.load_checkpoint(path)
        config = resume_run(config, saved["config"], path)
        planned = saved.get("planned_epochs") or config.epochs
        if int(saved["epoch"]) >= planned:
            raise ConfigError(
                f"--resume {path}: that run has finished its {planned} epochs, nothing to resume; to train "
                f"on from its weights start a new run with --weights {path}"
            )
        best_before = path.with_name(checkpoint.BEST)
        if main and best_before.is_file():  # the resumed run's best comes along
            make_folder(dirs.checkpoint_dir)
            if not (dirs.checkpoint_dir / checkpoint.BEST).exists():
                shutil.copyfile(best_before, dirs.checkpoint_dir / checkpoint.BEST)
        return config, path, saved
    path = None if config.exist_ok else checkpoint.find_resumable(dirs.checkpoint_dir)
    if path is None:
        return config, None, None
    saved = checkpoint.load_checkpoint(path)
    theirs = saved.get("config", {})
    differ = [
        name
        for name in AUTO_RESUME_MUST_MATCH
        if getattr(config, name) is not None
        and (
            not same_data(config.data, theirs.get("data"))
            if name == "data"
            else getattr(config, name) != theirs.get(name)
        )
    ]
    if differ:
        given = ", ".join(f"--{n} {getattr(config, n)}" for n in differ)
        runs = ", ".join(f"--{n} {theirs.get(n) or '(none)'}" for n in differ)
        raise ConfigError(
            f"{path} holds a run with {runs}, not {given}: to continue that run, --resume {path}; to start "
            f"afresh, --exist-ok (overwrites its checkpoints) or another --checkpoint-dir"
        )
    return config, path, saved


def build_detection_model(
    config: TrainConfig,
    bundle: DataBundle,
    device: torch.device,
    *,
    anchor_t: float,
    resume_cfg: dict | None = None,
) -> nn.Module:
    """The model for the dataset's classes: a resumed checkpoint's `resume_cfg`, else --cfg and --weights
    (`initial_model`); on a fresh run AutoAnchor checks/fits the anchors (rank 0 computes, every rank gets
    them) before the EMA copies them; frozen layers, on `device`."""
    main = distributed.is_main()
    initial = initial_model(
        config.cfg,
        config.weights,
        bundle.nc,
        bundle.names,
        allow_partial=config.allow_partial_transfer,
        resume_cfg=resume_cfg,
    )
    model = initial.model
    if main:
        log.info(initial.line)
    if resume_cfg is None and not config.noautoanchor:
        autoanchor(
            model,
            bundle.train_index.shapes,
            bundle.train_index.labels,
            imgsz=config.imgsz,
            anchor_t=anchor_t,
            seed=config.seed,
            main=main,
            share=functools.partial(share_anchor_check, anchors=model.detect.anchors.numel() // 2),
        )
    check_freeze(config.freeze, len(model.model), str(model.cfg.get("name", config.cfg)))
    freeze_layers(model, config.freeze)
    model.to(device)
    if config.channels_last:
        model.to(memory_format=torch.channels_last)
    return model


@dataclass
class Run:
    """The fixed parts of a run on this rank: what a checkpoint holds besides the RunState."""

    config: TrainConfig
    info: distributed.DistInfo
    dirs: OutputDirs
    plan: BatchPlan
    amp: AmpPolicy
    device: torch.device
    model: nn.Module
    stack: TrainingStack
    warmup_iters: int = MIN_WARMUP_ITERS
    """set once the train loader's length is known."""
    batches_per_epoch: int = 1
    """the train loader's length (the schedule's epoch lag needs it)."""
    epochs: int = 0
    """the run's epochs in all: --epochs, or with --time the count planned from the measured epoch times
    (budget.py), which the schedule decays over."""

    def __post_init__(self) -> None:
        self.epochs = self.epochs or self.config.epochs

    @property
    def main(self) -> bool:
        return self.info.rank == 0

    @property
    def hyp(self) -> dict[str, float]:
        return self.stack.hyp

    def settings_for(self, epoch: int):
        """Learning rates and momentum per micro-step of `epoch` (warmup, then the decay)."""
        return lambda it: step_settings(
            it,
            epoch,
            epochs=self.epochs,
            warmup_iters=self.warmup_iters,
            batches_per_epoch=self.batches_per_epoch,
            hyp=self.hyp,
            cosine=self.config.cos_lr,
            global_batch=self.plan.global_batch,
        )

    def checkpoint(self, state: checkpoint.RunState) -> dict[str, Any]:
        return {
            "model": unwrap(self.model).state_dict(),
            "model_cfg": unwrap(self.model).cfg,
            "names": list(unwrap(self.model).names),
            "ema": self.stack.ema.state_dict(),
            "optimizer": self.stack.optimizer.state_dict(),
            "scaler": self.stack.scaler.state_dict(),
            "schedule": {
                "kind": "cosine" if self.config.cos_lr else "linear",
                "warmup_iters": self.warmup_iters,
                "accumulate": self.stack.accumulate,
                "lag": "release",  # lr_factor one epoch behind after warmup (engine.scheduled_epoch)
            },
            **state.to_checkpoint(),
            "rng": checkpoint.capture_rng_state(),
            "config": self.config.to_dict(),
            "hyp": self.hyp,
            "world_size": self.info.world_size,
            "global_batch": self.plan.global_batch,
        }

    def save(self, state: checkpoint.RunState, *, best: bool = False) -> Path:
        return checkpoint.save_checkpoint(self.dirs.checkpoint_dir, self.checkpoint(state), best=best)


def resume(run: Run, resumable: Path | None, saved: dict[str, Any] | None) -> checkpoint.RunState:
    """The run state of the checkpoint `saved` read from `resumable` (see `resumable_checkpoint`: model,
    EMA, optimizer and scaler loaded), else a new one; every rank must resume from the same point."""
    state = checkpoint.RunState()
    if resumable is not None and saved is not None:
        try:
            run.model.load_state_dict(saved["model"])
            run.stack.ema.load_state_dict(saved["ema"])
            run.stack.optimizer.load_state_dict(saved["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise WeightsError(
                f"checkpoint {resumable} does not fit this model/optimizer ({exc}); "
                f"use another --checkpoint-dir or delete it"
            ) from exc
        scaler_line = restore_scaler(run.stack.scaler, saved["scaler"])
        if run.main and scaler_line:
            log.info("%s", scaler_line)
        state = checkpoint.RunState.from_checkpoint(saved)
        if run.main and saved.get("rng") is not None:
            checkpoint.restore_rng_state(saved["rng"])
        if run.main:
            log.info(
                "resuming from %s at epoch %d (iteration %d, trained on %d rank(s), now %d)",
                resumable,
                state.epoch + 1,
                state.iteration,
                int(saved["world_size"]),
                run.info.world_size,
            )
    # a checkpoint folder that is not shared or synced to every node would silently desynchronise
    # optimizer states
    agreed = distributed.broadcast_ints((state.epoch, state.iteration))
    if agreed != (state.epoch, state.iteration):
        raise WeightsError(
            f"rank {run.info.rank} would resume at epoch {state.epoch + 1} but rank 0 at epoch {agreed[0] + 1}: "
            f"--checkpoint-dir {run.dirs.checkpoint_dir} must hold the same last.pt on every node"
        )
    return state


def restore_scaler(scaler: torch.amp.GradScaler, saved: dict[str, Any]) -> str | None:
    """Load a checkpoint's loss-scaler state into `scaler` across AMP modes: fp16 runs save a scale, bf16
    and fp32 runs an empty dict. Returns the line to log when the modes differ (None when they agree):
    fp16 after bf16/fp32 starts the scale afresh, bf16/fp32 after fp16 has no scale to keep."""
    if saved and scaler.is_enabled():
        scaler.load_state_dict(saved)
        return None
    if not saved and not scaler.is_enabled():
        return None
    if scaler.is_enabled():
        return (
            f"amp: the checkpoint was trained without loss scaling (bf16 or fp32); fp16 starts its loss "
            f"scale afresh at {scaler.get_scale():g}"
        )
    return f"amp: the checkpoint's fp16 loss scale {float(saved.get('scale', 0.0)):g} is not needed now"


def build_step(run: Run) -> TrainStep:
    """SyncBatchNorm, DDP and torch.compile around the model, and the engine's step."""
    config, info = run.config, run.info
    if config.sync_bn and info.world_size > 1 and run.device.type == "cuda":
        run.model = nn.SyncBatchNorm.convert_sync_batchnorm(run.model)
    net: nn.Module = run.model
    if info.distributed:
        net = wrap_ddp(run.model, run.device)
    if config.compile:
        plan = compile_plan(run.device.type, rect=config.rect, multi_scale=config.multi_scale)
        if run.main:
            log.info(
                "%s; compiling during the first steps (minutes for yolov5x; each shape once)", plan.reason
            )
        net = torch.compile(net, mode=plan.mode)
    return TrainStep(
        net,
        run.stack.criterion,
        run.stack.optimizer,
        run.stack.scaler,
        run.stack.ema,
        run.amp,
        run.device,
        loss_multiplier=loss_multiplier(info),
        channels_last=config.channels_last,
        inject_nonfinite_step=config.inject_nonfinite_step,
    )


def end_epoch(
    run: Run,
    state: checkpoint.RunState,
    result: EpochResult,
    metrics: DetectionMetrics | None,
    seconds: float,
    board,
    recorder: plots.ValidationPlots | None = None,
    tracking: mlflow_log.MlflowRun | None = None,
) -> None:
    """Rank 0 after epoch `state.epoch` (1-based: the epoch just finished): fitness and early-stop count,
    the results row, the metric line, the checkpoint (best too when it improved), results.csv, the plots
    (results.png; the validation plots from `recorder` when this epoch validated), TensorBoard, MLflow."""
    names = list(unwrap(run.model).names)
    improved = metrics is not None and metrics.fitness > state.best_fitness
    if improved:
        state.best_fitness, state.stale_epochs = metrics.fitness, 0
    elif metrics is not None:
        state.stale_epochs += 1
    lrs = {g["name"]: g["lr"] for g in run.stack.optimizer.param_groups}
    row = {
        "epoch": state.epoch,
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
    state.history.append(row)
    emit(
        metric_line(
            epoch=state.epoch,
            epochs=run.epochs,
            **{k: v for k, v in row.items() if k != "epoch"},
            samples_per_sec_per_gpu=result.throughput["samples_per_sec_per_gpu"],
            peak_mem_gb=peak_memory_gb(run.device),
        ),
        main=True,
    )
    last = run.save(state, best=improved)
    if run.config.save_period > 0 and state.epoch % run.config.save_period == 0:
        shutil.copyfile(last, run.dirs.checkpoint_dir / f"epoch{state.epoch}.pt")
    write_results_csv(run.dirs.output_dir / "results.csv", state.history)
    if not run.config.noplots:
        plots.after_epoch(
            run.dirs.output_dir, state.history, recorder if metrics is not None else None, names
        )
    if board is not None:
        for key, value in row.items():
            board.add_scalar(key, value, state.epoch)
        if not run.config.noplots:
            plots.add_to_tensorboard(board, run.dirs.output_dir, state.epoch)
        board.flush()
    if tracking is not None:
        tracking.log_epoch(state.epoch, row)


@dataclass
class EpochsOutcome:
    interrupted: bool = False
    """SIGTERM stopped the epochs before the last one ended (the run exits EXIT_INTERRUPTED)."""
    stopped: str | None = None
    """where a SIGTERM stopped the run ("in epoch 3", "after epoch 2", "in the final validation")."""
    final_metrics: DetectionMetrics | None = None
    throughputs: list[dict[str, float]] = field(default_factory=list)


def run_epochs(
    run: Run,
    state: checkpoint.RunState,
    step: TrainStep,
    train_loader,
    val_loader,
    bundle: DataBundle,
    stop: _StopOnSigterm,
    tracking: mlflow_log.MlflowRun | None = None,
) -> EpochsOutcome:
    """The epochs from `state.epoch`: train, (with --time) plan the epochs that fit, validate with the EMA
    (every rank its shard), end the epoch on rank 0, stop early or on SIGTERM (rank 0 decides for every
    rank). `bundle` gives the plots the
    class names and the val labels. `stop`: the job's SIGTERM flag; after the last epoch it cuts the final
    validation of best.pt short (the last epoch's metrics stand), so the final outputs are written in time."""
    config, main = run.config, run.main
    outcome = EpochsOutcome()
    board = open_tensorboard(run.dirs.tensorboard_dir) if main else None
    budget = None
    if config.time:
        clock = (
            time.monotonic
            if config.inject_epoch_seconds is None
            else counting_clock(config.inject_epoch_seconds)
        )
        budget = TimeBudget(config.time, used_before=state.time_used, clock=clock)
        budget.start()
    for epoch in itertools.count(state.epoch):
        if epoch >= run.epochs:  # with --time the count changes as the epochs go
            break
        epoch_started = time.perf_counter()
        train_loader.sampler.set_epoch(epoch)
        first_iteration = state.iteration
        batches_in = train_loader
        if main and epoch == 0 and not config.noplots:  # train_batch0..2.jpg: the first augmented batches
            batches_in = plots.recording_batches(train_loader, run.dirs.output_dir, bundle.names)
        result = train_one_epoch(
            step,
            batches_in,
            epoch=epoch,
            first_iteration=state.iteration,
            last_optimizer_iteration=state.last_optimizer_iteration,
            settings_for=run.settings_for(epoch),
            log_every=config.log_every,
            max_nonfinite_steps=config.max_nonfinite_steps,
            imgsz=config.imgsz,
            multi_scale=config.multi_scale,
            stop_requested=lambda: stop.requested,
            main=main,
            world_size=run.info.world_size,
        )
        state.iteration += result.iterations
        state.last_optimizer_iteration = result.last_optimizer_iteration
        if result.stopped:
            # restart this epoch on resume (same learning rates as an uninterrupted run)
            if main:
                run.save(dataclasses.replace(state, iteration=first_iteration))
                print(
                    checkpoint.interrupted_message(f"in epoch {epoch + 1}", run.dirs.checkpoint_dir),
                    flush=True,
                )
            outcome.interrupted, outcome.stopped = True, f"in epoch {epoch + 1}"
            break
        outcome.throughputs.append(result.throughput)
        if budget is not None:
            plan_epochs(run, state, budget, epochs_done=epoch + 1)
        # -- validate with the EMA weights, every rank its shard; rank 0 gets the metrics
        metrics = None
        last_epoch = epoch + 1 >= run.epochs
        recorder = None
        if val_loader is not None and (not config.noval or last_epoch):
            if not config.noplots:  # every rank records its shard; gathered to rank 0 below
                index = bundle.val_index
                recorder = plots.ValidationPlots(
                    index.images, index.shapes, index.labels, bundle.nc, keep_first=main
                )
            distributed.broadcast_module(run.stack.ema.module)  # one model: rank 0's EMA, buffers too
            metrics = validate(
                run,
                run.stack.ema.module,
                val_loader,
                should_stop=lambda: stop.requested,
                on_image=recorder.on_image if recorder is not None else None,
            )  # None when SIGTERM cut it short, and on ranks other than 0
            if recorder is not None:
                recorder.gather()  # every rank: rank 0's confusion matrix and curves cover every image
        state.epoch = epoch + 1
        if main:
            end_epoch(
                run,
                state,
                result,
                metrics,
                time.perf_counter() - epoch_started,
                board,
                recorder,
                tracking,
            )
            outcome.final_metrics = metrics if metrics is not None else outcome.final_metrics
        # rank 0 decides for everyone: early stop, or SIGTERM seen during validation
        stop_early = main and config.patience > 0 and state.stale_epochs >= config.patience
        stop_early, sigterm = map(bool, distributed.broadcast_ints((stop_early, main and stop.requested)))
        if sigterm and epoch + 1 < run.epochs:
            if main:
                print(
                    checkpoint.interrupted_message(f"after epoch {epoch + 1}", run.dirs.checkpoint_dir),
                    flush=True,
                )
            outcome.interrupted, outcome.stopped = True, f"after epoch {epoch + 1}"
            break
        if stop_early:
            if main:
                log.info("early stop: no fitness improvement for %d epochs", config.patience)
            break
    if board is not None:
        board.close()
    if not outcome.interrupted and val_loader is not None:
        # the final numbers are best.pt's (every rank, sharded), not the last epoch's
        best_metrics = validate_best(run, val_loader, should_stop=lambda: stop.requested)
        outcome.final_metrics = best_metrics if best_metrics is not None else outcome.final_metrics
        if stop.requested:
            outcome.stopped = "in the final validation"
        if main and stop.requested:
            log.warning(
                "SIGTERM after the last epoch: %s; writing the final outputs now",
                "the final validation of best.pt was cut short, metrics.json keeps the last epoch's"
                if best_metrics is None
                else "the final validation of best.pt had finished",
            )
        if main and best_metrics is not None:
            emit(metric_line(final=1, **best_metrics.to_dict()), main=True)
        if main and outcome.final_metrics is not None:
            report_per_class(outcome.final_metrics, bundle.names, state.epoch, tracking)
    return outcome


def share_anchor_check(check: AnchorCheck | None, *, anchors: int) -> AnchorCheck:
    """AutoAnchor's `share`: rank 0's check (None elsewhere) on every rank, one float broadcast of
    `AnchorCheck.to_vector()` (`anchors`: the model's anchor count, nl * na)."""
    vector = check.to_vector() if check is not None else np.zeros(4 + 2 * anchors)
    return AnchorCheck.from_vector(distributed.broadcast_tensor(torch.from_numpy(vector)).numpy())


def plan_epochs(run: Run, state: checkpoint.RunState, budget: TimeBudget, *, epochs_done: int) -> None:
    """--time, after an epoch's training: rank 0 plans the run's epochs from the measured epoch times
    (budget.py), every rank takes its count (the schedule follows it); the state records the seconds used
    and the plan for the checkpoint."""
    (planned,) = distributed.broadcast_ints((budget.plan(epochs_done) if run.main else 0,))
    if run.main and planned != run.epochs:
        log.info(
            "time budget: %.3g of %.3g h used, the last epoch %.1f s: %d epochs in all (was %d)",
            budget.used / 3600,
            budget.hours,
            budget.epoch_seconds[-1],
            planned,
            run.epochs,
        )
    run.epochs = state.planned_epochs = int(planned)
    state.time_used = budget.used


def report_per_class(
    metrics: DetectionMetrics, names: list[str], epochs: int, tracking: mlflow_log.MlflowRun | None
) -> None:
    """The final results table in the log, a row per class (as the release prints it after training),
    and the per-class values in MLflow at step `epochs`."""
    log.info("final validation (best.pt unless cut short):\n%s", results_table(metrics, names))
    if tracking is not None:
        tracking.log_per_class(epochs, metrics.per_class(names))


def train(config: TrainConfig, info: distributed.DistInfo, dirs: OutputDirs) -> int:
    """Run (or resume) a training job on this rank; returns 0, or EXIT_INTERRUPTED after SIGTERM.
    SIGTERM (spot, StopTrainingJob, max_run) is caught from the start to the end: one that comes while the
    job is being set up stops it at its first step, with a checkpoint and a model folder like any other."""
    with _StopOnSigterm() as stop:
        return _train(config, info, dirs, stop)


def _train(config: TrainConfig, info: distributed.DistInfo, dirs: OutputDirs, stop: _StopOnSigterm) -> int:
    started = time.perf_counter()

    # -- the run resumed (--resume: its options; a checkpoint_dir/last.pt of the same run), else a new one
    config, resumable, saved = resumable_checkpoint(config, dirs, info.rank == 0)

    # -- decisions: every config problem fails here, before any work
    decided = decide(config, info)

    # -- data: scanned on every rank BEFORE the process group exists
    bundle = scan_data(config, dirs.cache_dir)

    # -- process group and device
    device = distributed.init(info, decided.backend, decided.device_type, config.dist_timeout)
    seed_everything(config.seed + info.rank)
    if info.rank == 0:
        log.info(
            "backend=%s world_size=%d global_batch=%d per_rank=%d accumulate=%d amp=%s device=%s",
            decided.backend,
            info.world_size,
            decided.plan.global_batch,
            decided.plan.per_rank,
            accumulation(decided.plan.global_batch),
            decided.amp.mode,
            device,
        )

    # -- model (from the resumed checkpoint's model_cfg, else --cfg/--weights), loss, EMA, optimizer; resume
    model = build_detection_model(
        config,
        bundle,
        device,
        anchor_t=decided.hyp["anchor_t"],
        resume_cfg=saved.get("model_cfg") if saved is not None else None,
    )
    stack = build_training_stack(
        model,
        decided.hyp,
        nc=bundle.nc,
        imgsz=config.imgsz,
        global_batch=decided.plan.global_batch,
        amp=decided.amp,
        optimizer=config.optimizer,
        label_smoothing=config.label_smoothing,
    )
    run = Run(config, info, dirs, decided.plan, decided.amp, device, model, stack)
    state = resume(run, resumable, saved)
    if config.time and state.planned_epochs:  # a restart keeps the schedule of the budget's plan
        run.epochs = state.planned_epochs

    # -- step and loaders
    step = build_step(run)
    train_loader, val_loader, workers = build_loaders(
        config,
        bundle,
        run.hyp,
        decided.plan.per_rank,
        info,
        int(model.stride.max()),
        decided.color_on_device,
        dirs.cache_dir,
    )
    settings = decide_runtime(
        cpu_count=os.cpu_count() or 1,
        local_ranks=info.local_world_size,
        loader_workers=workers,
        device_type=device.type,
        rect=config.rect,
        multi_scale=config.multi_scale,
    )
    apply_runtime(settings)
    if run.main:
        log.info("%s", settings.log_line())
    run.warmup_iters = max(round(run.hyp["warmup_epochs"] * len(train_loader)), MIN_WARMUP_ITERS)
    run.batches_per_epoch = len(train_loader)
    if run.main:
        log.info(
            "%d train images, %d batches/epoch per rank, %d val images, %d loader workers/rank, warmup %d "
            "iterations, HSV and flips %s",
            len(bundle.train_index.images),
            len(train_loader),
            len(bundle.val_index.images),
            workers,
            run.warmup_iters,
            "on the device batch"
            if decided.color_on_device or config.loader == "gpu"
            else "in the loader workers",
        )
        if not config.noplots:
            plots.write_labels_plot(dirs.output_dir, bundle.train_index.labels, bundle.names)

    # -- the epochs, then the final outputs on rank 0
    tracking = (
        mlflow_log.start({**config.to_dict(), "hyp": run.hyp}, run_name=config.run_name) if run.main else None
    )
    # after a SIGTERM too, rank 0 writes the model folder (best so far) within the 120 s before SIGKILL,
    # while the other ranks wait in the barrier
    outcome = run_epochs(run, state, step, train_loader, val_loader, bundle, stop, tracking)
    if run.main:
        write_final_outputs(run, state, outcome, started, time_left=stop.time_left)
    if tracking is not None:  # after best.pt is written: it is one of the artefacts
        tracking.finish(dirs.output_dir, dirs.model_dir, interrupted=outcome.interrupted)
    distributed.barrier()
    return EXIT_INTERRUPTED if outcome.interrupted else 0


def validate_best(
    run: Run, val_loader, should_stop: Callable[[], bool] | None = None
) -> DetectionMetrics | None:
    """Validate the weights model_dir/best.pt receives — the best checkpoint's EMA, rounded to float16 as
    it is stored — on every rank, sharded. Rank 0 reads best.pt and broadcasts the weights (checkpoint
    folders are per node); rank 0 gets the metrics, the others None; None everywhere without a best.pt,
    and when `should_stop()` turns true (SIGTERM) on any rank."""
    ema = run.stack.ema
    best_path = run.dirs.checkpoint_dir / checkpoint.BEST
    if not distributed.broadcast_ints((run.main and best_path.is_file(),))[0]:
        return None
    if run.main:
        ema.load_state_dict(checkpoint.load_checkpoint(best_path)["ema"])
    distributed.broadcast_module(ema.module)
    with torch.no_grad():
        for tensor in ema.module.state_dict().values():
            if tensor.is_floating_point():
                tensor.copy_(tensor.half().float())
    return validate(run, ema.module, val_loader, should_stop=should_stop)


def validate(
    run: Run, module: nn.Module, val_loader, *, should_stop: Callable[[], bool] | None, on_image=None
) -> DetectionMetrics | None:
    """`engine.evaluate` of `module` with the run's validation settings (conf, IoU, max detections),
    sharded over the ranks: the metrics on rank 0, None elsewhere and when `should_stop()` turned true."""
    config = run.config
    return evaluate(
        module,
        val_loader,
        device=run.device,
        amp=run.amp,
        conf_thres=config.val_conf,
        iou_thres=config.val_iou,
        max_det=config.max_det,
        should_stop=should_stop,
        on_image=on_image,
        gather=True,
    )


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
    meta = {"train_config": config.to_dict(), "hyp": run.hyp, "epochs_trained": len(state.history)}
    save_weights(dirs.model_dir / "best.pt", ema.module, meta=meta, half=True)
    write_handler(dirs.model_dir)
    write_json(
        dirs.model_dir / "config.json",
        {
            "train_config": config.to_dict(),
            "hyp": run.hyp,
            "names": list(unwrap(run.model).names),
            "world_size": info.world_size,
        },
    )
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
        "wall_seconds": time.perf_counter() - started,
        "weights": str(dirs.model_dir / "best.pt"),
        "weights_precision": "float16",
        "weights_from": weights_from,
        "interrupted": outcome.stopped is not None,
        "stopped": outcome.stopped,
    }
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
