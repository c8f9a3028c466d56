"""`--time HOURS`: a training budget instead of an epoch count (as ultralytics' `time=`).

After each epoch's training, rank 0 measures how long epochs take and sets the number of epochs the run
will have in all: those done plus as many mean epochs as still fit in the budget (rounded down, so the last
one's training ends within it). Every rank gets that number (one broadcast), and the learning-rate schedule
decays over it from then on (`lr_factor(epoch, epochs)` with the new count). The last epoch's validation,
the final validation of best.pt and the exports come after the budget, as do the job's start-up, the data
scan and the model set-up: set SageMaker's `max_run` a little above it.

An epoch here runs from one measuring point to the next: the previous epoch's validation, checkpoint and
plots, then its own training. The mean leaves out a session's first epoch once there are others (worker
start-up, first-epoch plots, autotuning). Checkpoints keep the seconds used and the planned count, so a
restarted job (spot) goes on with the same schedule and the budget that was left; the interrupted part of an
epoch and the restart's own start-up are not counted.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


def epochs_within_budget(
    budget_s: float, used_s: float, epochs_done: int, epoch_seconds: Sequence[float]
) -> int:
    """The run's epochs in all: `epochs_done` + how many epochs of the mean of `epoch_seconds` (this
    session's, the first left out when there are others) fit in `budget_s - used_s`; at least
    `epochs_done` and at least 1."""
    if not epoch_seconds:
        raise ValueError("epochs_within_budget: no epoch measured yet")
    measured = list(epoch_seconds[1:] if len(epoch_seconds) > 1 else epoch_seconds)
    mean = max(sum(measured) / len(measured), 1e-9)
    more = math.floor((budget_s - used_s) / mean) if budget_s > used_s else 0
    return max(epochs_done + more, epochs_done, 1)


@dataclass
class TimeBudget:
    """Rank 0's clock for `--time`. `used`: seconds of the budget used as of the last measuring point
    (`used_before`, from the checkpoint of an earlier session, plus this session's since `start()`);
    `epoch_seconds`: this session's epochs. `clock` (seconds) is injectable: tests and the hidden
    --inject-epoch-seconds option count time in epochs."""

    hours: float
    used_before: float = 0.0
    clock: Callable[[], float] = time.monotonic
    epoch_seconds: list[float] = field(default_factory=list)
    used: float = 0.0
    _mark: float = 0.0

    @property
    def seconds(self) -> float:
        return self.hours * 3600.0

    def start(self) -> None:
        """Before this session's first epoch."""
        self._mark, self.used = self.clock(), self.used_before

    def plan(self, epochs_done: int) -> int:
        """At an epoch's measuring point (after its training): the run's epochs in all (see
        `epochs_within_budget`) after `epochs_done` epochs."""
        now = self.clock()
        self.epoch_seconds.append(now - self._mark)
        self.used += now - self._mark
        self._mark = now
        return epochs_within_budget(self.seconds, self.used, epochs_done, self.epoch_seconds)


def counting_clock(seconds_per_call: float) -> Callable[[], float]:
    """A clock that reads 0, then `seconds_per_call` more at every call: with TimeBudget (one call at the
    start, one per epoch) every epoch lasts exactly that long."""
    calls = itertools.count()
    return lambda: seconds_per_call * next(calls)
