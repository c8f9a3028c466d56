"""`yolov5-smddp train`: train a detector in this process (one worker of a torchrun/mpirun job, or alone).

`run_config(config, info)` is the per-worker entry: read the distributed environment (unless `info` says
where this worker sits), train, write the outputs, return the exit code. The SageMaker driver and the
elastic launcher's workers call it with the driver's parsed TrainConfig; `main(argv)` parses option words
first. UserErrors propagate.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from yolov5_smddp import hostmem
from yolov5_smddp.config.train_config import (
    TrainConfig,
    add_train_arguments,
    config_from_namespace,
    parse_train_args,
)
from yolov5_smddp.distributed import liveness, process_group
from yolov5_smddp.distributed.process_group import DistInfo


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_train_arguments(parser)


def main(argv: list[str], info: DistInfo | None = None) -> int:
    """Parse `argv` (option words, no shell string), train, return 0 (or 143 after SIGTERM, resumable).
    `info` (a process_group.DistInfo) is where this worker sits; None: read from the launcher's variables."""
    return run_config(parse_train_args(argv), info)


def run_config(config: TrainConfig, info: DistInfo | None = None) -> int:
    """Train `config` (already parsed and checked: `main`, or the SageMaker driver's one parse): resolved
    once (resolve.py: folders, resume point, hyperparameters, batch split, backend, precision), then run."""
    # torch: imported by training, not by `yolov5-smddp --help` (cli.py)
    from yolov5_smddp.train import trainer
    from yolov5_smddp.train.resolve import resolve_run
    from yolov5_smddp.train.stop_signal import StopOnSigterm

    hostmem.tune_malloc()  # every worker, however it was started (torchrun, mpirun, the SageMaker module)
    if info is None:
        info = process_group.detect_dist_info(os.environ)
    if info.rank == 0 and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    started = time.perf_counter()
    try:
        # SIGTERM is caught from here to the end: one during the set-up stops the run at its first step
        with StopOnSigterm() as stop:
            resolved = resolve_run(config, info, Path.cwd())  # every later phase reads this, not config/
            code = trainer.train(resolved, stop, started)
    except BaseException as exc:
        stopped = liveness.explain(exc)  # a failed collective: which rank stopped answering (bounded)
        process_group.teardown(None)  # bounded; the failure goes on to be reported
        if stopped is not None:
            raise stopped from exc
        raise
    # outputs are written: leave together, the store's host last; a stuck teardown ends this process
    # with `code` (yolov5_smddp.distributed.process_group.teardown)
    process_group.teardown(code)
    return code


def run(args: argparse.Namespace) -> int:
    return run_config(config_from_namespace(args))
