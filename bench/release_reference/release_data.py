"""Our input pipeline against the release's, side by side in one process: the label scan (no cache), and
mosaic samples at 640 px from one process, on the same synthetic dataset as `yolov5-smddp bench data`
(2,000 640x480 JPEGs). The release is the PyPI package `yolov5` 7.0.14 (only in the throwaway image of
bench/release_reference/Dockerfile); this checkout must be on PYTHONPATH.

The dataset is written to a temporary folder (the release writes its labels.cache there); samples are
drawn in the same shuffled order from both, in interleaved rounds (`yolov5_smddp.benchmarks.data.interleaved_rates`).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import cv2
    import yaml
    import yolov5  # the release
    from yolov5.utils.dataloaders import LoadImagesAndLabels

    from yolov5_smddp import hostmem
    from yolov5_smddp.benchmarks.data import _sample_stream, interleaved_rates, resolve_data
    from yolov5_smddp.data.config import load_data_config
    from yolov5_smddp.data.dataset import YoloDataset
    from yolov5_smddp.data.labels import build_label_index

    hostmem.tune_malloc()  # as our CLI does; the release shares the process, so it gets it too
    hyp = yaml.safe_load((Path(yolov5.__file__).parent / "data/hyps/hyp.scratch-low.yaml").read_text())
    with tempfile.TemporaryDirectory(prefix="release-data-") as tmp:
        yaml_path = resolve_data("synthetic", args.images, Path(tmp))
        cfg = load_data_config(yaml_path)
        train_dir = str(cfg.train[0]) if isinstance(cfg.train, list | tuple) else str(cfg.train)

        start = time.perf_counter()
        index = build_label_index(
            cfg.train, nc=cfg.nc, root=cfg.root, cache_dir=Path(tmp) / "ours-cache", workers=8
        )
        ours_scan = index.report.found / (time.perf_counter() - start)
        start = time.perf_counter()
        theirs = LoadImagesAndLabels(train_dir, img_size=args.imgsz, batch_size=16, augment=True, hyp=hyp)
        theirs_scan = len(theirs) / (time.perf_counter() - start)

        cv2.setNumThreads(1)
        ours = YoloDataset(index, args.imgsz, augment=True, hyp=None)
        rates = interleaved_rates(
            {"ours": _sample_stream(ours), "release": _sample_stream(theirs)}, args.iters, args.rounds
        )
    result = {
        "images": args.images,
        "imgsz": args.imgsz,
        "label_scan_pairs_per_s": {"ours": ours_scan, "release": theirs_scan},
        "mosaic_samples_per_s_1proc": {k: v[0] for k, v in rates.items()},
        "mosaic_samples_per_s_1proc_best_round": {k: v[1] for k, v in rates.items()},
    }
    m = result["mosaic_samples_per_s_1proc"]
    print(
        f"label scan, no cache: ours {ours_scan:,.0f} pairs/s, release {theirs_scan:,.0f} pairs/s "
        f"({ours_scan / theirs_scan:.2f}x)"
    )
    print(
        f"mosaic at {args.imgsz}, 1 process: ours {m['ours']:.1f} samples/s, release {m['release']:.1f} "
        f"samples/s ({m['ours'] / m['release']:.2f}x)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
