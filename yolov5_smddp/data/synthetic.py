"""The embedded default dataset: a deterministic, small, learnable YOLO-format detection task.

Three classes — rectangle, ellipse, triangle — drawn as solid shapes in random colours and sizes on
textured, noisy backgrounds; each label is the tight box around the shape's drawn pixels. Layout:
root/images/{train,val}/*.jpg, root/labels/{train,val}/*.txt and root/data.yaml (path: '.').
"""

from __future__ import annotations

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


def _make_image(
    rng: np.random.Generator, h: int, w: int, bank: np.ndarray
) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    img = _background(rng, h, w, bank)
    objects: list[tuple[int, np.ndarray]] = []
    for _ in range(int(rng.integers(1, _MAX_OBJECTS + 1))):
        for _attempt in range(10):
            bw = int(rng.uniform(0.12, 0.45) * w)
            bh = int(rng.uniform(0.12, 0.45) * h)
            x1, y1 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            box = np.array([x1, y1, x1 + bw, y1 + bh], np.float64)
            if all(_iou(box, other) < 0.1 for _, other in objects):
                break
        else:
            continue
        cls = int(rng.integers(0, len(CLASS_NAMES)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        objects.append((cls, _draw_object(img, cls, box, colour, rng)))
    return img, objects


def _write_split(root: Path, split: str, n: int, w: int, h: int, rng: np.random.Generator) -> None:
    images, labels = root / "images" / split, root / "labels" / split
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    bank = _noise_bank(rng, h, w)
    for i in range(n):
        img, objects = _make_image(rng, h, w, bank)
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
    yaml_path = root / "data.yaml"
    names = "\n".join(f"  - {name}" for name in CLASS_NAMES)
    val = "images/val" if n_val else "images/train"
    yaml_path.write_text(
        f"path: .\ntrain: images/train\nval: {val}\nnc: {len(CLASS_NAMES)}\nnames:\n{names}\n"
    )
    return yaml_path
