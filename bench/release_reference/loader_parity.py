"""Mosaic training samples from one process: the release's dataset against ours with the release's
sampling (the default: region decodes from restart-marker copies of the JPEGs, `--jpeg-restart-cache`,
made in a temporary folder before timing; and the same without the copies), ours with HSV and flips left to the device batch (`--color-aug device`, the
default on CUDA), ours with the opt-in recent-image pool, and both with the RAM cache and with the disk
cache (filled before timing); same JPEGs, same augmentation settings (scratch-low), same shuffled order,
interleaved rounds so that a shared machine's load hits every row alike. Reports samples/s (wall) and CPU
ms per sample (process time).

The device-colour row is what a loader worker does for a GPU; the batch's HSV and flips then run on the
GPU. `--device-cost` also times `data.color.apply_color` on this CPU per sample (what a CPU-only run would
pay instead of the workers' OpenCV, which is why `auto` keeps the workers' path on CPU).

Run in the image of bench/release_reference/Dockerfile (the release is the PyPI package `yolov5`
7.0.14, only there), this checkout on PYTHONPATH:
    python3 /src/bench/release_reference/loader_parity.py --images 300 --imgsz 640
That image is built on the stand-in base, without our native library: name a build of it
(yolov5_smddp/data/native.c, compiled against the same base) with $YOLOV5_SMDDP_NATIVE_LIB, or the
"default" row decodes whole images like the "before issue 25" row (the first line printed says which).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path


def _rows(tasks: dict, iters: int, rounds: int) -> dict[str, dict[str, float]]:
    per_round = max(iters // rounds, 1)
    wall = dict.fromkeys(tasks, 0.0)
    cpu = dict.fromkeys(tasks, 0.0)
    for r in range(rounds):
        for name, step in tasks.items():
            w0, c0 = time.perf_counter(), time.process_time()
            for k in range(r * per_round, (r + 1) * per_round):
                step(k)
            wall[name] += time.perf_counter() - w0
            cpu[name] += time.process_time() - c0
    n = per_round * rounds
    return {
        name: {"samples_per_s": n / wall[name], "cpu_ms_per_sample": 1000 * cpu[name] / n} for name in tasks
    }


def _device_cost_ms(imgsz: int, hyp: dict, batch: int = 16) -> float:
    """CPU ms per sample of data.color.apply_color on a [batch, 3, imgsz, imgsz] batch, one thread."""
    import numpy as np
    import torch

    from yolov5_smddp.data.augment import AugmentParams, draw_color_params
    from yolov5_smddp.data.color import apply_color

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    p = AugmentParams.from_hyp(hyp)
    imgs = torch.from_numpy(rng.integers(0, 256, (batch, imgsz, imgsz, 3), dtype=np.uint8)).permute(
        0, 3, 1, 2
    )
    params = torch.from_numpy(np.stack([draw_color_params(p, rng) for _ in range(batch)]))
    apply_color(imgs, params)  # warm-up
    started = time.process_time()
    apply_color(imgs, params)
    return 1000 * (time.process_time() - started) / batch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--iters", type=int, default=240)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--no-ram", action="store_true", help="leave out the RAM-cache rows")
    parser.add_argument("--no-disk", action="store_true", help="leave out the disk-cache rows")
    parser.add_argument("--device-cost", action="store_true", help="also time apply_color on this CPU")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import cv2
    import numpy as np
    import yaml
    import yolov5  # the release
    from yolov5.utils.dataloaders import LoadImagesAndLabels

    from yolov5_smddp import hostmem
    from yolov5_smddp.benchmarks.data import resolve_data, warm_restart_copies
    from yolov5_smddp.data import augment
    from yolov5_smddp.data.config import load_data_config
    from yolov5_smddp.data.dataset import YoloDataset
    from yolov5_smddp.data.jpeg_roi import region_decoder
    from yolov5_smddp.data.labels import build_label_index
    from yolov5_smddp.data.native import library_path
    from yolov5_smddp.data.pixelcache import DiskPixelCache
    from yolov5_smddp.data.restart_cache import RestartCache

    hostmem.tune_malloc()  # as our CLI does; the release shares the process, so it gets it too
    cv2.setNumThreads(1)
    state = f"{library_path()}" if region_decoder() is not None else "off (whole decodes, cv2.LUT)"
    print(f"native library (JPEG regions, colour table): {state}")
    hyp = yaml.safe_load((Path(yolov5.__file__).parent / "data/hyps/hyp.scratch-low.yaml").read_text())
    with tempfile.TemporaryDirectory(prefix="loader-parity-") as tmp:
        cfg = load_data_config(resolve_data("synthetic", args.images, Path(tmp)))
        train_dir = str(cfg.train[0]) if isinstance(cfg.train, list | tuple) else str(cfg.train)
        index = build_label_index(cfg.train, nc=cfg.nc, root=cfg.root, cache_dir=Path(tmp) / "c", workers=2)
        order = np.random.default_rng(0).permutation(len(index.images))

        def stream(dataset):
            dataset[int(order[-1])]  # warm-up (imports, first allocations)
            if getattr(dataset, "region_decode", True):
                return lambda k: dataset[int(order[k % len(order)])]

            def before(k: int):  # as before issue 25: whole decodes and OpenCV's colour table too
                saved = augment._native_color.get("lib")
                augment._native_color["lib"] = None
                try:
                    return dataset[int(order[k % len(order)])]
                finally:
                    augment._native_color["lib"] = saved

            return before

        copies = RestartCache(Path(tmp) / "restart")  # the trainer's is under its cache folder
        default = YoloDataset(index, args.imgsz, augment=True, hyp=hyp, restart_cache=copies)
        warm_restart_copies(default)  # what the first epoch does
        datasets = {
            "release": LoadImagesAndLabels(
                train_dir, img_size=args.imgsz, batch_size=16, augment=True, hyp=hyp
            ),
            "ours, release sampling (default)": default,
            "ours, --jpeg-restart-cache off": YoloDataset(index, args.imgsz, augment=True, hyp=hyp),
            "ours before issue 25 (whole decodes, cv2.LUT)": YoloDataset(
                index, args.imgsz, augment=True, hyp=hyp, region_decode=False
            ),
            "ours, release sampling, colour on device": YoloDataset(
                index, args.imgsz, augment=True, hyp=hyp, color_on_device=True, restart_cache=copies
            ),
            "ours, --mosaic-partners recent": YoloDataset(
                index, args.imgsz, augment=True, hyp=hyp, mosaic_partners="recent"
            ),
        }
        if not args.no_ram:
            datasets["release, --cache ram"] = LoadImagesAndLabels(
                train_dir, img_size=args.imgsz, batch_size=16, augment=True, hyp=hyp, cache_images="ram"
            )
            for color_on_device in (False, True):
                ours_ram = YoloDataset(
                    index,
                    args.imgsz,
                    augment=True,
                    hyp=hyp,
                    cache_images="ram",
                    color_on_device=color_on_device,
                )
                ours_ram.cache_shard(list(range(len(ours_ram))))
                name = "colour on device, " if color_on_device else ""
                datasets[f"ours, release sampling, {name}--cache ram"] = ours_ram
        if not args.no_disk:  # both caches filled before timing. The release writes .npy files beside the
            # images, and then loads them whatever its cache mode: its disk row gets its own copy of the
            # throwaway dataset, so that the plain release row still decodes JPEGs. Ours: its cache folder.
            copy = Path(tmp) / "release-disk"
            shutil.copytree(Path(train_dir).parents[1], copy)
            datasets["release, --cache disk"] = LoadImagesAndLabels(
                str(copy / Path(train_dir).relative_to(Path(train_dir).parents[1])),
                img_size=args.imgsz,
                batch_size=16,
                augment=True,
                hyp=hyp,
                cache_images="disk",
            )
            for color_on_device in (False, True):
                pixels = DiskPixelCache(Path(tmp) / "pixels", args.imgsz, augment=True)
                ours_disk = YoloDataset(
                    index,
                    args.imgsz,
                    augment=True,
                    hyp=hyp,
                    disk_cache=pixels,
                    color_on_device=color_on_device,
                )
                for i in range(len(ours_disk)):
                    ours_disk.load_image(i)
                name = "colour on device, " if color_on_device else ""
                datasets[f"ours, release sampling, {name}--cache disk"] = ours_disk
        rows = _rows({name: stream(ds) for name, ds in datasets.items()}, args.iters, args.rounds)
    base = rows["release"]["samples_per_s"]
    print(
        f"{'mosaic samples at ' + str(args.imgsz) + ', 1 process':<52} {'samples/s':>10} {'vs release':>10} {'CPU ms/sample':>14}"
    )
    for name, row in rows.items():
        print(
            f"{name:<52} {row['samples_per_s']:>10.1f} {row['samples_per_s'] / base:>9.2f}x "
            f"{row['cpu_ms_per_sample']:>14.2f}"
        )
    device_ms = _device_cost_ms(args.imgsz, hyp) if args.device_cost else None
    if device_ms is not None:
        print(
            f"apply_color on this CPU (1 thread): {device_ms:.2f} ms per sample (a CPU-only run would pay this)"
        )
    if args.json is not None:
        summary = {"images": args.images, "imgsz": args.imgsz, "rows": rows, "apply_color_cpu_ms": device_ms}
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
