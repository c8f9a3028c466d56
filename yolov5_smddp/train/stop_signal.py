"""The job's SIGTERM (spot interruption, StopTrainingJob, max_run): a flag the training loop polls, the
seconds left before SageMaker's SIGKILL, and a watchdog for a step that never returns."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from yolov5_smddp.errors import EXIT_INTERRUPTED

STOP_WINDOW_S = 120.0
"""SageMaker's SIGKILL follows its SIGTERM (StopTrainingJob, spot interruption, MaxRuntimeExceeded) after
this many seconds."""
STOP_WATCHDOG_S = 110.0
"""After a SIGTERM the run must have ended within this many seconds: a step blocked for good (a read
that never returns) would otherwise never reach its checkpoint, and outside SageMaker no SIGKILL comes."""


class StopOnSigterm:
    """SIGTERM (spot interruption, StopTrainingJob, max_run: SIGKILL follows 120 s later) sets a flag; the
    loop finishes its step, writes a checkpoint, then the model folder (see `reporting.write_final_outputs`). A
    watchdog started by the signal ends the process with EXIT_INTERRUPTED when the run is still inside the
    block `watchdog_s` later (one line says so); leaving the block stops it."""

    def __init__(self, watchdog_s: float = STOP_WATCHDOG_S) -> None:
        self.requested = False
        self.signalled_at: float | None = None
        self._previous = None
        self._watchdog_s = watchdog_s
        self._watchdog: threading.Timer | None = None

    def time_left(self) -> float | None:
        """Seconds until SIGKILL after the SIGTERM (None before one)."""
        if self.signalled_at is None:
            return None
        return STOP_WINDOW_S - (time.monotonic() - self.signalled_at)

    def __enter__(self) -> StopOnSigterm:
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread: no handler
            self._previous = None
        return self

    def _handle(self, signum, frame) -> None:
        if not self.requested:
            self.signalled_at = time.monotonic()
            print(
                "SIGTERM received: finishing the current step, then writing a checkpoint and the model "
                "folder and exiting",
                flush=True,
            )
            self._watchdog = threading.Timer(self._watchdog_s, self._give_up)
            self._watchdog.daemon = True
            self._watchdog.start()
        self.requested = True

    def _give_up(self) -> None:
        print(
            f"SIGTERM received {self._watchdog_s:g} s ago and the current step has not finished (blocked); "
            f"exiting with code {EXIT_INTERRUPTED} (a checkpoint written before, if any, resumes the run)",
            flush=True,
        )
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)

    def __exit__(self, *exc) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
