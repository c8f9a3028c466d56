"""`yolov5-smddp bench {train,data,workers}` (the scaling model is a research tool: `python -m bench.scaling`): each benchmark lives in `yolov5_smddp.benchmarks.<name>`
with the same `add_arguments(parser)` / `run(args)` pair as a command."""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS: dict[str, tuple[str, str]] = {
    "train": ("yolov5_smddp.benchmarks.train", "training step throughput, step-time split, memory, MFU"),
    "data": ("yolov5_smddp.benchmarks.data", "mosaic pipeline samples/s and label-scan files/s"),
    "workers": ("yolov5_smddp.benchmarks.workers", "loader throughput per DataLoader worker count"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, (module_name, help_text) in BENCHMARKS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # a benchmark not written yet is simply not offered
        bench_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(bench_parser)
        bench_parser.set_defaults(_bench_run=module.run)


def run(args: argparse.Namespace) -> int:
    return int(args._bench_run(args) or 0)
