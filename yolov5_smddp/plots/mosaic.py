"""Batch mosaics with OpenCV: up to 16 images in a grid, each with its boxes and class names (and scores
for predictions) — the quickest check that labels and augmentations are right."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np

from yolov5_smddp.files.atomic import atomic_write

MAX_IMAGES = 16
MAX_SIDE = 1920  # the whole mosaic's longest side


def class_colour(c: int) -> tuple[int, int, int]:
    """A fixed BGR colour per class."""
    return ((37 * c + 40) % 256, (97 * c + 200) % 256, (173 * c + 120) % 256)


def batch_mosaic(
    images: Sequence[np.ndarray],
    boxes: Sequence[np.ndarray],
    names: Sequence[str],
    titles: Sequence[str] = (),
) -> np.ndarray:
    """images: BGR uint8 [h, w, 3] each; boxes: per image float [n, 5] (class, x1, y1, x2, y2) in that
    image's pixels, or [n, 6] with a score last. Returns one BGR uint8 image, tiles of the largest image's
    size (smaller ones padded), scaled so the mosaic's longest side is at most MAX_SIDE."""
    images, boxes = list(images)[:MAX_IMAGES], list(boxes)[:MAX_IMAGES]
    n = max(len(images), 1)
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    th = max((im.shape[0] for im in images), default=64)
    tw = max((im.shape[1] for im in images), default=64)
    scale = min(1.0, MAX_SIDE / max(rows * th, cols * tw))
    th, tw = max(int(th * scale), 1), max(int(tw * scale), 1)
    mosaic = np.full((rows * th, cols * tw, 3), 255, np.uint8)
    for k, (image, image_boxes) in enumerate(zip(images, boxes)):
        r, c = divmod(k, cols)
        tile = cv2.resize(image, (int(image.shape[1] * scale), int(image.shape[0] * scale)))
        for row in np.asarray(image_boxes, dtype=np.float64).reshape(
            -1, np.asarray(image_boxes).shape[-1] if len(image_boxes) else 5
        ):
            cls = int(row[0])
            x1, y1, x2, y2 = (int(round(v * scale)) for v in row[1:5])
            colour = class_colour(cls)
            cv2.rectangle(tile, (x1, y1), (x2, y2), colour, 1 if scale < 0.5 else 2)
            label = names[cls] if 0 <= cls < len(names) else str(cls)
            if len(row) > 5:
                label = f"{label} {row[5]:.2f}"
            cv2.putText(
                tile, label, (x1, max(y1 - 3, 9)), cv2.FONT_HERSHEY_SIMPLEX, 0.35, colour, 1, cv2.LINE_AA
            )
        if k < len(titles):
            cv2.putText(
                tile,
                titles[k][:40],
                (3, tile.shape[0] - 4),
                cv2.FONT_HERSHEY_SIMPLEX,
                0.35,
                (255, 255, 255),
                1,
                cv2.LINE_AA,
            )
        mosaic[r * th : r * th + tile.shape[0], c * tw : c * tw + tile.shape[1]] = tile
        cv2.rectangle(mosaic, (c * tw, r * th), ((c + 1) * tw - 1, (r + 1) * th - 1), (255, 255, 255), 1)
    return mosaic


def write_jpeg(path: Path, image: np.ndarray, quality: int = 90) -> Path:
    ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError(f"{path}: OpenCV could not encode the image")
    with atomic_write(path) as handle:
        handle.write(data.tobytes())
    return path


def training_batch_boxes(targets: np.ndarray, index: int, height: int, width: int) -> np.ndarray:
    """Rows (image, class, xc, yc, w, h normalised) of one image of a training batch → [n, 5]
    (class, x1, y1, x2, y2) pixels."""
    mine = targets[targets[:, 0] == index]
    xc, yc, w, h = mine[:, 2] * width, mine[:, 3] * height, mine[:, 4] * width, mine[:, 5] * height
    return np.stack([mine[:, 1], xc - w / 2, yc - h / 2, xc + w / 2, yc + h / 2], 1)
