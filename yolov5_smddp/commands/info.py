"""`yolov5-smddp info`: the layer table, parameter count and GFLOPs of a model config."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cfg",
        default="yolov5s.yaml",
        help="model config: yolov5{n,s,m,l,x}[6][.yaml] or a model yaml in the release's format",
    )
    parser.add_argument("--nc", type=int, default=None, help="number of classes (default: the config's)")
    parser.add_argument("--imgsz", type=int, default=640, help="square input size for the GFLOPs count")


def run(args: argparse.Namespace) -> int:
    import torch

    from yolov5_smddp.models.flops import format_report, model_report
    from yolov5_smddp.models.yolo import build_model

    # built on the meta device: shapes and parameter counts without allocating or initialising weights
    with torch.device("meta"):
        model = build_model(args.cfg, nc=args.nc)
    print(format_report(model_report(model, args.imgsz)))
    return 0
