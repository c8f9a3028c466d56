"""The batch plan: the global batch split across ranks (`--batch-size` or `--batch-per-gpu`)."""

from __future__ import annotations

from dataclasses import dataclass

from yolov5_smddp.errors import ConfigError


@dataclass(frozen=True)
class BatchPlan:
    """global_batch = per_rank * world_size."""

    global_batch: int
    per_rank: int


def plan_batch(batch_size: int | None, batch_per_gpu: int | None, world_size: int) -> BatchPlan:
    """Split the global batch over `world_size` ranks; a global batch that does not divide is an error."""
    if batch_per_gpu is not None:
        if batch_size is not None and batch_size != batch_per_gpu * world_size:
            raise ConfigError(
                f"--batch-size={batch_size} contradicts --batch-per-gpu={batch_per_gpu} with {world_size} "
                f"rank(s) (= global batch {batch_per_gpu * world_size}); give only one of them"
            )
        return BatchPlan(batch_per_gpu * world_size, batch_per_gpu)
    total = 16 if batch_size is None else batch_size
    if total % world_size:
        raise ConfigError(
            f"--batch-size={total} is the GLOBAL batch and must be divisible by the world size {world_size}; "
            f"use e.g. --batch-size {max(1, total // world_size) * world_size} or --batch-per-gpu"
        )
    return BatchPlan(total, total // world_size)


# ---------------------------------------------------------------------------------------- hyperparameters
