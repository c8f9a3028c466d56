"""What a training run is on one rank, as data: `Run` (built once by trainer.build_run, after the loaders
and SyncBatchNorm; only its planned epoch count changes afterwards), `PlannedEpochs` and `EpochsOutcome`.
Its own module so that the trainer's helpers (reporting, resumption) read it without importing the trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from yolov5_smddp.config.batch import BatchPlan
from yolov5_smddp.config.hyp import Hyp
from yolov5_smddp.config.output_dirs import OutputDirs
from yolov5_smddp.config.train_config import TrainConfig
from yolov5_smddp.detection.metrics import DetectionMetrics
from yolov5_smddp.distributed import process_group
from yolov5_smddp.models.wrappers import unwrap
from yolov5_smddp.train import checkpoint
from yolov5_smddp.train.engine import AmpPolicy, Schedule
from yolov5_smddp.train.optim_recipe import TrainingStack

MIN_WARMUP_ITERS = 100


@dataclass
class PlannedEpochs:
    """The one part of a Run that changes while it trains: its epochs in all. --epochs, or with --time the
    count planned from the measured epoch times (budget.py; a restart keeps the checkpoint's plan), which
    the schedule decays over."""

    count: int


@dataclass(frozen=True)
class Run:
    """The fixed parts of a run on this rank, built once the loaders exist (and after SyncBatchNorm):
    what a checkpoint holds besides the RunState. Only `planned` (the epoch count) changes afterwards."""

    config: TrainConfig
    info: process_group.DistInfo
    dirs: OutputDirs
    plan: BatchPlan
    amp: AmpPolicy
    device: torch.device
    model: nn.Module
    """the model the step trains (SyncBatchNorm layers with --sync-bn on several GPUs)."""
    stack: TrainingStack
    warmup_iters: int = MIN_WARMUP_ITERS
    """max(warmup_epochs * batches_per_epoch, MIN_WARMUP_ITERS) (`warmup_iters`)."""
    batches_per_epoch: int = 1
    """the train loader's length (the schedule's epoch lag needs it)."""
    planned: PlannedEpochs | None = None
    """the run's epochs in all (None: --epochs)."""

    def __post_init__(self) -> None:
        if self.planned is None:
            object.__setattr__(self, "planned", PlannedEpochs(self.config.epochs))

    @property
    def epochs(self) -> int:
        return self.planned.count

    @property
    def main(self) -> bool:
        return self.info.rank == 0

    @property
    def hyp(self) -> Hyp:
        return self.stack.hyp

    @property
    def schedule(self) -> Schedule:
        """The schedule of the epochs planned now (warmup, then the decay over `epochs`)."""
        return Schedule(
            hyp=self.hyp,
            epochs=self.epochs,
            warmup_iters=self.warmup_iters,
            batches_per_epoch=self.batches_per_epoch,
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
            "hyp": self.hyp.to_dict(),
            "world_size": self.info.world_size,
            "global_batch": self.plan.global_batch,
        }

    def save(self, state: checkpoint.RunState, *, best: bool = False) -> Path:
        return checkpoint.save_checkpoint(self.dirs.checkpoint_dir, self.checkpoint(state), best=best)


@dataclass
class EpochsOutcome:
    interrupted: bool = False
    """SIGTERM stopped the epochs before the last one ended (the run exits EXIT_INTERRUPTED)."""
    stopped: str | None = None
    """where a SIGTERM stopped the run ("in epoch 3", "after epoch 2", "in the final validation")."""
    final_metrics: DetectionMetrics | None = None
    throughputs: list[dict[str, float]] = field(default_factory=list)
