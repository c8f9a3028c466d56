"""Loader workers that fit /dev/shm, decided up front (issue 50): never a hang on a small /dev/shm.

Every batch a DataLoader worker hands over travels through /dev/shm: with `w` workers and torch's
prefetch factor 2, up to 2w batches of each rank are there at once, and every rank of the host shares
the one /dev/shm. Docker's default is 64 MB; a batch of 16 at 640 px is 19.7 MB, so 2 workers of one
rank already need 79 MB. A worker that cannot write its batch there fails in ways that can stall the run.

`plan_workers` compares the need (local ranks x workers x prefetch x the largest batch: validation's
batch of 2 x the batch per rank at --imgsz, uint8 pixels plus a margin for labels) with the free
space of /dev/shm and keeps the workers that fit: the same count when they all fit; fewer, said in one
line naming `--shm-size`; none (the main process loads, slower), said in one line naming `--shm-size`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PREFETCH_FACTOR = 2
"""torch's DataLoader default: batches in flight per worker."""
MARGIN = 1.25
"""Labels, paths and the allocator's rounding on top of the pixels."""
SHM_PATH = "/dev/shm"


def batch_bytes(per_rank: int, imgsz: int) -> int:
    """The largest batch a worker hands over: validation's 2 x `per_rank` images of `imgsz` squared,
    3 channels of uint8 (training's mosaic batch is half of it)."""
    return int(2 * max(per_rank, 1) * 3 * imgsz * imgsz * MARGIN)


def shm_free_bytes(path: str = SHM_PATH) -> int | None:
    """Free bytes of the file system at `path` (/dev/shm); None when it cannot be measured."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


@dataclass(frozen=True)
class WorkerPlan:
    workers: int
    line: str | None
    """one log line when the count was lowered, else None."""


def _mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MB"


def suggested_shm_size(need: int) -> str:
    """A `--shm-size` value that holds `need` bytes, rounded up to whole GB (at least 1g)."""
    return f"{max(1, -(-need // 2**30))}g"


def plan_workers(
    workers: int, *, per_rank: int, imgsz: int, local_ranks: int, shm_free: int | None
) -> WorkerPlan:
    """The workers per rank that fit `shm_free` bytes of /dev/shm (see the module docstring)."""
    if workers <= 0 or shm_free is None:
        return WorkerPlan(workers, None)
    per_worker = max(local_ranks, 1) * PREFETCH_FACTOR * batch_bytes(per_rank, imgsz)
    need = workers * per_worker
    if need <= shm_free:
        return WorkerPlan(workers, None)
    fit = min(shm_free // per_worker, workers)
    size = suggested_shm_size(need)
    where = (
        f"/dev/shm has {_mb(shm_free)} free; {workers} loader worker(s) per rank x {max(local_ranks, 1)} "
        f"rank(s) on this host need about {_mb(need)} for batches of {per_rank} at {imgsz} px"
    )
    if fit >= 1:
        return WorkerPlan(
            int(fit),
            f"{where}: using {fit} worker(s) per rank; give the container more shared memory "
            f"(docker run --shm-size {size}) to use all {workers}",
        )
    return WorkerPlan(
        0,
        f"{where}: loading in the main process (no workers, slower); give the container more shared "
        f"memory (docker run --shm-size {size}) or lower the batch or --imgsz",
    )
