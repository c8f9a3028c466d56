"""A SIGTERM while the step is blocked for good (issue 42, item 4): the run that logs "SIGTERM received:
finishing the current step" still ends, with EXIT_INTERRUPTED, within its watchdog's bound (110 s in a
run, under SageMaker's 120 s; a fraction of a second here), and a run that finishes in time is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from yolov5_smddp.errors import EXIT_INTERRUPTED
from yolov5_smddp.train.stop_signal import STOP_WATCHDOG_S, STOP_WINDOW_S

SCRIPT = """
import os, signal, sys, time
from yolov5_smddp.train import stop_signal
with stop_signal.StopOnSigterm(watchdog_s=0.5) as stop:
    print(time.monotonic(), flush=True)  # CLOCK_MONOTONIC: the same clock in the test's process
    os.kill(os.getpid(), signal.SIGTERM)
    if sys.argv[1] == "blocked":
        open(sys.argv[2]).read()  # a FIFO with no writer: blocks for good
    else:
        time.sleep(0.1)
time.sleep(1.0)  # past the watchdog's bound, outside the block
print("ended", stop.requested, flush=True)
"""


def _run(mode: str, fifo: str) -> tuple[subprocess.CompletedProcess, float]:
    """The finished process (its stdout without the timestamp line) and the seconds from its SIGTERM to
    its end (not counting the interpreter's start, slow on a busy machine)."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, fifo],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    ended = time.monotonic()
    signalled, _, rest = done.stdout.partition("\n")
    done.stdout = rest
    return done, ended - float(signalled)


def test_a_step_blocked_after_sigterm_ends_with_the_interrupted_code(tmp_path):
    fifo = tmp_path / "labels.txt"
    os.mkfifo(fifo)
    done, seconds = _run("blocked", str(fifo))
    assert done.returncode == EXIT_INTERRUPTED
    assert done.stdout.splitlines() == [
        "SIGTERM received: finishing the current step, then writing a checkpoint and the model folder and exiting",
        "SIGTERM received 0.5 s ago and the current step has not finished (blocked); exiting with code 143 "
        "(a checkpoint written before, if any, resumes the run)",
    ]
    assert 0.5 <= seconds < 10


def test_a_run_that_ends_in_time_is_left_alone(tmp_path):
    done, _ = _run("finishes", "")
    assert done.returncode == 0
    assert done.stdout.splitlines()[-1] == "ended True"


def test_the_watchdog_fires_before_sagemakers_sigkill():
    assert STOP_WATCHDOG_S < STOP_WINDOW_S - 5
