"""`yolov5-smddp <command>`: parses the command line and hands over to one command module.

Each module in `yolov5_smddp.commands` provides `add_arguments(parser)` and `run(args) -> int`, and keeps
heavy imports (torch, cv2) inside `run` so that `--help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from yolov5_smddp import hostmem
from yolov5_smddp.errors import UserError

COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("yolov5_smddp.commands.train", "train a detector (one process, or one worker per device)"),
    "val": ("yolov5_smddp.commands.val", "validate weights on a dataset (mAP50, mAP50-95)"),
    "predict": ("yolov5_smddp.commands.predict", "detect objects in images, write JSON and annotated images"),
    "info": ("yolov5_smddp.commands.info", "layers, parameters and GFLOPs of a model config"),
    "bench": ("yolov5_smddp.commands.bench", "benchmarks: train, data, workers"),
}

log = logging.getLogger("yolov5_smddp")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="yolov5-smddp", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # a command whose module is not installed is not offered
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(command_parser)
        command_parser.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    hostmem.tune_malloc()  # before any large allocation: see hostmem
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except UserError as exc:
        log.debug("user error", exc_info=True)
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
