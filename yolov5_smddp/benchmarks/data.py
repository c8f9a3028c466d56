"""`yolov5-smddp bench data`: mosaic-pipeline samples/s (one process, and N loader workers) and
label-scan / cache-load files/s.

`--data synthetic` (the default) writes a benchmark dataset of 640x480 JPEGs (`--scan-images`, 2,000)
to a temporary folder. The mosaic pipeline is measured twice in the same run — four decodes per sample
(the release's sampling, the default) and partners from the recently decoded pool (`--mosaic-partners
recent`) — so the two numbers share the machine's load; shared machines are noisy, compare within one
run. Beside them: a plain decode rate, and the decode-only ceiling — the same four decodes per sample
(the default's mosaic plan, decode flag and decoder) and nothing else, which no four-decode pipeline can
exceed — with each pipeline's fraction of it (`*_of_ceiling`; the recent pool decodes one image per
sample, so it can exceed 1). The default decodes only the region of each image its tile shows
(`data.jpeg_roi`) where it can: its own ceiling is `region_decode_ceiling_*` (the default's plans and
geometry, the region decodes and file reads only; `*_of_region_ceiling`), and the same pipeline with
whole decodes (as before issue 25) is the `*_random_whole` row. The default's region decodes read
restart-marker copies of the JPEGs (`data.restart_cache`, in a temporary folder here, made before the
timed rounds: `jpeg_restart_transcode_ms_per_image` is that one-time cost, CPU time per image, and
`jpeg_restart_copy_bytes_of_originals` their size); the same pipeline decoding regions from the
original files is the `*_random_no_restart` row. Every 1-process row also has its CPU time per
sample or image (`*_cpu_ms`, this process's CPU time: on a shared machine steadier than the rate). When the release's package (`yolov5`, only in the throwaway image of
bench/release_reference/) is importable and the data is synthetic, the release's `LoadImagesAndLabels`
(scratch-low) is measured the same way (`release_mosaic_*` rows). All take turns in short rounds
(`--rounds`) so load changes hit them alike; overall and best-round rates are reported. The scan row
deletes and rebuilds our label cache (a cold build is what it measures). The `coco_*` rows time the index
of a generated COCO instances JSON of train2017's size (`bench.coco_index`): a cold build (hash, parse,
cached arrays written) and a warm load, each in a fresh process with its peak RSS. The `gpu_path_<device>_*`
rows measure `train --loader gpu` (`gpu_path_rows`): the loader workers only read bytes, the device
decodes and augments (`--gpu-device`, default cuda when present, else the CPU device).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default="synthetic", help="data.yaml, or 'synthetic' (default)")
    parser.add_argument("--imgsz", type=int, default=640, help="network input size (default 640)")
    parser.add_argument("--workers", type=int, default=2, help="loader workers for the multi-process row")
    parser.add_argument("--iters", type=int, default=300, help="samples per pipeline measurement")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (load-noise control)")
    parser.add_argument("--batch-size", type=int, default=16, help="loader batch size (workers row)")
    parser.add_argument("--scan-images", type=int, default=2000, help="synthetic dataset size")
    parser.add_argument(
        "--coco-images",
        type=int,
        default=118_287,
        help="COCO JSON index row: images of the generated instances file (train2017's size; 0 skips the row)",
    )
    parser.add_argument("--coco-boxes", type=int, default=860_001, help="COCO JSON index row: boxes")
    parser.add_argument(
        "--coco-ranks", type=int, default=4, help="COCO JSON index row: processes loading it at once"
    )
    parser.add_argument(
        "--gpu-device",
        default="auto",
        help="device of the GPU data path row (`train --loader gpu`): auto (cuda when present, else cpu), "
        "cuda, cpu, or 'off' to leave the row out",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def interleaved_rates(
    tasks: dict[str, object], iters: int, rounds: int, cpu_ms: dict[str, float] | None = None
) -> dict[str, tuple[float, float]]:
    """Per task (overall items/s, best round's items/s), the tasks taking turns in `rounds` rounds of
    iters / rounds items each, so that a shared machine's changing load hits all of them alike.
    `cpu_ms`, when given, receives each task's CPU time per item in milliseconds (this process's).

    A task is a callable `step(k)` doing the k-th item of its stream.
    """
    per_round = max(iters // rounds, 1)
    totals = {name: 0.0 for name in tasks}
    cpu = {name: 0.0 for name in tasks}
    best = {name: 0.0 for name in tasks}
    for r in range(rounds):
        for name, step in tasks.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            for k in range(r * per_round, (r + 1) * per_round):
                step(k)
            elapsed = time.perf_counter() - start
            cpu[name] += time.process_time() - start_cpu
            totals[name] += elapsed
            best[name] = max(best[name], per_round / elapsed)
    if cpu_ms is not None:
        cpu_ms.update({name: 1e3 * cpu[name] / (per_round * rounds) for name in tasks})
    return {name: (per_round * rounds / totals[name], best[name]) for name in tasks}


def warm_restart_copies(dataset) -> tuple[float, int, int, int]:
    """Make the restart-marker copies of `dataset`'s region-decodable images now (what the first epoch
    does lazily): (CPU seconds of the transcodes, copies made, bytes of their originals, their bytes)."""
    from yolov5_smddp.data.jpeg_roi import transcode_with_restarts

    cpu, made, original, copied = 0.0, 0, 0, 0
    for j, path in enumerate(dataset.images):
        copy_path = dataset.restart_cache.copy_path(path)
        if copy_path is None or not dataset.region_eligible(j):
            continue
        data = path.read_bytes()
        h, w = dataset.resized_hw(j)
        start = time.process_time()
        copy = transcode_with_restarts(data, w, h)
        cpu += time.process_time() - start
        if copy is not None:
            dataset.restart_cache.write(copy_path, copy)
            made, original, copied = made + 1, original + len(data), copied + len(copy)
    return cpu, made, original, copied


def _sample_stream(dataset, seed: int = 0):
    """step(k) → dataset[order[k]] over a shuffled order (after one warm-up sample)."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(dataset))
    dataset[int(order[-1])]  # warm-up (imports, first allocations)
    return lambda k: dataset[int(order[k % len(order)])]


def _decode_stream(paths: list[Path]):
    from yolov5_smddp.data.decode import decode_image

    return lambda k: decode_image(paths[k % len(paths)])


def _ceiling_stream(dataset, seed: int = 0):
    """step(k): the four decodes of the k-th mosaic sample of a shuffled order (the dataset's own mosaic
    plan and decode flags, through the training loader's decoder) and nothing else."""
    import numpy as np

    from yolov5_smddp.data.decode import decode_image

    order = np.random.default_rng(seed).permutation(len(dataset))

    def step(k: int) -> None:
        for j in dataset.mosaic_plan(int(order[k % len(order)])):
            decode_image(dataset.images[j], dataset.decode_flag(j))

    return step


def _region_ceiling_stream(dataset, seed: int = 0):
    """step(k): the default pipeline's decoding of the k-th mosaic sample of a shuffled order and nothing
    else: its plan and geometry, then per tile the region its warp reads (file read + region decode;
    nothing for a tile that does not show) where the region path applies, else the whole decode."""
    import numpy as np

    from yolov5_smddp.data.augment import draw_mosaic_geometry, tile_source_rect
    from yolov5_smddp.data.decode import decode_image
    from yolov5_smddp.data.jpeg_roi import decode_region, decode_region_restarts

    order = np.random.default_rng(seed).permutation(len(dataset))
    buffer = np.empty((dataset.img_size, dataset.img_size, 3), np.uint8)
    file_buffer = np.empty(1 << 20, np.uint8)

    def step(k: int) -> None:
        plan = dataset.mosaic_plan(int(order[k % len(order)]))
        geometry = draw_mosaic_geometry(dataset.img_size, dataset.params, dataset.rng)
        for t, j in enumerate(plan):
            if not dataset.region_eligible(j):
                decode_image(dataset.images[j], dataset.decode_flag(j))
                continue
            h, w = dataset.resized_hw(j)
            rect = tile_source_rect(t, (h, w), geometry)
            if rect is None:
                continue
            cache = dataset.restart_cache
            copy_path = None if cache is None else cache.copy_path(dataset.images[j])
            copy = None if copy_path is None else cache.read(copy_path, file_buffer)
            if copy is not None:
                decode_region_restarts(copy, buffer[:h, :w], rect)
            else:
                with open(dataset.images[j], "rb") as f:
                    decode_region(f.read(), buffer[:h, :w], rect)

    return step


def release_dataset(images_dir: Path, imgsz: int):
    """The release's training dataset (`LoadImagesAndLabels` of the PyPI package `yolov5`, scratch-low
    hyperparameters) on the folder of images, or None when the package is not importable (or fails on
    the folder: said on stderr). Import it before setting OpenCV's thread count: the release's import
    sets its own."""
    try:
        import yaml
        import yolov5
        from yolov5.utils.dataloaders import LoadImagesAndLabels
    except ImportError:
        return None
    hyp = yaml.safe_load((Path(yolov5.__file__).parent / "data/hyps/hyp.scratch-low.yaml").read_text())
    try:
        return LoadImagesAndLabels(str(images_dir), img_size=imgsz, batch_size=16, augment=True, hyp=hyp)
    except Exception as exc:  # the release's own failure: its row is left out, the rest is measured
        print(f"release row left out: its dataset failed on {images_dir}: {exc}", file=sys.stderr)
        return None


def loader_rate(dataset, *, workers: int, batch_size: int, iters: int) -> float:
    """Training-loader samples/s with `workers` workers, after the first batch (worker start-up)."""
    from yolov5_smddp.data.loader import build_dataloader

    loader = build_dataloader(
        dataset,
        batch_size=batch_size,
        rank=0,
        world_size=1,
        workers=workers,
        shuffle=True,
        seed=0,
        drop_last=True,
    )
    batches = max(iters // batch_size, 2)
    it = iter(loader)
    next(it)  # worker start-up is not throughput
    start, seen = time.perf_counter(), 0
    for _ in range(batches):
        try:
            imgs = next(it)[0]
        except StopIteration:
            break
        seen += len(imgs)
    return seen / (time.perf_counter() - start)


def _endless(loader):
    """Batches of `loader`, epoch after epoch."""
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def gpu_path_rows(index, imgsz: int, *, workers: int, batch_size: int, iters: int, device: str) -> dict:
    """The GPU data path (`train --loader gpu`): `workers` loader workers reading bytes (data.bytes_dataset),
    batches assembled on `device` (data.gpu_batch). Rows: samples/s end to end (the device synchronised
    once a batch), device ms per sample of each stage (a separate pass synchronised after every stage),
    the CPU ms per sample of the worker side (one process, what each worker spends), the workers used,
    and the path's buffer sizes."""
    import torch

    from yolov5_smddp.data.bytes_dataset import BytesDataset
    from yolov5_smddp.data.gpu_batch import GpuLoader
    from yolov5_smddp.data.loader import build_dataloader

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dataset = BytesDataset(index, imgsz, augment=True, hyp=None)
    probe = max(min(iters, 64), 4)
    started = time.process_time()
    for k in range(probe):
        dataset[k % len(dataset)]
    worker_cpu_ms = 1e3 * (time.process_time() - started) / probe
    inner = build_dataloader(
        dataset,
        batch_size=batch_size,
        rank=0,
        world_size=1,
        workers=workers,
        shuffle=True,
        seed=0,
        drop_last=True,
        pin_memory=False,
    )
    loader = GpuLoader(inner, device)
    batcher = loader._ensure_batcher()
    batches = _endless(inner)
    batcher.assemble(next(batches), timed=True)  # worker start-up and first allocations
    batcher.stats.stage_seconds.clear()

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    seen, start = 0, time.perf_counter()  # the rate: as training runs it, one wait a batch
    while seen < max(iters, batch_size):
        seen += len(batcher.assemble(next(batches))[0])
        synchronize()
    elapsed = time.perf_counter() - start
    timed = 0  # the split: a wait after every stage, over a quarter as many samples
    while timed < max(iters // 4, batch_size):
        timed += len(batcher.assemble(next(batches), timed=True)[0])
    stats = batcher.stats
    prefix = f"gpu_path_{device}"
    rows = {
        f"{prefix}_samples_per_s_{workers}workers": seen / elapsed,
        f"{prefix}_worker_cpu_ms_per_sample": worker_cpu_ms,
        f"{prefix}_workers": float(workers),
        f"{prefix}_staging_mib": stats.staging_bytes / 2**20,
        f"{prefix}_canvas_mib": stats.canvas_bytes / 2**20,
        f"{prefix}_decoded_mib": stats.peak_decoded_bytes / 2**20,
        f"{prefix}_peak_batch_jpeg_mib": stats.peak_batch_bytes / 2**20,
        f"{prefix}_fallback_decodes": float(stats.fallback_decodes),
    }
    for stage, seconds in stats.stage_seconds.items():
        rows[f"{prefix}_{stage}_ms_per_sample"] = 1e3 * seconds / timed
    return rows


_UNIQUE_IMAGES = 200


def resolve_data(data: str, scan_images: int, workdir: Path) -> Path:
    """The data.yaml to benchmark: the given one, or a synthetic dataset of `scan_images` 640x480 JPEGs
    (~70 KB each; 200 generated, the rest byte copies under new names — the scan reads every file)."""
    if data != "synthetic":
        return Path(data)
    from yolov5_smddp.data.synthetic import make_default_dataset

    root = workdir / "bench-data"
    yaml_path = make_default_dataset(
        root, n_train=min(scan_images, _UNIQUE_IMAGES), n_val=0, imgsz=640, seed=0
    )
    for i in range(_UNIQUE_IMAGES, scan_images):
        source = f"{i % _UNIQUE_IMAGES:05d}"
        shutil.copyfile(
            root / "images" / "train" / f"{source}.jpg", root / "images" / "train" / f"{i:05d}.jpg"
        )
        shutil.copyfile(
            root / "labels" / "train" / f"{source}.txt", root / "labels" / "train" / f"{i:05d}.txt"
        )
    return yaml_path


def run(args: argparse.Namespace) -> int:
    import cv2

    from yolov5_smddp.data.config import load_data_config
    from yolov5_smddp.data.dataset import YoloDataset
    from yolov5_smddp.data.imageinfo import DEFAULT_MAX_PIXELS
    from yolov5_smddp.data.restart_cache import RestartCache
    from yolov5_smddp.train.data_wiring import scan_split

    with tempfile.TemporaryDirectory(prefix="yolov5-smddp-bench-") as tmp:
        workdir = Path(tmp)
        gen_s, yaml_path = _timed(lambda: resolve_data(args.data, args.scan_images, workdir))
        cache_dir = workdir / "cache"
        cfg = load_data_config(yaml_path, cache_dir=cache_dir)

        def scan():
            return scan_split(cfg, "train", cache_dir=cache_dir, workers=8, max_pixels=DEFAULT_MAX_PIXELS)

        first = scan()  # writes our cache; remove it so the timed scan is a cold build
        if first.cache_path is not None:
            first.cache_path.unlink()
        scan_s, index = _timed(scan)
        load_s, _ = _timed(scan)
        n = index.report.found

        # the release writes its label cache beside the labels: only in our throwaway synthetic folder
        release = release_dataset(index.images[0].parent, args.imgsz) if args.data == "synthetic" else None
        cv2.setNumThreads(1)
        copies = RestartCache(workdir / "restart")  # the trainer's is under its cache folder
        default = YoloDataset(index, args.imgsz, augment=True, hyp=None, restart_cache=copies)
        transcode_s, copied_images, original_bytes, copy_bytes = warm_restart_copies(default)
        tasks = {
            "jpeg_decode_images_per_s_1proc": _decode_stream(index.images),
            "decode_ceiling_samples_per_s_1proc": _ceiling_stream(
                YoloDataset(index, args.imgsz, augment=True, hyp=None)
            ),
            "region_decode_ceiling_samples_per_s_1proc": _region_ceiling_stream(
                YoloDataset(index, args.imgsz, augment=True, hyp=None, restart_cache=copies)
            ),
            "mosaic_samples_per_s_1proc_random": _sample_stream(default),
            "mosaic_samples_per_s_1proc_random_no_restart": _sample_stream(
                YoloDataset(index, args.imgsz, augment=True, hyp=None)
            ),
            "mosaic_samples_per_s_1proc_random_whole": _sample_stream(
                YoloDataset(index, args.imgsz, augment=True, hyp=None, region_decode=False)
            ),
            "mosaic_samples_per_s_1proc_recent": _sample_stream(
                YoloDataset(index, args.imgsz, augment=True, hyp=None, mosaic_partners="recent")
            ),
        }
        if release is not None:
            tasks["release_mosaic_samples_per_s_1proc"] = _sample_stream(release)
        rows: dict[str, float] = {}
        if copied_images:
            rows["jpeg_restart_transcode_ms_per_image"] = 1e3 * transcode_s / copied_images
            rows["jpeg_restart_copy_bytes_of_originals"] = copy_bytes / original_bytes
        cpu_ms: dict[str, float] = {}
        for name, (overall, best) in interleaved_rates(tasks, args.iters, args.rounds, cpu_ms).items():
            rows[name], rows[f"{name}_best_round"] = overall, best
            rows[f"{name.replace('_per_s', '')}_cpu_ms"] = cpu_ms[name]
        ceiling = rows["decode_ceiling_samples_per_s_1proc"]
        for name in (
            "mosaic_samples_per_s_1proc_random",
            "mosaic_samples_per_s_1proc_random_no_restart",
            "mosaic_samples_per_s_1proc_random_whole",
            "mosaic_samples_per_s_1proc_recent",
        ):
            rows[f"{name.replace('_samples_per_s', '')}_of_ceiling"] = rows[name] / ceiling
        rows["mosaic_1proc_random_of_region_ceiling"] = (
            rows["mosaic_samples_per_s_1proc_random"] / rows["region_decode_ceiling_samples_per_s_1proc"]
        )
        if release is not None:
            rows["release_mosaic_1proc_of_ceiling"] = rows["release_mosaic_samples_per_s_1proc"] / ceiling
            rows["ours_random_vs_release"] = (
                rows["mosaic_samples_per_s_1proc_random"] / rows["release_mosaic_samples_per_s_1proc"]
            )
            rows["ours_random_no_restart_vs_release"] = (
                rows["mosaic_samples_per_s_1proc_random_no_restart"]
                / rows["release_mosaic_samples_per_s_1proc"]
            )
            rows["ours_random_whole_vs_release"] = (
                rows["mosaic_samples_per_s_1proc_random_whole"] / rows["release_mosaic_samples_per_s_1proc"]
            )
        ds = YoloDataset(index, args.imgsz, augment=True, hyp=None)
        rows[f"mosaic_samples_per_s_{args.workers}workers"] = loader_rate(
            ds, workers=args.workers, batch_size=args.batch_size, iters=args.iters
        )
        if args.gpu_device != "off":
            rows.update(
                gpu_path_rows(
                    index,
                    args.imgsz,
                    workers=args.workers,
                    batch_size=args.batch_size,
                    iters=args.iters,
                    device=args.gpu_device,
                )
            )
        if args.coco_images > 0:
            from yolov5_smddp.benchmarks.coco_index import measure_coco_index

            rows.update(measure_coco_index(workdir, args.coco_images, args.coco_boxes, args.coco_ranks))

    results = {
        "data": str(args.data),
        "imgsz": args.imgsz,
        "pairs": n,
        "dataset_generation_s": round(gen_s, 2),
        "label_scan_pairs_per_s": n / scan_s,
        "cache_load_pairs_per_s": n / load_s,
        **rows,
    }
    print(f"{'measurement':<50}{'value':>12}")
    for key, value in results.items():
        ratio = key.endswith(("_of_ceiling", "_of_region_ceiling", "_vs_release", "_of_originals"))
        shown = f"{value:.2f}" if ratio else f"{value:,.1f}" if isinstance(value, float) else str(value)
        print(f"{key:<50}{shown:>12}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0
