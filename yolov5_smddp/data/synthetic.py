"""Generated YOLO-format detection tasks: deterministic, small and learnable.

Three classes — rectangle, ellipse, triangle — drawn as solid shapes in random colours on textured,
noisy backgrounds; each label is the tight box around the shape's drawn pixels. Layout:
root/images/{train,val}/*.jpg, root/labels/{train,val}/*.txt and root/data.yaml (path: '.').

- `make_default_dataset`: the embedded default dataset (1-4 objects of 12-45% of each side).
- `make_shapes_dataset`: the convergence benchmark's task (bench/convergence.sh): harder — 1-7 objects
  of sizes spread log-uniformly, aspect ratios 1:3..3:1, about a quarter of them small (4-8% of the
  short side), overlapping a little more.
"""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np

CLASS_NAMES = ("rectangle", "ellipse", "triangle")
DATASET_VERSION = 1
"""Bump whenever the generated files change, so caches holding an older copy are not reused."""
_MAX_OBJECTS = 4
_JPEG_QUALITY = 90
_TEXTURE = 20.0
_FINE_NOISE = 10.0


def _noise_bank(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """float32 [2h, 2w, 3]: mid-frequency texture + fine noise, drawn once per split; each image takes a
    random crop (generating fresh noise per image costs more than the JPEG encode)."""
    texture = rng.uniform(-_TEXTURE, _TEXTURE, (max(h // 4, 1), max(w // 4, 1), 3)).astype(np.float32)
    bank = cv2.resize(texture, (2 * w, 2 * h), interpolation=cv2.INTER_LINEAR)
    bank += rng.uniform(-_FINE_NOISE, _FINE_NOISE, bank.shape).astype(np.float32)
    return bank


def _background(rng: np.random.Generator, h: int, w: int, bank: np.ndarray) -> np.ndarray:
    """Smooth random colour field + a crop of the noise bank (uint8 [h, w, 3]); at 640x480 the JPEG is
    ~70 KB, like a photo, so decode costs are realistic."""
    coarse = rng.integers(40, 216, (4, 5, 3)).astype(np.float32)
    img = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC)
    dy, dx = int(rng.integers(0, h + 1)), int(rng.integers(0, w + 1))
    img += bank[dy : dy + h, dx : dx + w]
    return img.clip(0, 255).astype(np.uint8)


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _draw_object(img: np.ndarray, cls: int, box: np.ndarray, colour: tuple[int, int, int], rng) -> np.ndarray:
    """Draw class `cls` inside box (x1, y1, x2, y2 int px); returns the tight xyxy box of the drawn pixels."""
    x1, y1, x2, y2 = (int(v) for v in box)
    bw, bh = x2 - x1, y2 - y1
    mask = np.zeros((bh + 1, bw + 1), np.uint8)  # drawn in box coordinates
    if cls == 0:
        cv2.rectangle(mask, (0, 0), (bw, bh), 255, thickness=-1)
    elif cls == 1:
        cv2.ellipse(mask, (bw // 2, bh // 2), (bw // 2, bh // 2), 0, 0, 360, 255, -1)
    else:
        apex_x = int(rng.integers(0, bw + 1))
        cv2.fillPoly(mask, [np.array([[apex_x, 0], [0, bh], [bw, bh]], np.int32)], 255)
    drawn = mask > 0
    img[y1 : y1 + bh + 1, x1 : x1 + bw + 1][drawn] = colour
    ys, xs = np.nonzero(drawn)
    return np.array([x1 + xs.min(), y1 + ys.min(), x1 + xs.max() + 1, y1 + ys.max() + 1], np.float64)


def _default_size(rng: np.random.Generator, h: int, w: int) -> tuple[int, int]:
    return int(rng.uniform(0.12, 0.45) * w), int(rng.uniform(0.12, 0.45) * h)


def _varied_size(rng: np.random.Generator, h: int, w: int) -> tuple[int, int]:
    """(w, h) of one object of the shapes task: a quarter small (side 4-8% of the short image side),
    the rest log-uniform 8-60%; aspect ratio log-uniform in 1:3..3:1; at least 4 px per side."""
    short = min(h, w)
    small = rng.random() < 0.25
    side = rng.uniform(0.04, 0.08) if small else math.exp(rng.uniform(math.log(0.08), math.log(0.6)))
    aspect = math.exp(rng.uniform(-math.log(3), math.log(3)))
    bw = min(max(int(side * short * math.sqrt(aspect)), 4), w - 2)
    bh = min(max(int(side * short / math.sqrt(aspect)), 4), h - 2)
    return bw, bh


def _make_image(
    rng: np.random.Generator,
    h: int,
    w: int,
    bank: np.ndarray,
    size=_default_size,
    max_objects: int = _MAX_OBJECTS,
    max_iou: float = 0.1,
) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    img = _background(rng, h, w, bank)
    objects: list[tuple[int, np.ndarray]] = []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _attempt in range(10):
            bw, bh = size(rng, h, w)
            x1, y1 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            box = np.array([x1, y1, x1 + bw, y1 + bh], np.float64)
            if all(_iou(box, other) < max_iou for _, other in objects):
                break
        else:
            continue
        cls = int(rng.integers(0, len(CLASS_NAMES)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        objects.append((cls, _draw_object(img, cls, box, colour, rng)))
    return img, objects


def _write_split(
    root: Path, split: str, n: int, w: int, h: int, rng: np.random.Generator, **shape_options
) -> None:
    images, labels = root / "images" / split, root / "labels" / split
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    bank = _noise_bank(rng, h, w)
    for i in range(n):
        img, objects = _make_image(rng, h, w, bank, **shape_options)
        cv2.imwrite(str(images / f"{i:05d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, _JPEG_QUALITY])
        lines = []
        for cls, (x1, y1, x2, y2) in objects:
            lines.append(
                f"{cls} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}"
            )
        (labels / f"{i:05d}.txt").write_text("\n".join(lines) + "\n")


def make_default_dataset(
    root: Path, *, n_train: int = 128, n_val: int = 32, imgsz: int = 256, seed: int = 0
) -> Path:
    """Write the dataset under `root` (images imgsz x imgsz*3/4 JPEG) and return its data.yaml path.

    Deterministic for a given (n_train, n_val, imgsz, seed). Existing files are overwritten.
    """
    root = Path(root)
    w, h = int(imgsz), int(imgsz) * 3 // 4
    rng = np.random.default_rng(seed)
    _write_split(root, "train", n_train, w, h, rng)
    if n_val:
        _write_split(root, "val", n_val, w, h, rng)
    return _write_yaml(root, n_val)


def make_shapes_dataset(
    root: Path, *, n_train: int = 400, n_val: int = 100, width: int = 256, height: int = 192, seed: int = 0
) -> Path:
    """Write the convergence benchmark's shapes task under `root` (see the module docstring) and return
    its data.yaml path. Deterministic for given arguments; existing files are overwritten."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    options = {"size": _varied_size, "max_objects": 7, "max_iou": 0.2}
    _write_split(root, "train", n_train, int(width), int(height), rng, **options)
    if n_val:
        _write_split(root, "val", n_val, int(width), int(height), rng, **options)
    return _write_yaml(root, n_val)


def _write_yaml(root: Path, n_val: int) -> Path:
    yaml_path = root / "data.yaml"
    names = "\n".join(f"  - {name}" for name in CLASS_NAMES)
    val = "images/val" if n_val else "images/train"
    yaml_path.write_text(
        f"path: .\ntrain: images/train\nval: {val}\nnc: {len(CLASS_NAMES)}\nnames:\n{names}\n"
    )
    return yaml_path
