"""Resuming a run: which checkpoint a run continues (--resume, or a restarted job's last.pt of the same
run), read before the model exists, and the model, EMA, optimizer, loss scaler and run state restored
from it on every rank (rank 0's point, agreed by broadcast)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from yolov5_smddp.config.output_dirs import OutputDirs
from yolov5_smddp.config.resume import resume_run, same_data
from yolov5_smddp.config.train_config import TrainConfig
from yolov5_smddp.distributed import collectives
from yolov5_smddp.errors import ConfigError, WeightsError
from yolov5_smddp.files.atomic import atomic_copy, make_folder
from yolov5_smddp.train import checkpoint

if TYPE_CHECKING:
    from yolov5_smddp.train.run_state import Run

log = logging.getLogger("yolov5_smddp")


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
                atomic_copy(best_before, dirs.checkpoint_dir / checkpoint.BEST)
        return config, path, saved
    if config.exist_ok:
        return config, None, None
    path, saved, skipped = checkpoint.load_resumable(dirs.checkpoint_dir)
    if path is None or saved is None:
        return config, None, None
    if skipped and main:
        log.warning(
            "resume: %s skipped: %s; resuming from %s (epoch %d), the newest checkpoint that loads",
            ", ".join(s.split(" (")[0] for s in skipped),
            "; ".join(skipped),
            path,
            int(saved["epoch"]),
        )
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
    agreed = collectives.broadcast_ints((state.epoch, state.iteration))
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
