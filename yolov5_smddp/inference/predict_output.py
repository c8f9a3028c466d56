"""What `predict` writes to --out for each image or video frame, and its progress lines.

    <stem>.json                 an image: {"image", "width", "height", "detections": [...]}
    <stem>.jpg                  the image with its boxes drawn (not with --nosave)
    <stem>.jsonl                a video: one line per frame read, {"video", "frame", "width", "height",
                                "detections"}
    <stem>.mp4 (or .avi)        the video's frames with boxes drawn, at fps / --vid-stride (not with --nosave)
    labels/<stem>[_<frame>].txt --save-txt: YOLO labels, one "class xc yc w h [conf]" line per detection,
                                normalised to 0-1 by the image size (an empty file: nothing detected)
    crops/<class>/<stem>[_<frame>]_<k>.jpg   --save-crop: each detection's box cut from the original

Detections are {"box_xyxy" (original-image pixels), "class_id", "class_name", "score"}. Every write is
checked: a file that cannot be written (disk full, no permission) stops the run with one line naming it.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from yolov5_smddp.errors import DataError
from yolov5_smddp.inference.predict_sources import GLOB_CHARACTERS, Frame, MediaFile, is_glob

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

VIDEO_CODECS = (("mp4v", ".mp4"), ("MJPG", ".avi"))  # tried in order: the first this OpenCV can write
DEFAULT_FPS = 30.0  # where a video does not state its frame rate


@dataclass(frozen=True)
class SaveOptions:
    """Which outputs to write beside the JSON."""

    images: bool = True  # annotated images and videos (off with --nosave)
    txt: bool = False
    conf: bool = False
    crop: bool = False


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


def yolo_label_lines(det: torch.Tensor, width: int, height: int, with_conf: bool) -> list[str]:
    """det [N, 6] (x1, y1, x2, y2, score, class) in pixels of a width x height image → YOLO label lines
    "class xc yc w h" (normalised, 6 decimals) with " conf" appended when `with_conf`."""
    lines = []
    for x1, y1, x2, y2, score, cls in det.tolist():
        values = ((x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height)
        line = f"{int(cls)} " + " ".join(f"{v:.6f}" for v in values)
        lines.append(line + (f" {score:.5f}" if with_conf else ""))
    return lines


def crop_box(box_xyxy: list[float], width: int, height: int) -> tuple[int, int, int, int] | None:
    """A box in pixels → the integer (x1, y1, x2, y2) it covers inside the image, None if empty."""
    x1, y1 = max(math.floor(box_xyxy[0]), 0), max(math.floor(box_xyxy[1]), 0)
    x2, y2 = min(math.ceil(box_xyxy[2]), width), min(math.ceil(box_xyxy[3]), height)
    return (x1, y1, x2, y2) if x2 > x1 and y2 > y1 else None


def safe_folder_name(name: str) -> str:
    """A class name as a folder name: path separators and control characters replaced."""
    cleaned = re.sub(r"[\x00-\x1f/\\]", "_", name).strip()
    return cleaned if cleaned not in ("", ".", "..") else "_"


def annotate(image_bgr: np.ndarray, records: list[dict]) -> np.ndarray:
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


def write_bytes(path: Path, data: bytes) -> None:
    """`data` to `path`, or DataError naming the file and the reason (ENOSPC, EACCES, ...)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as exc:
        raise DataError(f"--out: cannot write {path} ({exc.strerror or exc})") from None


def encode_jpeg(path: Path, image_bgr: np.ndarray) -> bytes:
    import cv2

    ok, encoded = cv2.imencode(".jpg", image_bgr)
    if not ok:
        raise DataError(f"--out: cannot encode {path} as JPEG ({image_bgr.shape})")
    return encoded.tobytes()


class _Video:
    """The annotated copy and the JSON Lines file of one video, open while its frames come."""

    def __init__(self, out: Path, file: MediaFile, fps: float, size_wh: tuple[int, int], save_images: bool):
        import cv2

        self.jsonl_path = out / f"{file.stem}.jsonl"
        try:
            self.jsonl = open(self.jsonl_path, "w", encoding="utf-8")
        except OSError as exc:
            raise DataError(f"--out: cannot write {self.jsonl_path} ({exc.strerror or exc})") from None
        self.writer, self.path = None, None
        if not save_images:
            return
        for codec, suffix in VIDEO_CODECS:
            path = out / f"{file.stem}{suffix}"
            writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*codec), fps, size_wh)
            if writer.isOpened():
                self.writer, self.path = writer, path
                return
            writer.release()
            path.unlink(missing_ok=True)
        self.jsonl.close()
        codecs = ", ".join(f"{c} {s}" for c, s in VIDEO_CODECS)
        raise DataError(f"--out: this OpenCV cannot write a video ({codecs}) for {file.path}; use --nosave")

    def add(self, record: dict, annotated: np.ndarray | None) -> None:
        try:
            self.jsonl.write(json.dumps(record) + "\n")
        except OSError as exc:
            raise DataError(f"--out: cannot write {self.jsonl_path} ({exc.strerror or exc})") from None
        if self.writer is not None and annotated is not None:
            self.writer.write(annotated)

    def close(self) -> None:
        try:
            self.jsonl.close()
        except OSError as exc:
            raise DataError(f"--out: cannot write {self.jsonl_path} ({exc.strerror or exc})") from None
        if self.writer is not None:
            self.writer.release()
            if not self.path.is_file() or self.path.stat().st_size == 0:
                raise DataError(f"--out: the video {self.path} could not be written (disk full?)")


class PredictionWriter:
    """Writes each frame's results to `out` (see the module docstring); `close()` after the last."""

    def __init__(self, out: Path, names: list[str], save: SaveOptions) -> None:
        self.out, self.names, self.save = out, names, save
        self.video: _Video | None = None
        self.video_file: MediaFile | None = None

    def write(self, frame: Frame, det: torch.Tensor, fps: float = DEFAULT_FPS) -> int:
        """Writes `frame`'s detections det [N, 6] (original pixels); returns N."""
        pixels = frame.pixels
        h, w = pixels.shape[:2]
        records = detection_records(det, self.names)
        name = frame.file.stem if frame.frame is None else f"{frame.file.stem}_{frame.frame}"
        annotated = annotate(pixels, records) if self.save.images else None
        if frame.frame is None:
            self._end_video()
            result = {"image": str(frame.file.path), "width": w, "height": h, "detections": records}
            write_bytes(self.out / f"{name}.json", (json.dumps(result, indent=1) + "\n").encode())
            if annotated is not None:
                path = self.out / f"{name}.jpg"
                write_bytes(path, encode_jpeg(path, annotated))
        else:
            if self.video_file != frame.file:
                self._end_video()
                self.video = _Video(self.out, frame.file, fps, (w, h), self.save.images)
                self.video_file = frame.file
            record = {"video": str(frame.file.path), "frame": frame.frame, "width": w, "height": h}
            self.video.add({**record, "detections": records}, annotated)
        if self.save.txt:
            lines = yolo_label_lines(det, w, h, self.save.conf)
            write_bytes(self.out / "labels" / f"{name}.txt", "".join(f"{line}\n" for line in lines).encode())
        if self.save.crop:
            for k, rec in enumerate(records):
                box = crop_box(rec["box_xyxy"], w, h)
                if box is None:
                    continue
                x1, y1, x2, y2 = box
                path = self.out / "crops" / safe_folder_name(rec["class_name"]) / f"{name}_{k}.jpg"
                write_bytes(path, encode_jpeg(path, pixels[y1:y2, x1:x2]))
        return len(records)

    def _end_video(self) -> None:
        if self.video is not None:
            video, self.video, self.video_file = self.video, None, None
            video.close()

    def close(self) -> None:
        self._end_video()


class Progress:
    """Decides when `predict` logs a progress line: at most one every `interval_s` seconds (never one
    per item), measured on `clock` (seconds, monotonic)."""

    def __init__(self, interval_s: float, clock) -> None:
        self.interval_s, self.clock = interval_s, clock
        self.started = self.last = clock()

    def due(self) -> bool:
        now = self.clock()
        if now - self.last < self.interval_s:
            return False
        self.last = now
        return True

    def line(self, frames_done: int, files_started: int, files_total: int) -> str:
        seconds = max(self.clock() - self.started, 1e-9)
        return (
            f"predict: {frames_done} images/frames done, file {files_started} of {files_total} "
            f"({frames_done / seconds:.1f}/s)"
        )


def out_conflict(out: Path, source: str) -> str | None:
    """Why --out may not be `out` for this source (inside a searched folder, or the folder of the
    inputs), or None. Both are compared resolved."""
    out = out.resolve()
    path = Path(source)
    if is_glob(source) and not path.exists():
        parts = []
        for part in path.parts:
            if any(c in GLOB_CHARACTERS for c in part):
                break
            parts.append(part)
        base, recursive = Path(*parts).resolve() if parts else Path.cwd(), "**" in source
    elif path.is_dir():
        base, recursive = path.resolve(), True
    else:
        base, recursive = path.resolve().parent, False
    if out == base:
        return "is the source folder"
    if recursive and out.is_relative_to(base):
        return "is inside the source folder"
    return None
