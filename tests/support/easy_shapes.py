"""A detection task small models learn in a few hundred steps on a CPU: 64x64 images, one or two squares
per image on a grey, slightly noisy background, the class given by the square's colour (red, green,
blue). For fine-tuning tests, where a pretrained model must be good after a short training."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

NAMES = ("red", "green", "blue")
_COLOURS = ((40, 40, 220), (40, 200, 40), (220, 60, 40))  # BGR


def make_easy_dataset(
    root: Path, *, n_train: int, n_val: int, seed: int, size: int = 64, classes: int = 3
) -> Path:
    """Write root/images/{train,val}, root/labels/{train,val} and root/data.yaml; returns data.yaml.
    With `classes` < 3 only the first colours are drawn."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        images, labels = Path(root) / "images" / split, Path(root) / "labels" / split
        images.mkdir(parents=True, exist_ok=True)
        labels.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            img = np.full((size, size, 3), 128, np.uint8)
            img = (img + rng.normal(0, 6, img.shape)).clip(0, 255).astype(np.uint8)
            rows = []
            for _ in range(int(rng.integers(1, 3))):
                side = int(rng.integers(size // 4, size // 2))
                x, y = (int(v) for v in rng.integers(0, size - side, 2))
                cls = int(rng.integers(0, classes))
                img[y : y + side, x : x + side] = _COLOURS[cls]
                rows.append(
                    f"{cls} {(x + side / 2) / size:.6f} {(y + side / 2) / size:.6f} {side / size:.6f} {side / size:.6f}"
                )
            cv2.imwrite(str(images / f"{i:04d}.png"), img)
            (labels / f"{i:04d}.txt").write_text("\n".join(rows) + "\n")
    yaml_path = Path(root) / "data.yaml"
    yaml_path.write_text(
        "path: .\ntrain: images/train\nval: images/val\nnames:\n"
        + "".join(f"  - {n}\n" for n in NAMES[:classes])
    )
    return yaml_path
