"""The "textured" convergence task (issue 38): large filled shapes on a blurred-noise background.

  python -m bench.make_textured_dataset OUT_DIR [--n-train 1000 --n-val 200 --width 320 --height 240 --seed 0]

Per image: a background of uniform random RGB noise at 1/8 of the resolution, upscaled (bicubic) to
full size and Gaussian-blurred (sigma 3 px); then 1-5 filled shapes, each of a class drawn uniformly
among disk / axis-aligned square / upright triangle (apex at the top centre, base along the bottom), a
side drawn uniformly in [20, 160) px (whole pixels), a position uniform with the shape fully inside the
image, and a random solid colour. Later shapes may cover earlier ones. Each label is the shape's
bounding square (x0, y0, x0 + side, y0 + side). JPEG quality 90.

Writes OUT_DIR/images/{train,val}/*.jpg, OUT_DIR/labels/{train,val}/*.txt and OUT_DIR/data.yaml
(path: '.'), deterministic per (sizes, seed); nothing else is touched.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cv2
import numpy as np

CLASS_NAMES = ("disk", "square", "triangle")
MIN_SIDE, MAX_SIDE = 20, 160  # side uniform in [MIN_SIDE, MAX_SIDE) px
MAX_OBJECTS = 5
NOISE_DOWNSCALE = 8
BLUR_SIGMA = 3.0
JPEG_QUALITY = 90


def textured_background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """uint8 [height, width, 3]: uniform noise at 1/8 resolution, bicubic to full size, blurred (sigma 3)."""
    small = rng.uniform(0, 255, (max(height // NOISE_DOWNSCALE, 1), max(width // NOISE_DOWNSCALE, 1), 3))
    img = cv2.resize(small.astype(np.float32), (width, height), interpolation=cv2.INTER_CUBIC)
    img = cv2.GaussianBlur(img, (0, 0), sigmaX=BLUR_SIGMA, sigmaY=BLUR_SIGMA)
    return np.rint(img.clip(0, 255)).astype(np.uint8)


def shape_mask(cls: int, side: int) -> np.ndarray:
    """bool [side, side]: the pixels (the disk's by their centres, the triangle's by their rows' lower edge) of class `cls` inscribed in a side x side square:
    0 the disk of diameter `side`, 1 the whole square, 2 the triangle with its apex at the top centre and
    its base along the bottom edge."""
    c = np.arange(side, dtype=np.float64) + 0.5  # pixel centres
    x, y = c[None, :], c[:, None]
    if cls == 0:
        r = side / 2
        return (x - r) ** 2 + (y - r) ** 2 <= r * r
    if cls == 1:
        return np.ones((side, side), bool)
    if cls == 2:  # half-width (at a row's lower edge) from 1/2 px at the top to side/2 at the bottom
        return np.abs(x - side / 2) <= (y + 0.5) / 2
    raise ValueError(f"shape_mask: class {cls} is not one of 0..{len(CLASS_NAMES) - 1}")


def make_image(
    rng: np.random.Generator, height: int, width: int
) -> tuple[np.ndarray, list[tuple[int, int, int, int]]]:
    """One image and its objects [(cls, x0, y0, side)] in drawing order (pixels)."""
    if min(height, width) < MAX_SIDE:
        raise ValueError(f"make_image: {width}x{height} is smaller than the largest side {MAX_SIDE - 1} px")
    img = textured_background(rng, height, width)
    objects = []
    for _ in range(int(rng.integers(1, MAX_OBJECTS + 1))):
        cls = int(rng.integers(0, len(CLASS_NAMES)))
        side = int(rng.integers(MIN_SIDE, MAX_SIDE))
        x0, y0 = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
        colour = rng.integers(0, 256, 3).astype(np.uint8)
        img[y0 : y0 + side, x0 : x0 + side][shape_mask(cls, side)] = colour
        objects.append((cls, x0, y0, side))
    return img, objects


def _write_split(root: Path, split: str, n: int, width: int, height: int, rng: np.random.Generator) -> None:
    images, labels = root / "images" / split, root / "labels" / split
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        img, objects = make_image(rng, height, width)
        if not cv2.imwrite(str(images / f"{i:05d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY]):
            raise OSError(f"cannot write {images / f'{i:05d}.jpg'}")
        lines = [
            f"{cls} {(x0 + side / 2) / width:.6f} {(y0 + side / 2) / height:.6f} "
            f"{side / width:.6f} {side / height:.6f}"
            for cls, x0, y0, side in objects
        ]
        (labels / f"{i:05d}.txt").write_text("\n".join(lines) + "\n")


def make_textured_dataset(
    root: Path, *, n_train: int = 1000, n_val: int = 200, width: int = 320, height: int = 240, seed: int = 0
) -> Path:
    """Write the textured task under `root` (see the module docstring); returns its data.yaml path.
    Deterministic for given arguments; existing files of the same names are overwritten."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    _write_split(root, "train", int(n_train), int(width), int(height), rng)
    if n_val:
        _write_split(root, "val", int(n_val), int(width), int(height), rng)
    names = "\n".join(f"  - {name}" for name in CLASS_NAMES)
    val = "images/val" if n_val else "images/train"
    yaml_path = root / "data.yaml"
    yaml_path.write_text(
        f"path: .\ntrain: images/train\nval: {val}\nnc: {len(CLASS_NAMES)}\nnames:\n{names}\n"
    )
    return yaml_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--n-train", type=int, default=1000)
    parser.add_argument("--n-val", type=int, default=200)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        print(
            make_textured_dataset(
                args.out_dir,
                n_train=args.n_train,
                n_val=args.n_val,
                width=args.width,
                height=args.height,
                seed=args.seed,
            )
        )
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
