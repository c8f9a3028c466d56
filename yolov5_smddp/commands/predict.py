"""`yolov5-smddp predict`: detect objects in images; per image a JSON file (boxes in original-image
pixels) and an annotated copy, written to --out (never inside the source folder).

An image that cannot be decoded, or whose header claims more than --max-image-pixels, is skipped with
one "skipped: <path>: <why>" line and the others are processed; it fails only when none is usable."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from yolov5_smddp.data.imageinfo import DEFAULT_MAX_PIXELS
from yolov5_smddp.errors import ConfigError, DataError

if TYPE_CHECKING:
    import numpy as np
    import torch

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".bmp", ".dng", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp", ".pfm"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--weights",
        required=True,
        type=Path,
        help="checkpoint: ours or the release's .pt, or an exported .onnx",
    )
    parser.add_argument("--source", required=True, type=Path, help="an image file or a folder of images")
    parser.add_argument("--out", required=True, type=Path, help="output folder for JSON and annotated images")
    parser.add_argument("--imgsz", type=int, default=640, help="square network input size (multiple of 32)")
    parser.add_argument("--conf", type=float, default=0.25, help="confidence threshold")
    parser.add_argument("--iou", type=float, default=0.45, help="NMS IoU threshold")
    parser.add_argument("--max-det", type=int, default=300, help="maximum detections per image")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument(
        "--max-image-pixels",
        "--max_image_pixels",
        dest="max_image_pixels",
        type=int,
        default=DEFAULT_MAX_PIXELS,
        help="skip images whose header claims more pixels (default 2^27; see `train --help`)",
    )


def find_images(source: Path) -> list[Path]:
    """The image files of `source` (a file, or a folder's files with an image suffix, sorted)."""
    if not source.exists():
        raise DataError(f"source {source} does not exist")
    if source.is_file():
        return [source]
    images = sorted(p for p in source.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise DataError(f"source {source}: no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return images


def output_stems(images: list[Path]) -> list[str]:
    """Output file stems: the image's stem, or stem_suffix where two images share a stem."""
    stems = [p.stem for p in images]
    return [f"{p.stem}_{p.suffix.lstrip('.')}" if stems.count(p.stem) > 1 else p.stem for p in images]


def to_original_pixels(
    boxes_xyxy: torch.Tensor,
    input_hw: tuple[int, int],
    original_hw: tuple[int, int],
    ratio: tuple[float, float],
    pad: tuple[float, float],
) -> torch.Tensor:
    """Boxes [N, 4] xyxy in letterboxed input pixels → original-image pixels, clipped; `ratio` (rw, rh)
    and `pad` (pw, ph) as `letterbox` returns them."""
    from yolov5_smddp.boxes import scale_boxes

    return scale_boxes(boxes_xyxy, input_hw, original_hw, ratio_pad=((ratio[1], ratio[0]), pad))


def detection_records(det: torch.Tensor, names: list[str]) -> list[dict]:
    """det [N, 6] (x1, y1, x2, y2, score, class) in original pixels → JSON-able dicts."""
    return [
        {
            "box_xyxy": [round(v, 2) for v in row[:4]],
            "class_id": int(row[5]),
            "class_name": names[int(row[5])] if int(row[5]) < len(names) else str(int(row[5])),
            "score": round(row[4], 5),
        }
        for row in det.tolist()
    ]


def _annotate(image_bgr: np.ndarray, records: list[dict]) -> np.ndarray:
    import cv2

    out = image_bgr.copy()
    for rec in records:
        x1, y1, x2, y2 = (int(round(v)) for v in rec["box_xyxy"])
        c = rec["class_id"]
        colour = ((37 * c + 40) % 256, (97 * c + 200) % 256, (173 * c + 120) % 256)  # BGR, fixed per class
        cv2.rectangle(out, (x1, y1), (x2, y2), colour, 2)
        label = f"{rec['class_name']} {rec['score']:.2f}"
        cv2.putText(out, label, (x1, max(y1 - 4, 10)), cv2.FONT_HERSHEY_SIMPLEX, 0.45, colour, 1, cv2.LINE_AA)
    return out


def _device(name: str) -> torch.device:
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"--device {name!r}: not a device name ({exc})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available on this machine")
    return device


def _onnx_forward(path: Path, shape: tuple[int, int]):
    """(forward, names, input shape) for an exported .onnx file run by onnxruntime; a file exported
    for one size is fed that size."""
    from yolov5_smddp.onnx_model import OnnxDetector

    detector = OnnxDetector(path)
    batch = detector.input.shape[0]
    if isinstance(batch, int) and batch != 1:
        raise ConfigError(
            f"--weights {path}: exported for batch size {batch}; predict feeds one image at a time "
            f"(export with --batch-size 1 or --dynamic)"
        )
    fixed = detector.fixed_size()
    if fixed is not None and fixed != shape:
        log.info("%s: exported for %dx%d (h x w) input; using that instead of --imgsz", path, *fixed)
    return detector, detector.names, fixed or shape


def run(args: argparse.Namespace) -> int:
    import cv2
    import torch

    from yolov5_smddp.data.imageinfo import ImageProblem, decode_checked
    from yolov5_smddp.data.letterbox import letterbox
    from yolov5_smddp.models.weights import load_model
    from yolov5_smddp.postprocess import non_max_suppression

    if args.imgsz <= 0 or args.imgsz % 32:
        raise ConfigError(f"--imgsz {args.imgsz}: must be a positive multiple of 32")
    if not (0 <= args.conf <= 1 and 0 <= args.iou <= 1):
        raise ConfigError(f"--conf {args.conf} / --iou {args.iou}: must lie in [0, 1]")
    images = find_images(args.source)
    out, source = args.out.resolve(), args.source.resolve()
    folder = source if source.is_dir() else source.parent
    # nor inside a source folder: a later recursive scan of it would take our outputs for data
    if out == folder or (source.is_dir() and out.is_relative_to(source)):
        what = "is" if out == folder else "is inside"
        raise ConfigError(
            f"--out {args.out}: {what} the source folder; choose another so the inputs stay untouched"
        )
    device = _device(args.device)
    shape = (args.imgsz, args.imgsz)
    if args.weights.suffix.lower() == ".onnx":
        forward, names, shape = _onnx_forward(args.weights, shape)
    else:
        model = load_model(args.weights, device).fuse()
        forward, names = (lambda x: model(x)[0]), model.names
    args.out.mkdir(parents=True, exist_ok=True)

    skipped: list[str] = []
    for path, stem in zip(images, output_stems(images)):
        try:
            original = decode_checked(path, args.max_image_pixels)
        except ImageProblem as exc:
            skipped.append(f"{path}: {exc}")
            log.warning("skipped: %s", skipped[-1])
            continue
        h0, w0 = original.shape[:2]
        padded, ratio, pad = letterbox(cv2.cvtColor(original, cv2.COLOR_BGR2RGB), shape, auto=False)
        x = torch.from_numpy(padded).permute(2, 0, 1)[None].to(device)  # uint8 [1, 3, H, W] RGB
        with torch.inference_mode():
            pred = forward(x.float() / 255).to(device)
            (det,) = non_max_suppression(pred, args.conf, args.iou, max_det=args.max_det)
            det[:, :4] = to_original_pixels(det[:, :4], padded.shape[:2], (h0, w0), ratio, pad)
        records = detection_records(det.cpu(), names)
        result = {"image": str(path), "width": w0, "height": h0, "detections": records}
        (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        cv2.imwrite(str(args.out / f"{stem}.jpg"), _annotate(original, records))
        log.info("%s: %d detections", path, len(records))
    if len(skipped) == len(images):
        raise DataError(f"--source {args.source}: no image could be used (first: {skipped[0]})")
    log.info(
        "wrote %d JSON files and annotated images to %s; %d image(s) skipped",
        len(images) - len(skipped),
        args.out,
        len(skipped),
    )
    return 0
