"""`yolov5-smddp predict`: detect objects in images and videos; per image a JSON file (boxes in
original-image pixels) and an annotated copy, per video a JSON Lines file (a line per frame) and an
annotated video, written to --out (never inside the source folder); see `predict_output` for the layout
and `predict_sources` for what --source may name (a file, a folder searched recursively, a glob, a .txt
list of paths).

An image or frame that cannot be decoded, or whose header claims more than --max-image-pixels, is skipped
with one "skipped: <path>: <why>" line and the others are processed; it fails only when none is usable.
Long inputs get a progress line every PROGRESS_SECONDS, not one per image."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from yolov5_smddp.commands.options import (
    add_model_input_options,
    add_threshold_options,
    add_weights_option,
    make_folder,
)
from yolov5_smddp.errors import ConfigError, DataError
from yolov5_smddp.inference.predict_output import (
    DEFAULT_FPS,
    PredictionWriter,
    Progress,
    SaveOptions,
    out_conflict,
)
from yolov5_smddp.inference.predict_sources import frames, resolve_source

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

PROGRESS_SECONDS = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights_option(
        parser,
        help="checkpoint: ours or the release's .pt, or an exported .onnx, .torchscript or OpenVINO folder",
    )
    parser.add_argument(
        "--source",
        required=True,
        help="an image or video file, a folder (searched recursively), a glob ('imgs/*.jpg', quoted) or a "
        ".txt file listing paths",
    )
    parser.add_argument(
        "--out", required=True, type=Path, help="output folder (JSON, annotated images/videos)"
    )
    add_model_input_options(parser, device_default="cpu", height_width=True, images=True)
    add_threshold_options(parser, conf=0.25, iou=0.45, max_det=1000)
    parser.add_argument("--classes", nargs="+", type=int, default=None, help="keep only these class ids")
    parser.add_argument(
        "--agnostic-nms",
        "--agnostic_nms",
        dest="agnostic_nms",
        action="store_true",
        help="NMS across classes",
    )
    parser.add_argument(
        "--vid-stride",
        "--vid_stride",
        dest="vid_stride",
        type=int,
        default=1,
        help="read every N-th video frame",
    )
    parser.add_argument(
        "--save-txt",
        "--save_txt",
        dest="save_txt",
        action="store_true",
        help="also write YOLO labels (class xc yc w h, normalised) to --out/labels/",
    )
    parser.add_argument(
        "--save-conf", "--save_conf", dest="save_conf", action="store_true", help="--save-txt: add the score"
    )
    parser.add_argument(
        "--save-crop",
        "--save_crop",
        dest="save_crop",
        action="store_true",
        help="also write each detection's box as an image to --out/crops/<class>/",
    )
    parser.add_argument("--nosave", action="store_true", help="no annotated images or videos (JSON only)")


def to_original_pixels(
    boxes_xyxy: torch.Tensor,
    input_hw: tuple[int, int],
    original_hw: tuple[int, int],
    ratio: tuple[float, float],
    pad: tuple[float, float],
) -> torch.Tensor:
    """Boxes [N, 4] xyxy in letterboxed input pixels → original-image pixels, clipped; `ratio` (rw, rh)
    and `pad` (pw, ph) as `letterbox` returns them."""
    from yolov5_smddp.detection.boxes import scale_boxes

    return scale_boxes(boxes_xyxy, input_hw, original_hw, ratio_pad=((ratio[1], ratio[0]), pad))


def _device(name: str) -> torch.device:
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"--device {name!r}: not a device name ({exc})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available on this machine")
    return device


def _exported_forward(path: Path, shape: tuple[int, int], device: torch.device):
    """(forward, names, input (h, w)) for an exported model (.onnx, .torchscript, OpenVINO folder or
    .xml); a file exported for one size is fed that size. None for anything else (a .pt)."""
    from yolov5_smddp.inference.exported_models import OpenVinoDetector, TorchScriptDetector, exported_format
    from yolov5_smddp.inference.onnx_model import OnnxDetector

    fmt = exported_format(path)
    if fmt is None:
        return None
    if fmt == "onnx":
        detector = OnnxDetector(path)
        batch = detector.input.shape[0]
        if isinstance(batch, int) and batch != 1:
            raise ConfigError(
                f"--weights {path}: exported for batch size {batch}; predict feeds one image at a time "
                f"(export with --batch-size 1 or --dynamic)"
            )
    elif fmt == "torchscript":
        detector = TorchScriptDetector(path, device)
    else:
        detector = OpenVinoDetector(path)
    fixed = detector.fixed_size()
    if fixed is not None and fixed != shape:
        log.info("%s: exported for %dx%d (h x w) input; using that instead of --imgsz", path, *fixed)
    return detector, detector.names, fixed or shape


def _check_options(args: argparse.Namespace) -> tuple[int, int]:
    """The input (h, w) from --imgsz; ConfigError naming any option out of range."""
    if len(args.imgsz) not in (1, 2):
        raise ConfigError(f"--imgsz {' '.join(map(str, args.imgsz))}: give one size or height and width")
    if any(v <= 0 or v % 32 for v in args.imgsz):
        raise ConfigError(f"--imgsz {' '.join(map(str, args.imgsz))}: must be a positive multiple of 32")
    if not (0 <= args.conf <= 1 and 0 <= args.iou <= 1):
        raise ConfigError(f"--conf {args.conf} / --iou {args.iou}: must lie in [0, 1]")
    if args.max_det < 1:
        raise ConfigError(f"--max-det {args.max_det}: must be at least 1")
    if args.vid_stride < 1:
        raise ConfigError(f"--vid-stride {args.vid_stride}: must be at least 1")
    if args.classes is not None and any(c < 0 for c in args.classes):
        raise ConfigError(f"--classes {' '.join(map(str, args.classes))}: class ids are 0 or more")
    if args.save_conf and not args.save_txt:
        raise ConfigError("--save-conf adds the score to --save-txt's labels; give --save-txt too")
    return (args.imgsz[0], args.imgsz[-1])


def run(args: argparse.Namespace) -> int:
    import cv2
    import torch

    from yolov5_smddp.data.letterbox import letterbox
    from yolov5_smddp.detection.postprocess import non_max_suppression
    from yolov5_smddp.models.weights import load_model

    shape = _check_options(args)
    resolved = resolve_source(args.source)
    conflict = out_conflict(args.out, args.source)
    if conflict is not None:  # a later recursive scan of the source would take our outputs for data
        raise ConfigError(f"--out {args.out}: {conflict}; choose another so the inputs stay untouched")
    device = _device(args.device)
    exported = _exported_forward(args.weights, shape, device)
    if exported is not None:
        forward, names, shape = exported
    else:
        model = load_model(args.weights, device).fuse()
        forward, names = (lambda x: model(x)[0]), model.names
    if args.classes is not None and max(args.classes) >= len(names):
        log.warning("--classes %s: the model has classes 0..%d only", args.classes, len(names) - 1)
    make_folder(args.out, "--out")
    writer = PredictionWriter(
        args.out, names, SaveOptions(not args.nosave, args.save_txt, args.save_conf, args.save_crop)
    )

    skipped = list(resolved.skipped)
    for entry in skipped:
        log.warning("skipped: %s", entry)
    progress = Progress(PROGRESS_SECONDS, time.monotonic)
    done = detections = 0
    files_started, current = 0, None
    try:
        for frame in frames(resolved.files, args.max_image_pixels, args.vid_stride):
            if frame.file is not current:
                current, files_started = frame.file, files_started + 1
            if frame.pixels is None:
                skipped.append(f"{frame.name}: {frame.problem}")
                log.warning("skipped: %s", skipped[-1])
                continue
            original = frame.pixels
            h0, w0 = original.shape[:2]
            padded, ratio, pad = letterbox(cv2.cvtColor(original, cv2.COLOR_BGR2RGB), shape, auto=False)
            x = torch.from_numpy(padded).permute(2, 0, 1)[None].to(device)  # uint8 [1, 3, H, W] RGB
            with torch.inference_mode():
                pred = forward(x.float() / 255).to(device)
                (det,) = non_max_suppression(
                    pred,
                    args.conf,
                    args.iou,
                    classes=args.classes,
                    agnostic=args.agnostic_nms,
                    max_det=args.max_det,
                )
                det[:, :4] = to_original_pixels(det[:, :4], padded.shape[:2], (h0, w0), ratio, pad)
            found = writer.write(frame, det.cpu(), (frame.fps or DEFAULT_FPS) / args.vid_stride)
            done, detections = done + 1, detections + found
            log.debug("%s: %d detections", frame.name, found)
            if progress.due():
                log.info("%s", progress.line(done, files_started, len(resolved.files)))
    finally:
        writer.close()
    if done == 0:
        raise DataError(f"--source {args.source}: no image could be used (first: {skipped[0]})")
    log.info(
        "wrote results of %d image(s)/frame(s) from %d file(s) to %s (%d detections); %d skipped",
        done,
        len(resolved.files),
        args.out,
        detections,
        len(skipped),
    )
    return 0
