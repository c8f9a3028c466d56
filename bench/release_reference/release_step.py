"""Times one training step of the YOLOv5 release (v7.0: the PyPI package `yolov5` 7.0.14, installed in
the throwaway image of bench/release_reference/Dockerfile, or its files unpacked by fetch_release.sh into
a folder named with --release-src) the way `yolov5-smddp bench train --loader device` times ours: uint8
batches already on the device, uint8 → float / 255, forward, the release's ComputeLoss, backward, then its
train loop's optimizer part (unscale, clip at norm 10, SGD step from its `smart_optimizer`, zero_grad, its
ModelEMA update) on every step. `--amp fp16` is the release's AMP on CUDA (autocast fp16 + GradScaler);
off on the CPU, as the release does. The memory format is the release's (contiguous).

The release imports many packages at load time that its training step never uses (pandas, requests,
seaborn, IPython, pkg_resources, ultralytics, ...): those missing here are replaced by inert stand-ins
(`install_stand_ins`, named on one line), so the step runs with torch, numpy and PyYAML alone.

`--threads shipped` leaves torch's thread count as the release sets it on import (OMP_NUM_THREADS =
min(8, cpus - 1)); `--threads N` sets N after import, for a like-for-like comparison.

Prints one line per batch size and writes a JSON with the per-step times (ms).
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import re
import statistics
import sys
import time
import types
from pathlib import Path

import torch
import yaml

# imported by the release's modules at load time, never used by its training step
STAND_IN_PACKAGES = (
    "IPython",
    "pkg_resources",
    "pandas",
    "requests",
    "seaborn",
    "tqdm",
    "psutil",
    "ultralytics",
    "huggingface_hub",
    "git",
    "cv2",
    "matplotlib",
    "PIL",
    "torchvision",
    "scipy",
)


class _Inert:
    """Any attribute, call, item or assignment: itself (e.g. `cv2.setNumThreads(0)`,
    `pd.options.display.max_columns = 10`)."""

    def __getattr__(self, name: str) -> _Inert:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *args, **kwargs) -> _Inert:
        return self

    def __getitem__(self, key) -> _Inert:
        return self

    def __setattr__(self, name: str, value) -> None:
        pass

    def __iter__(self):
        return iter(())


def _parse_version(text: str) -> tuple[int, ...]:
    """pkg_resources.parse_version for the release's check_version: the leading numbers, compared as a tuple."""
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def _inert_attribute(name: str) -> _Inert:
    """A stand-in module's attributes: inert, except the dunder names that tools probe (__file__, ...)."""
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    return _Inert()


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: set[str]) -> None:
        self.roots = roots

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _inert_attribute  # type: ignore[method-assign]
        if spec.name == "pkg_resources":
            module.parse_version = _parse_version
        return module

    def exec_module(self, module) -> None:
        pass


def install_stand_ins() -> list[str]:
    """Stand-ins for the STAND_IN_PACKAGES that are not installed; returns their names."""
    missing = {name for name in STAND_IN_PACKAGES if importlib.util.find_spec(name) is None}
    if missing:
        sys.meta_path.insert(0, _StandInFinder(missing))
    return sorted(missing)


def synthetic_batches(
    batch: int, imgsz: int, nc: int, device: torch.device, count: int = 4, boxes_per_image: int = 8
):
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
        out.append((images.to(device), targets.to(device)))
    return out


def measure(args, batch: int, device: torch.device) -> dict:
    """Fresh model, loss, optimizer and EMA at `batch`; warmup, then `iters` timed steps."""
    import yolov5  # the release; its import sets OMP_NUM_THREADS
    from yolov5.models.yolo import Model
    from yolov5.utils.loss import ComputeLoss
    from yolov5.utils.torch_utils import ModelEMA, smart_optimizer

    root = Path(yolov5.__file__).parent
    hyp = yaml.safe_load((root / "data/hyps/hyp.scratch-low.yaml").read_text())
    nc = 80
    torch.manual_seed(0)
    model = Model(str(root / f"models/{args.cfg}.yaml"), ch=3, nc=nc).to(device).train()
    nl = model.model[-1].nl
    hyp["box"] *= 3 / nl  # the gain scaling of its train.py
    hyp["cls"] *= nc / 80 * 3 / nl
    hyp["obj"] *= (args.imgsz / 640) ** 2 * 3 / nl
    model.nc, model.hyp = nc, hyp
    compute_loss = ComputeLoss(model)
    optimizer = smart_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"])
    ema = ModelEMA(model)
    amp = args.amp == "fp16"
    scaler = torch.amp.GradScaler(device.type, enabled=amp)
    batches = synthetic_batches(batch, args.imgsz, nc, device)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    forward_backward, optim = [], []
    for i in range(args.warmup + args.iters):
        if i == args.warmup:
            sync()
            started = time.perf_counter()
        images, targets = batches[i % len(batches)]
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
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
    sync()
    wall_ms = (time.perf_counter() - started) * 1e3
    steps = [a + b for a, b in zip(forward_backward, optim)]
    return {
        "batch": batch,
        "amp": args.amp,
        "step_ms_mean": wall_ms / args.iters,  # wall clock between two synchronizes
        "step_ms_median": statistics.median(steps),  # host time per step (= device time on the CPU)
        "img_per_s": batch * args.iters / (wall_ms / 1e3),
        "forward_backward_ms_mean": statistics.mean(forward_backward),
        "optimizer_ms_mean": statistics.mean(optim),
        "step_ms": steps,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cfg", default="yolov5n")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", default="8", help="batch size, or several: 16,64")
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", default="shipped", help="'shipped' or a number")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--amp", choices=("off", "fp16"), default="off", help="fp16: the release's AMP (CUDA)"
    )
    parser.add_argument("--release-src", type=Path, default=None, help="folder holding the release's yolov5/")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.amp == "fp16" and args.device != "cuda":
        parser.error("--amp fp16 needs --device cuda (the release turns AMP off on the CPU)")
    if args.release_src is not None:
        if not (args.release_src / "yolov5" / "models" / "yolo.py").is_file():
            parser.error(
                f"--release-src {args.release_src}: no yolov5/models/yolo.py there (see fetch_release.sh)"
            )
        sys.path.insert(0, str(args.release_src.resolve()))
    stand_ins = install_stand_ins()
    if stand_ins:
        print(f"release_step: inert stand-ins for {', '.join(stand_ins)} (not installed; unused by the step)")
    import yolov5

    if args.threads != "shipped":
        torch.set_num_threads(int(args.threads))
    device = torch.device(args.device)
    rows = []
    for batch in (int(b) for b in args.batch.split(",")):
        row = measure(args, batch, device)
        rows.append(row)
        print(
            f"release {args.cfg} b{batch}@{args.imgsz} {args.amp} on {args.device}: {row['img_per_s']:.1f} img/s, "
            f"step {row['step_ms_mean']:.1f} ms (host median {row['step_ms_median']:.1f}; forward+backward "
            f"{row['forward_backward_ms_mean']:.1f}, optimizer {row['optimizer_ms_mean']:.1f})"
        )
    result = {
        "implementation": f"release (yolov5 {yolov5.__version__})",
        "cfg": args.cfg,
        "imgsz": args.imgsz,
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "threads_setting": args.threads,
        "iters": args.iters,
        "stand_ins": stand_ins,
        "torch": torch.__version__,
        "rows": rows,
        # the first row's figures at the top level, as bench/release_compare.sh reads them
        **{
            k: rows[0][k]
            for k in ("step_ms_mean", "step_ms_median", "forward_backward_ms_mean", "optimizer_ms_mean")
        },
        "batch": rows[0]["batch"],
        "step_ms": rows[0]["step_ms"],
    }
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
