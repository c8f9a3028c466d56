"""Phase timing for training steps without per-step host syncs.

On CUDA each boundary is a `torch.cuda.Event` recorded in the current stream, so the host never waits
inside the measured loop; the elapsed times are read once, after one synchronize at the end. On the CPU
the kernels run synchronously and `time.perf_counter` marks the same boundaries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class PhaseTotals:
    """Sums over the measured steps, in seconds of device time."""

    steps: int
    forward_backward_s: float  # host-to-device copy, uint8 → float, forward, loss, backward
    optimizer_s: float  # unscale/step/update and zero_grad

    @property
    def busy_s(self) -> float:
        return self.forward_backward_s + self.optimizer_s


class PhaseClock:
    """`start()`, `after_backward()`, `after_optimizer()` once per step, then `totals()` once."""

    def __init__(self, device_type: str) -> None:
        self.cuda = device_type == "cuda"
        self.marks: list[tuple[object, object, object]] = []
        self._open: list[object] = []

    def _now(self) -> object:
        if self.cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self) -> None:
        self._open = [self._now()]

    def after_backward(self) -> None:
        self._open.append(self._now())

    def after_optimizer(self) -> None:
        self._open.append(self._now())
        self.marks.append(tuple(self._open))
        self._open = []

    def totals(self) -> PhaseTotals:
        """Synchronizes once (CUDA) and sums the phases of every completed step."""
        if self.cuda:
            import torch

            torch.cuda.synchronize()

            def seconds(a, b) -> float:
                return a.elapsed_time(b) / 1e3
        else:

            def seconds(a, b) -> float:
                return b - a

        return PhaseTotals(
            steps=len(self.marks),
            forward_backward_s=sum(seconds(s, b) for s, b, _ in self.marks),
            optimizer_s=sum(seconds(b, o) for _, b, o in self.marks),
        )
