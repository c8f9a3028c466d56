"""Metric lines and throughput accounting.

Every metric line is space-separated `key=value` pairs printed by rank 0 only, e.g.
`epoch=3 step=120 loss=4.21 box_loss=0.081 samples_per_sec=312.5 data_wait=0.12`. SageMaker reads them with
`METRIC_DEFINITIONS` (the one source of truth for the regexes). The regexes never anchor at `^`: mpirun
prefixes each rank's lines with `[1,0]<stdout>:`.
"""

from __future__ import annotations

import math
import resource
import sys
import time
from dataclasses import dataclass

_NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def _regex(key: str) -> str:
    # \b keeps `loss=` from matching inside `box_loss=` (`_` is a word character); no look-arounds,
    # which not every regex engine supports.
    return rf"\b{key}={_NUMBER}"


# (metric name for SageMaker, key in our lines)
_METRICS = (
    ("epoch", "epoch"),
    ("train:loss", "loss"),
    ("train:box_loss", "box_loss"),
    ("train:obj_loss", "obj_loss"),
    ("train:cls_loss", "cls_loss"),
    ("train:lr", "lr"),
    ("train:samples_per_sec", "samples_per_sec"),
    ("train:samples_per_sec_per_gpu", "samples_per_sec_per_gpu"),
    ("train:data_wait", "data_wait"),
    ("train:peak_mem_gb", "peak_mem_gb"),
    ("val:precision", "precision"),
    ("val:recall", "recall"),
    ("val:mAP50", "mAP50"),
    ("val:mAP50-95", "mAP50-95"),
    ("val:fitness", "fitness"),
)

METRIC_DEFINITIONS: list[dict[str, str]] = [{"Name": name, "Regex": _regex(key)} for name, key in _METRICS]


def format_value(value: object) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)  # nan / inf: readable, and no metric regex takes it for a number
        return f"{value:.6g}"
    return str(value).replace(" ", "_")


def metric_line(**pairs: object) -> str:
    """`metric_line(epoch=3, loss=0.5)` → "epoch=3 loss=0.5" (keys with '-' via a dict: **{"mAP50-95": x})."""
    return " ".join(f"{key}={format_value(value)}" for key, value in pairs.items())


def emit(line: str, *, main: bool) -> None:
    """Print a metric line on rank 0 (flushed at once, so SageMaker and mpirun see it in order)."""
    if main:
        print(line, file=sys.stdout, flush=True)


def peak_memory_gb(device) -> float:
    """Peak allocated device memory (CUDA) or peak resident set size of this process (CPU), in GB."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux reports KiB


@dataclass
class Throughput:
    """Wall-clock accounting for one window of training steps on one rank.

    `data_wait` is the fraction of the window spent blocked on the loader; samples/s are per rank and,
    multiplied by the world size, in total (ranks take the same number of steps of the same size).
    """

    world_size: int = 1
    samples: int = 0
    data_seconds: float = 0.0
    started: float = 0.0

    def __post_init__(self) -> None:
        self.started = time.perf_counter()

    def add(self, samples: int, data_seconds: float) -> None:
        self.samples += samples
        self.data_seconds += data_seconds

    def summary(self) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        per_gpu = self.samples / elapsed
        return {
            "samples_per_sec": per_gpu * self.world_size,
            "samples_per_sec_per_gpu": per_gpu,
            "data_wait": min(self.data_seconds / elapsed, 1.0),
            "seconds": elapsed,
        }

    def reset(self) -> None:
        self.samples, self.data_seconds, self.started = 0, 0.0, time.perf_counter()
