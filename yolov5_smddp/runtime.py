"""Per-rank runtime settings of a training run, decided once its loaders exist: the CPU thread cap and
cuDNN's autotuner. `decide_runtime` is pure; `apply_runtime` sets them in torch.

Thread cap: torchrun exports OMP_NUM_THREADS=1 to its workers, while mpirun (the SMDDP launch) and our
elastic launcher export nothing, so there every rank's intra-op pool takes all of the host's cores:
8 ranks x 96 threads fighting each other and the loader workers. The same cap under every launcher: this
host's cores split over its ranks, minus each rank's loader workers (one core each), at least 1.

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

    def log_line(self) -> str:
        state = "on" if self.cudnn_benchmark else "off"
        return f"cpu threads/rank {self.threads}; cudnn.benchmark {state} ({self.why_benchmark})"


def cpu_threads_per_rank(cpu_count: int, local_ranks: int, loader_workers: int) -> int:
    """This host's cores split over its `local_ranks`, minus the rank's `loader_workers`, at least 1."""
    return max(max(cpu_count, 1) // max(local_ranks, 1) - max(loader_workers, 0), 1)


def decide_runtime(
    *, cpu_count: int, local_ranks: int, loader_workers: int, device_type: str, rect: bool, multi_scale: bool
) -> RuntimeSettings:
    """The settings of one rank (pure)."""
    threads = cpu_threads_per_rank(cpu_count, local_ranks, loader_workers)
    if device_type != "cuda":
        return RuntimeSettings(threads, False, "no CUDA device")
    if rect or multi_scale:
        return RuntimeSettings(threads, False, "--rect" if rect else "--multi-scale")
    return RuntimeSettings(threads, True, "fixed training shapes")


def apply_runtime(settings: RuntimeSettings) -> None:
    """Set the thread cap and the cuDNN autotuner for this process."""
    torch.set_num_threads(settings.threads)
    torch.backends.cudnn.benchmark = settings.cudnn_benchmark
