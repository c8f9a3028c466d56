"""`yolov5-smddp export`: write TorchScript, ONNX and/or OpenVINO IR files of a checkpoint (ours or the
release's .pt) beside the weights or in --output-dir: input `images` [B, 3, H, W] RGB 0-1, output `output0`
[B, N, 5 + nc] (xywh in input pixels, objectness, class scores; no NMS), metadata stride and names."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from yolov5_smddp.commands.options import add_model_input_options, add_weights_option, make_folder
from yolov5_smddp.commands.predict import _device
from yolov5_smddp.errors import DataError, OutputError

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights_option(parser, help="checkpoint: ours or the release's .pt")
    parser.add_argument(
        "--include",
        nargs="+",
        default=["torchscript"],
        choices=["torchscript", "onnx", "openvino", "engine"],
        help="formats to write (default: torchscript); openvino: a folder <stem>_openvino_model/; "
        "engine: TensorRT, refused with the reason where it cannot be built",
    )
    add_model_input_options(parser, device_default="cpu", height_width=True, images=False)
    parser.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=1)
    parser.add_argument(
        "--dynamic", action="store_true", help="ONNX and OpenVINO: dynamic batch, height and width"
    )
    parser.add_argument("--half", action="store_true", help="float16 (needs --device cuda)")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset version")
    parser.add_argument(
        "--simplify",
        action="store_true",
        help="ONNX: simplify the graph with onnxslim or onnxsim where one is installed (else skipped, said once)",
    )
    parser.add_argument(
        "--output-dir",
        "--output_dir",
        dest="output_dir",
        type=Path,
        default=None,
        help="folder for the exported files (default: beside the weights)",
    )


def run(args: argparse.Namespace) -> int:
    from yolov5_smddp.inference.export import ExportOptions, export_model, image_size
    from yolov5_smddp.models.weights import load_model

    options = ExportOptions(
        include=tuple(dict.fromkeys(args.include)),
        imgsz=image_size(args.imgsz),
        batch_size=args.batch_size,
        dynamic=args.dynamic,
        half=args.half,
        opset=args.opset,
        simplify=args.simplify,
    )
    device = _device(args.device)
    model = load_model(args.weights, device)
    folder = args.output_dir if args.output_dir is not None else args.weights.parent
    make_folder(folder, "--output-dir")
    try:
        written = export_model(model, folder / args.weights.stem, options, device)
    except OutputError:  # atomic_write's own line already names the file and the cause
        raise
    except OSError as exc:  # a full disk or a read-only folder, met while writing
        raise DataError(f"export: cannot write into {folder} ({exc.strerror or exc})") from None
    log.info("exported %s", ", ".join(str(p) for p in written.values()))
    return 0
