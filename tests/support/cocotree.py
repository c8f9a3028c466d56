"""Test support: small COCO instances datasets generated on the fly (images + one JSON).

`from cocotree import write_coco_dataset` (tests/support is on the test path). Category ids are
non-contiguous on purpose (7, 3, 90 listed out of order), some annotations are crowd regions, some
images have no annotation (backgrounds).
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np

CATEGORIES = [{"id": 7, "name": "seven"}, {"id": 3, "name": "three"}, {"id": 90, "name": "ninety"}]
"""Listed out of order: class indices are by ascending id, 3 -> 0, 7 -> 1, 90 -> 2."""
CLASS_OF = {3: 0, 7: 1, 90: 2}


def write_coco_dataset(
    root: Path,
    *,
    n_images: int = 8,
    seed: int = 0,
    image_folder: str = "images",
    json_name: str = "instances.json",
    relative_to_json: bool = True,
    crowd_every: int = 3,
    backgrounds: int = 1,
    first_id: int = 1000,
) -> Path:
    """Write `n_images` JPEGs under root/<image_folder>/ and root/<json_name>, return the JSON's path.

    Images vary in size (so rectangular batches differ); each non-background image has 1-4 boxes drawn
    as filled rectangles whose bright RGB channel is their class index (`ColourOracle` reads them back), every `crowd_every`-th annotation is a crowd region (0: none). With
    relative_to_json, file_name is "<image_folder>/x.jpg" (relative to the JSON's folder), else "x.jpg"
    (relative to the image folder). Image ids start at `first_id` and step by 3 (never positions).
    """
    rng = np.random.default_rng(seed)
    root = Path(root)
    (root / image_folder).mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for k in range(n_images):
        h, w = int(rng.integers(90, 160)), int(rng.integers(90, 160))
        img = np.full((h, w, 3), 40, np.uint8) + rng.integers(0, 30, (h, w, 3), dtype=np.uint8)
        image_id = first_id + 3 * k
        name = f"im{k:03d}.jpg"
        images.append(
            {
                "id": image_id,
                "file_name": f"{image_folder}/{name}" if relative_to_json else name,
                "width": w,
                "height": h,
            }
        )
        n_boxes = 0 if k < backgrounds else int(rng.integers(1, 5))
        for _ in range(n_boxes):
            bw, bh = float(rng.uniform(15, w / 2)), float(rng.uniform(15, h / 2))
            x, y = float(rng.uniform(0, w - bw)), float(rng.uniform(0, h - bh))
            category = CATEGORIES[int(rng.integers(0, len(CATEGORIES)))]["id"]
            colour = [60, 60, 60]  # BGR: the class's RGB channel bright (an oracle can read it back)
            colour[2 - CLASS_OF[category]] = 230
            cv2.rectangle(img, (int(x), int(y)), (int(x + bw), int(y + bh)), colour, -1)
            crowd = int(crowd_every > 0 and (len(annotations) + 1) % crowd_every == 0)
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": category,
                    "bbox": [round(x, 2), round(y, 2), round(bw, 2), round(bh, 2)],
                    "area": round(bw * bh, 2),
                    "iscrowd": crowd,
                    "segmentation": [[x, y, x + bw, y, x + bw, y + bh, x, y + bh]],
                }
            )
        cv2.imwrite(str(root / image_folder / name), img)
    path = root / json_name
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"info": {}, "images": images, "annotations": annotations, "categories": CATEGORIES}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


class ColourOracle:
    """A stand-in detector for the images above: per class, the connected regions where that class's
    RGB channel is bright become detections (xc, yc, w, h, objectness, class probabilities) in network
    input pixels, with scores drawn from the region's size; two low-score false positives per image.
    Overlapping rectangles of a class merge, so its boxes are good but not perfect."""

    nc = 3

    def __new__(cls):
        import torch

        class _Oracle(torch.nn.Module):
            nc = 3

            def __init__(self) -> None:
                super().__init__()
                self.register_buffer("stride", torch.tensor([8.0, 16.0, 32.0]))
                self.names = ["three", "seven", "ninety"]

            def forward(self, x):
                out = []
                for img in x.float().cpu().numpy():
                    rows = []
                    h, w = img.shape[1:]
                    for c in range(3):
                        others = np.delete(img, c, 0).max(0)
                        mask = ((img[c] > 0.6) & (others < 0.45)).astype(np.uint8)
                        n, _, stats, _ = cv2.connectedComponentsWithStats(mask)
                        for x0, y0, bw, bh, area in stats[1:].tolist():
                            if area < 20:
                                continue
                            score = 0.3 + 0.7 * ((area * 7919) % 1000) / 1000
                            probs = [0.05] * 3
                            probs[c] = 0.9
                            rows.append([x0 + bw / 2, y0 + bh / 2, bw, bh, score, *probs])
                    for k in range(2):
                        rows.append(
                            [w * (0.3 + 0.4 * k), h * 0.5, w / 5, h / 6, 0.1 + 0.05 * k, 0.6, 0.3, 0.1]
                        )
                    out.append(torch.tensor(rows, dtype=torch.float32))
                n = max(len(r) for r in out)
                pred = torch.zeros(len(out), n, 8)
                for b, r in enumerate(out):
                    pred[b, : len(r)] = r
                return pred.to(x.device), None

        return _Oracle()
