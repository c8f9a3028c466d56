"""Per-rank runtime settings of a training run, decided once its loaders exist: the CPU thread cap and
cuDNN's autotuner. `decide_runtime` is pure; `apply_runtime` sets them in torch.

Thread cap: torchrun exports OMP_NUM_THREADS=1 to its workers, while mpirun (the SMDDP launch) and our
elastic launcher export nothing, so there every rank's intra-op pool takes all of the host's cores:
8 ranks x 96 threads fighting each other and the loader workers. Where OMP_NUM_THREADS is set (by the
user, or torchrun's 1) it is obeyed, as torch itself does; where it is not, the cap is this host's cores
split over its ranks, minus each rank's loader workers (one core each), at least 1. Never more threads
than asked for: on a shared host, two jobs that each asked for 1 thread and got 2 slow each other down
tenfold (OpenMP threads spin on a busy core).

cuDNN's autotuner (`torch.backends.cudnn.benchmark`) times the convolution algorithms once per input
shape and keeps the fastest: a gain when every training batch has one shape, a cost per batch when the
shapes vary (`--rect`: one shape per batch; `--multi-scale`: one size per batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RuntimeSettings:
    threads: int
    """intra-op CPU threads of this rank (torch.set_num_threads)."""
    cudnn_benchmark: bool
    why_benchmark: str
    why_threads: str

    def log_line(self) -> str:
        state = "on" if self.cudnn_benchmark else "off"
        return (
            f"cpu threads/rank {self.threads} ({self.why_threads}); cudnn.benchmark {state} "
            f"({self.why_benchmark})"
        )


def cpu_threads_per_rank(cpu_count: int, local_ranks: int, loader_workers: int) -> int:
    """This host's cores split over its `local_ranks`, minus the rank's `loader_workers`, at least 1."""
    return max(max(cpu_count, 1) // max(local_ranks, 1) - max(loader_workers, 0), 1)


def threads_asked(omp_num_threads: str | None) -> int | None:
    """The thread count an OMP_NUM_THREADS value asks for (its first level: "4,2" is 4), or None where
    it is unset, empty or not a positive integer."""
    first = (omp_num_threads or "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


def decide_runtime(
    *,
    cpu_count: int,
    local_ranks: int,
    loader_workers: int,
    device_type: str,
    rect: bool,
    multi_scale: bool,
    omp_num_threads: str | None = None,
) -> RuntimeSettings:
    """The settings of one rank (pure). `omp_num_threads`: the environment's OMP_NUM_THREADS, obeyed
    when it is a positive integer."""
    asked = threads_asked(omp_num_threads)
    if asked is not None:
        threads, why_threads = asked, f"OMP_NUM_THREADS={omp_num_threads}"
    else:
        threads = cpu_threads_per_rank(cpu_count, local_ranks, loader_workers)
        why_threads = f"{cpu_count} cores / {local_ranks} local ranks - {loader_workers} loader workers"
        if omp_num_threads not in (None, ""):
            why_threads += f"; OMP_NUM_THREADS={omp_num_threads!r} ignored: not a positive integer"
    if device_type != "cuda":
        return RuntimeSettings(threads, False, "no CUDA device", why_threads)
    if rect or multi_scale:
        return RuntimeSettings(threads, False, "--rect" if rect else "--multi-scale", why_threads)
    return RuntimeSettings(threads, True, "fixed training shapes", why_threads)


def apply_runtime(settings: RuntimeSettings) -> None:
    """Set the thread cap and the cuDNN autotuner for this process."""
    torch.set_num_threads(settings.threads)
    torch.backends.cudnn.benchmark = settings.cudnn_benchmark
