"""A training run resolved once: `resolve_run` turns the command's TrainConfig into the `ResolvedRun` every
later phase reads (the trainer, the Run, the data wiring, the reports, the checkpoints): the output folders,
the checkpoint it resumes and that run's options, the typed hyperparameters, the batch split, backend,
device and precision. Every problem of the options fails here, before the data scan; after it nothing
goes back to config.py's helpers (output folders, resume rules, hyp files, batch plan)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yolov5_smddp.config.output_dirs import OutputDirs, resolve_output_dirs
from yolov5_smddp.config.train_config import TrainConfig
from yolov5_smddp.distributed.process_group import DistInfo
from yolov5_smddp.train.decisions import Decisions, decide
from yolov5_smddp.train.resumption import resumable_checkpoint


@dataclass(frozen=True)
class ResolvedRun:
    """What a training run is before any work: built once by `resolve_run` on every rank."""

    config: TrainConfig
    """the run's options: the command's, or a resumed run's own (with the command's RESUME_FROM_COMMAND)."""
    info: DistInfo
    dirs: OutputDirs
    decided: Decisions
    """the typed hyperparameters, batch plan, backend, device type, precision, where colour runs."""
    resume_from: Path | None = None
    """the checkpoint this run continues (--resume, or a restarted job's last.pt); None: a fresh run."""
    saved: dict[str, Any] | None = None
    """that checkpoint's contents (its model_cfg defines the model; `resumption.resume` restores the rest)."""

    @property
    def main(self) -> bool:
        return self.info.rank == 0

    @property
    def planned_epochs(self) -> int:
        """The epochs in all: --epochs, or a restarted --time run's plan from its checkpoint."""
        planned = self.saved.get("planned_epochs") if self.config.time and self.saved is not None else None
        return int(planned or self.config.epochs)

    @property
    def resume_cfg(self) -> dict | None:
        """The resumed checkpoint's model definition (None: --cfg / --weights define the model)."""
        return self.saved.get("model_cfg") if self.saved is not None else None


def resolve_run(config: TrainConfig, info: DistInfo, cwd: Path) -> ResolvedRun:
    """The output folders (`config.resolve_output_dirs`, the same on every rank), the checkpoint resumed
    and its run's options (`resumption.resumable_checkpoint`), then the decisions on those options
    (`decisions.decide`)."""
    dirs = resolve_output_dirs(config, cwd)
    config, resume_from, saved = resumable_checkpoint(config, dirs, info.rank == 0)
    return ResolvedRun(config, info, dirs, decide(config, info), resume_from, saved)
