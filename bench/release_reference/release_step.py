"""Times one training step of the YOLOv5 release (the PyPI package `yolov5`, installed only in the
throwaway image of bench/release_reference/Dockerfile) the way `yolov5-smddp bench train --loader device`
times ours: uint8 batches already in memory, uint8 → float / 255, forward, the release's ComputeLoss,
backward, then its train loop's optimizer part (unscale, clip at norm 10, SGD step from its
`smart_optimizer`, zero_grad, its ModelEMA update) on every step. AMP is off (the release turns it off on
CPU); the memory format is the release's (contiguous).

`--threads shipped` leaves torch's thread count as the release sets it on import (OMP_NUM_THREADS =
min(8, cpus - 1)); `--threads N` sets N after import, for a like-for-like comparison.

Prints one line and writes a JSON with the per-step times (ms).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import yaml


def synthetic_batches(batch: int, imgsz: int, nc: int, count: int = 4, boxes_per_image: int = 8):
    generator = torch.Generator().manual_seed(0)
    out = []
    for _ in range(count):
        images = torch.randint(0, 256, (batch, 3, imgsz, imgsz), dtype=torch.uint8, generator=generator)
        n = boxes_per_image * batch
        targets = torch.zeros(n, 6)
        targets[:, 0] = torch.arange(batch).repeat_interleave(boxes_per_image)
        targets[:, 1] = torch.randint(0, nc, (n,), generator=generator).float()
        targets[:, 2:4] = torch.rand(n, 2, generator=generator) * 0.8 + 0.1
        targets[:, 4:6] = torch.rand(n, 2, generator=generator) * 0.2 + 0.02
        out.append((images, targets))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cfg", default="yolov5n")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", default="shipped", help="'shipped' or a number")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import yolov5  # the release; its import sets OMP_NUM_THREADS
    from yolov5.models.yolo import Model
    from yolov5.utils.loss import ComputeLoss
    from yolov5.utils.torch_utils import ModelEMA, smart_optimizer

    if args.threads != "shipped":
        torch.set_num_threads(int(args.threads))
    threads = torch.get_num_threads()
    root = Path(yolov5.__file__).parent
    hyp = yaml.safe_load((root / "data/hyps/hyp.scratch-low.yaml").read_text())
    nc = 80
    torch.manual_seed(0)
    model = Model(str(root / f"models/{args.cfg}.yaml"), ch=3, nc=nc).train()
    nl = model.model[-1].nl
    hyp["box"] *= 3 / nl  # the gain scaling of its train.py
    hyp["cls"] *= nc / 80 * 3 / nl
    hyp["obj"] *= (args.imgsz / 640) ** 2 * 3 / nl
    model.nc, model.hyp = nc, hyp
    compute_loss = ComputeLoss(model)
    optimizer = smart_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"])
    ema = ModelEMA(model)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    batches = synthetic_batches(args.batch, args.imgsz, nc)

    forward_backward, optim = [], []
    for i in range(args.warmup + args.iters):
        images, targets = batches[i % len(batches)]
        t0 = time.perf_counter()
        pred = model(images.float() / 255)
        loss, _ = compute_loss(pred, targets)
        scaler.scale(loss).backward()
        t1 = time.perf_counter()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        ema.update(model)
        t2 = time.perf_counter()
        if i >= args.warmup:
            forward_backward.append((t1 - t0) * 1e3)
            optim.append((t2 - t1) * 1e3)
    steps = [a + b for a, b in zip(forward_backward, optim)]
    result = {
        "implementation": "release (pip yolov5 7.0.14)",
        "cfg": args.cfg,
        "imgsz": args.imgsz,
        "batch": args.batch,
        "threads": threads,
        "threads_setting": args.threads,
        "iters": args.iters,
        "step_ms_mean": statistics.mean(steps),
        "step_ms_median": statistics.median(steps),
        "forward_backward_ms_mean": statistics.mean(forward_backward),
        "optimizer_ms_mean": statistics.mean(optim),
        "step_ms": steps,
        "torch": torch.__version__,
    }
    print(
        f"release {args.cfg} b{args.batch}@{args.imgsz} fp32, {threads} thread(s) ({args.threads}): "
        f"step {result['step_ms_mean']:.1f} ms mean, {result['step_ms_median']:.1f} median "
        f"(forward+backward {result['forward_backward_ms_mean']:.1f}, optimizer {result['optimizer_ms_mean']:.1f})"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
