"""`yolov5-smddp train`: train a detector in this process (one worker of a torchrun/mpirun job, or alone).

`main(argv)` is the per-worker entry the SageMaker module and the launcher call: parse the options,
read the distributed environment, train, write the outputs, return the exit code. UserErrors propagate.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from yolov5_smddp.config import add_train_arguments

    add_train_arguments(parser)


def main(argv: list[str], info=None) -> int:
    """Parse `argv` (option words, no shell string), train, return 0 (or 143 after SIGTERM, resumable).
    `info` (a distributed.DistInfo) is where this worker sits; None: read from the launcher's variables."""
    from yolov5_smddp.config import parse_train_args

    return run_config(parse_train_args(argv), info)


def run_config(config, info=None) -> int:
    from yolov5_smddp import distributed, hostmem, trainer
    from yolov5_smddp.config import resolve_output_dirs

    hostmem.tune_malloc()  # every worker, however it was started (torchrun, mpirun, the SageMaker module)
    if info is None:
        info = distributed.detect_dist_info(os.environ)
    if info.rank == 0 and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    dirs = resolve_output_dirs(config, Path.cwd())
    try:
        return trainer.train(config, info, dirs)
    finally:
        distributed.destroy()


def run(args: argparse.Namespace) -> int:
    from yolov5_smddp.config import config_from_namespace

    return run_config(config_from_namespace(args))
