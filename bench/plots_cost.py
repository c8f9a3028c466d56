"""Cost of the per-epoch plots on a COCO-like validation: N images, 80 classes, up to 300 detections per
image at the validation threshold (0.001). Prints the seconds for the recorder's matching during
validation and for writing the files after it.

    python3 bench/plots_cost.py [--images 500] [--nc 80]

CPU seconds are the cost on a machine of one's own; wall seconds grow with whatever else runs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import torch

from yolov5_smddp.plots import ValidationPlots, after_epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--nc", type=int, default=80)
    parser.add_argument("--dets", type=int, default=300)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        images, shapes, labels = [], [], []
        for i in range(args.images):
            path = folder / f"im{i}.jpg"
            if i < 16:
                cv2.imwrite(str(path), rng.integers(0, 255, (480, 640, 3), dtype=np.uint8))
            images.append(path)
            shapes.append((480, 640))
            n = int(rng.integers(1, 15))
            boxes = rng.uniform(0.1, 0.9, (n, 4)) * [1, 1, 0.3, 0.3]
            labels.append(np.concatenate([rng.integers(0, args.nc, (n, 1)), boxes], 1).astype(np.float32))
        recorder = ValidationPlots(images, np.array(shapes), labels, args.nc)
        dets = []
        for _ in labels:
            xy = rng.uniform(0, 600, (args.dets, 2))
            wh = rng.uniform(10, 200, (args.dets, 2))
            d = np.concatenate(
                [
                    xy,
                    xy + wh,
                    rng.uniform(0.001, 1, (args.dets, 1)),
                    rng.integers(0, args.nc, (args.dets, 1)),
                ],
                1,
            )
            dets.append(torch.from_numpy(d).float())
        started, cpu = time.perf_counter(), time.process_time()
        for path, d in zip(images, dets):
            recorder.on_image(str(path), d)
        matching, matching_cpu = time.perf_counter() - started, time.process_time() - cpu
        rows = [
            {"epoch": e, "box_loss": 0.1, "obj_loss": 0.1, "cls_loss": 0.1, "mAP50": 0.1 * e}
            for e in range(1, 50)
        ]
        out = folder / "out"
        cpu = time.process_time()
        writing = after_epoch(out, rows, recorder, [f"class{i}" for i in range(args.nc)])
        writing_cpu = time.process_time() - cpu
        files = sorted(p.name for p in out.iterdir())
    print(
        f"plots cost: {args.images} images x {args.dets} detections, nc={args.nc}: matching during validation "
        f"{matching:.2f} s wall / {matching_cpu:.2f} s CPU ({1000 * matching_cpu / args.images:.2f} ms CPU/image), "
        f"writing {writing:.2f} s wall / {writing_cpu:.2f} s CPU; files {files}"
    )


if __name__ == "__main__":
    main()
