"""Option blocks that `val`, `predict` and `export` share (weights, input size, device, pixel limit, cache
folder, thresholds), defined once, with the release's spellings
(`--img`, `--img-size`, `--conf-thres`, `--iou-thres`) accepted beside ours where they mean the same; and
the making of the output folders these options name."""

from __future__ import annotations

import argparse
from pathlib import Path

from yolov5_smddp.data.imageinfo import DEFAULT_MAX_PIXELS
from yolov5_smddp.errors import ConfigError

IMGSZ_FLAGS = ("--imgsz", "--img", "--img-size", "--img_size")


def add_model_input_options(
    parser: argparse.ArgumentParser, *, device_default: str | None, height_width: bool, images: bool
) -> None:
    """--imgsz (one size, or with `height_width` also "H W"), --device and, where the command reads
    images (`images`), --max-image-pixels."""
    if height_width:
        parser.add_argument(
            *IMGSZ_FLAGS,
            dest="imgsz",
            nargs="+",
            type=int,
            default=[640],
            help="network input size: one size (square) or height and width, multiples of 32 (default 640)",
        )
    else:
        parser.add_argument(
            *IMGSZ_FLAGS, dest="imgsz", type=int, default=640, help="inference size in pixels (default 640)"
        )
    device_help = "cpu, cuda or cuda:N" + (
        " (default: cuda when available)" if device_default is None else ""
    )
    parser.add_argument("--device", default=device_default, help=device_help)
    if images:
        parser.add_argument(
            "--max-image-pixels",
            "--max_image_pixels",
            dest="max_image_pixels",
            type=int,
            default=DEFAULT_MAX_PIXELS,
            help="skip images whose header claims more pixels (default 2^27; see `train --help`)",
        )


def add_weights_option(parser: argparse.ArgumentParser, *, help: str) -> None:
    """--weights (required), a path; `help` says which model files the command takes."""
    parser.add_argument("--weights", required=True, type=Path, help=help)


def add_cache_dir_option(parser: argparse.ArgumentParser) -> None:
    """--cache-dir: where the label scan's cache goes (never under the dataset)."""
    parser.add_argument(
        "--cache-dir",
        "--cache_dir",
        dest="cache_dir",
        default=None,
        help="label cache folder (default $XDG_CACHE_HOME/yolov5-smddp, else ~/.cache/yolov5-smddp); "
        "nothing is ever written under the dataset",
    )


def add_threshold_options(parser: argparse.ArgumentParser, *, conf: float, iou: float, max_det: int) -> None:
    """--conf / --conf-thres, --iou / --iou-thres and --max-det with the command's defaults."""
    parser.add_argument(
        "--conf",
        "--conf-thres",
        "--conf_thres",
        dest="conf",
        type=float,
        default=conf,
        help="confidence threshold",
    )
    parser.add_argument(
        "--iou", "--iou-thres", "--iou_thres", dest="iou", type=float, default=iou, help="NMS IoU threshold"
    )
    parser.add_argument(
        "--max-det",
        "--max_det",
        dest="max_det",
        type=int,
        default=max_det,
        help=f"maximum detections per image (default {max_det})",
    )


def make_folder(folder: Path, option: str) -> None:
    """Makes `folder` (with its parents) for the output option `option`, or ConfigError naming the option,
    the folder and why it cannot be made."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{option}: cannot make the folder {folder} ({exc.strerror or exc})") from None
