"""`yolov5-smddp <command>`: parses the command line and hands over to one command module.

Every command's failure ends here (`main`): a bad input or an output that cannot be written (a full disk,
a read-only folder) is one `error:` line on stderr and exit 2; anything else keeps its traceback. Where
the SageMaker output folder is there, either also writes /opt/ml/output/failure (sagemaker/failure.py).

Each module in `yolov5_smddp.commands` provides `add_arguments(parser)` and `run(args) -> int`, and keeps
heavy imports (torch, cv2) inside `run` so that `--help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback

from yolov5_smddp import hostmem, problems
from yolov5_smddp.sagemaker import failure

COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("yolov5_smddp.commands.train", "train a detector (one process, or one worker per device)"),
    "val": ("yolov5_smddp.commands.val", "validate weights on a dataset (mAP50, mAP50-95)"),
    "predict": ("yolov5_smddp.commands.predict", "detect objects in images, write JSON and annotated images"),
    "export": ("yolov5_smddp.commands.export", "write TorchScript / ONNX files of a checkpoint for serving"),
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
    except Exception as exc:
        return report(exc)


def report(exc: Exception) -> int:
    """The end of a failed command: a known problem (bad input, output not writable) -> one `error:`
    line and its exit code; anything else is re-raised (its traceback). Either way the failure file
    where SageMaker's output folder is in use. Call it from an `except` block."""
    failure_file = failure.command_failure_file(os.environ)
    known = problems.is_known_problem(exc)
    if known:
        log.debug("known problem", exc_info=True)
        print(problems.error_line(exc), file=sys.stderr)
    if failure_file is not None:
        details = "" if known else "".join(traceback.format_exception(exc))
        try:
            failure.write_failure(failure_file, failure.failure_reason(exc), details)
        except Exception as write_exc:  # noqa: BLE001 - the original failure is what the user must see
            print(f"error: could not write {failure_file}: {write_exc}", file=sys.stderr)
    if not known:
        raise exc
    return problems.exit_code(exc)


if __name__ == "__main__":
    sys.exit(main())
