"""The GPU loader phase of bench/gpu_all.sh (issue 52, items 1 and 5): `train --loader gpu`'s path on JPEGs
of mixed sizes and qualities, as a real dataset has them, with a training step beside it.

    python -m bench.gpu_loader_check OUT.json DEVICE IMGSZ BATCH WORKERS N_IMAGES ITERS CFG

Rows:
- mosaics_per_s: images the loader delivered per second while the step trained on them;
- busy: the share of the loop's time the step was not waiting on the host (the CPU workers): the device
  decode and augmentation are device work (data.gpu_batch.GpuLoader.host_wait_s keeps them apart);
- device_assemble_ms: CUDA events around each batch's device decode/augment (wall time on the CPU);
- nvjpeg_used: whether the device decoder (nvJPEG) decoded the files, with the count and fallbacks;
- race_corrupted: decodes issued while a training step is still queued, every image compared with the CPU
  decode (nvJPEG's IDCT differs from libjpeg's by a few levels; a mean difference over 4 or a max over 64
  counts as corrupted). Target: 0.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

NC = 3
CORRUPT_MEAN, CORRUPT_MAX = 4.0, 64


def make_mixed_jpegs(root: Path, n: int, imgsz: int, seed: int = 0) -> list[Path]:
    """n JPEGs with YOLO labels under root/images/train: long side imgsz/2 .. 2 imgsz, aspect 0.5 .. 2,
    quality 50 .. 95, photo-like (smooth gradients, shapes, noise)."""
    import cv2

    rng = np.random.default_rng(seed)
    images, labels = root / "images" / "train", root / "labels" / "train"
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        long_side = int(rng.integers(max(imgsz // 2, 32), 2 * imgsz + 1))
        aspect = float(rng.uniform(0.5, 2.0))
        w, h = (
            (long_side, max(int(long_side / aspect), 16))
            if aspect >= 1
            else (max(int(long_side * aspect), 16), long_side)
        )
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack(
            [(xx * 255 // max(w, 1)), (yy * 255 // max(h, 1)), ((xx + yy) * 127 // max(w + h, 1))], -1
        )
        img = (base + rng.normal(0, 12, (h, w, 3))).clip(0, 255).astype(np.uint8)
        rows = []
        for _ in range(int(rng.integers(1, 4))):
            bw, bh = rng.uniform(0.1, 0.4), rng.uniform(0.1, 0.4)
            cx, cy = rng.uniform(bw / 2, 1 - bw / 2), rng.uniform(bh / 2, 1 - bh / 2)
            color = tuple(int(c) for c in rng.integers(0, 256, 3))
            p0 = (int((cx - bw / 2) * w), int((cy - bh / 2) * h))
            p1 = (int((cx + bw / 2) * w), int((cy + bh / 2) * h))
            cv2.rectangle(img, p0, p1, color, -1)
            rows.append(f"{int(rng.integers(0, NC))} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}")
        path = images / f"{i:05d}.jpg"
        ok, data = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(50, 96))])
        assert ok
        path.write_bytes(data.tobytes())
        (labels / f"{i:05d}.txt").write_text("\n".join(rows) + "\n")
        paths.append(path)
    return paths


def race_check(batcher, step, batch, files: list[Path], rounds: int) -> dict:
    """Decode `files` on the device right after queueing a training step (no sync between), then compare
    every image with the CPU decode."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    datas = [np.frombuffer(p.read_bytes(), np.uint8) for p in files]
    reference = [
        decode_jpeg(torch.from_numpy(d.copy()), mode=ImageReadMode.RGB).to(torch.int16) for d in datas
    ]
    imgs, targets = batch
    corrupted = checked = 0
    worst = 0
    for _ in range(rounds):
        step.micro_step(imgs, targets, sync=True)  # queued, not waited for
        step.optimizer_step()
        decoded = batcher._decode_group([SimpleNamespace(data=d) for d in datas])
        for got, ref in zip(decoded, reference):
            checked += 1
            if got is None:
                continue  # refused by the device: the CPU fallback decodes it (counted elsewhere)
            diff = (got.to("cpu", torch.int16) - ref).abs()
            worst = max(worst, int(diff.max()))
            if float(diff.float().mean()) > CORRUPT_MEAN or int(diff.max()) > CORRUPT_MAX:
                corrupted += 1
    return {"race_checked_images": checked, "race_corrupted": corrupted, "race_max_abs_diff": worst}


def run(
    out: str, device: str, imgsz: str, batch: str, workers: str, n_images: str, iters: str, cfg: str
) -> None:
    import torch

    from yolov5_smddp.benchmarks.train import bench_training_stack
    from yolov5_smddp.config.hyp import Hyp, load_hyp
    from yolov5_smddp.data.bytes_dataset import BytesDataset
    from yolov5_smddp.data.gpu_batch import GpuLoader
    from yolov5_smddp.data.labels import build_label_index
    from yolov5_smddp.data.loader import build_dataloader
    from yolov5_smddp.models.yolo import build_model
    from yolov5_smddp.train.engine import TrainStep, resolve_amp

    dev = torch.device(device)
    imgsz_i, batch_i, workers_i, n_i, iters_i = (
        int(imgsz),
        int(batch),
        int(workers),
        int(n_images),
        int(iters),
    )
    work = Path(tempfile.mkdtemp(prefix="gpu-loader-check-"))
    files = make_mixed_jpegs(work / "data", n_i, imgsz_i)
    index = build_label_index(
        [work / "data" / "images" / "train"], nc=NC, root=work / "data", cache_dir=work / "cache"
    )
    dataset = BytesDataset(index, imgsz_i, augment=True, hyp=None)
    inner = build_dataloader(
        dataset,
        batch_size=batch_i,
        rank=0,
        world_size=1,
        workers=workers_i,
        shuffle=True,
        seed=0,
        drop_last=True,
    )
    loader = GpuLoader(inner, dev)
    batcher = loader._ensure_batcher()
    assemble = batcher.assemble
    spans: list = []

    def timed_assemble(b, timed=False):  # CUDA events around the device decode/augment: GPU work
        if dev.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            result = assemble(b, timed)
            end.record()
            spans.append((begin, end))
            return result
        began = time.perf_counter()
        result = assemble(b, timed)
        spans.append(time.perf_counter() - began)
        return result

    batcher.assemble = timed_assemble
    torch.manual_seed(0)
    model = build_model(f"{cfg}.yaml", nc=NC).to(dev).train()
    amp = resolve_amp("auto", dev.type, torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None)
    stack = bench_training_stack(
        model, Hyp.from_dict(load_hyp("scratch-low")), nc=NC, imgsz=imgsz_i, batch=batch_i, amp=amp
    )
    step = TrainStep(model, stack.criterion, stack.optimizer, stack.scaler, stack.ema, amp, dev)

    def endless():
        while True:
            yield from loader

    batches = endless()
    first = next(batches)  # worker start-up, first allocations
    step.micro_step(first[0], first[1], sync=True)
    step.optimizer_step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    spans.clear()
    loader.host_wait_s, seen = 0.0, 0
    loader.pop_issue_seconds()
    started = time.perf_counter()
    for _ in range(iters_i):
        imgs, targets, *_ = next(batches)
        step.micro_step(imgs, targets, sync=True)
        step.optimizer_step()
        seen += len(imgs)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - started
    device_ms = [b.elapsed_time(e) for b, e in spans] if dev.type == "cuda" else [1e3 * s for s in spans]
    stats = batcher.stats
    rows = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cfg": cfg,
        "imgsz": imgsz_i,
        "batch": batch_i,
        "workers": workers_i,
        "images": n_i,
        "mosaics_per_s": seen / wall,
        "busy": max(0.0, 1.0 - loader.host_wait_s / wall),
        "host_wait_ms_per_batch": 1e3 * loader.host_wait_s / max(iters_i, 1),
        "device_assemble_ms_per_batch": float(np.mean(device_ms)) if device_ms else 0.0,
        "nvjpeg_used": dev.type == "cuda" and stats.device_decoded > 0,
        "device_decoded_files": stats.device_decoded,
        "fallback_decodes": stats.fallback_decodes,
    }
    rows.update(race_check(batcher, step, (first[0], first[1]), files[: min(len(files), 32)], rounds=3))
    rows["target_2000_mosaics_per_s_met"] = bool(rows["mosaics_per_s"] >= 2000)
    for key, value in rows.items():
        print(f"{key:<32}{value:>14.2f}" if isinstance(value, float) else f"{key:<32}{value!s:>14}")
    Path(out).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    run(*sys.argv[1:])
