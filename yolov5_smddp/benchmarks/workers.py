"""`yolov5-smddp bench workers`: training-loader throughput (samples/s) per DataLoader worker count,
and the smallest count within 5% of the best (more workers cost memory and start-up time)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from yolov5_smddp.benchmarks.data import loader_rate, resolve_data
from yolov5_smddp.data.config import load_data_config
from yolov5_smddp.data.imageinfo import DEFAULT_MAX_PIXELS
from yolov5_smddp.data.labels import scan_workers
from yolov5_smddp.train.data_wiring import scan_split

RECOMMEND_WITHIN = 0.05


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default="synthetic", help="data.yaml, or 'synthetic' (default)")
    parser.add_argument(
        "--workers", default="0,2,4,8", help="comma-separated worker counts (default 0,2,4,8)"
    )
    parser.add_argument("--imgsz", type=int, default=640, help="network input size (default 640)")
    parser.add_argument("--batch-size", type=int, default=16, help="batch size per rank (default 16)")
    parser.add_argument("--iters", type=int, default=160, help="samples per measurement")
    parser.add_argument("--scan-images", type=int, default=400, help="synthetic dataset size")
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")


def recommend(rates: dict[int, float], within: float = RECOMMEND_WITHIN) -> int:
    """The smallest worker count whose throughput is within `within` of the best."""
    best = max(rates.values())
    return min(w for w, rate in rates.items() if rate >= (1 - within) * best)


def run(args: argparse.Namespace) -> int:
    from yolov5_smddp.data.dataset import YoloDataset  # cv2: not imported by `yolov5-smddp -h` (cli.py)

    counts = [int(w) for w in str(args.workers).split(",") if w.strip()]
    with tempfile.TemporaryDirectory(prefix="yolov5-smddp-bench-") as tmp:
        cfg = load_data_config(resolve_data(args.data, args.scan_images, Path(tmp)))
        # the training's one label scan (data_pipeline.scan_split)
        index = scan_split(
            cfg,
            "train",
            cache_dir=Path(tmp) / "cache",
            workers=scan_workers(os.cpu_count() or 1),
            max_pixels=DEFAULT_MAX_PIXELS,
        )
        rates = {}
        for workers in counts:
            dataset = YoloDataset(index, args.imgsz, augment=True, hyp=None)
            rates[workers] = loader_rate(
                dataset, workers=workers, batch_size=args.batch_size, iters=args.iters
            )
    best = recommend(rates)
    print(f"{'workers':>8}{'samples/s':>12}")
    for workers, rate in rates.items():
        print(f"{workers:>8}{rate:>12.1f}{'  <- recommended' if workers == best else ''}")
    if args.json is not None:
        payload = {
            "imgsz": args.imgsz,
            "batch_size": args.batch_size,
            "samples_per_s": rates,
            "recommended": best,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0
