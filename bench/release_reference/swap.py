"""Swap halves with the release (issue 27): one trainer fed by the OTHER side's training data pipeline.

  swap.py ours-on-release -- TRAIN-ARGS...    our `yolov5_smddp train TRAIN-ARGS`, its training batches
                                              made by the release's `create_dataloader` (its
                                              LoadImagesAndLabels, InfiniteDataLoader, worker seeding);
                                              validation stays ours
  swap.py release-on-ours -- TRAIN-ARGS...    the release's `yolov5.train TRAIN-ARGS`, its training batches
                                              made by our YoloDataset and loader (build_dataloader);
                                              validation, AutoAnchor and class weights keep the release's
                                              own dataset object (the same labels)

Run in the throwaway image of bench/release_reference/Dockerfile (the release is the PyPI package `yolov5`
7.0.14, never part of our image or repository), this checkout on PYTHONPATH, as bench/convergence.sh does
(variants `ours-reldata` and `release-ourdata`). Only the source of the training batches changes; each
trainer keeps its own model, loss, optimizer, schedule, EMA, validation and best.pt selection. Both
pipelines hand over the same batch format: uint8 [B, 3, H, W] RGB images and float32 [n, 6] targets
(image index, class, x, y, w, h normalised).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path


def _train_path(data_yaml: str) -> str:
    """The data.yaml's train entry as an absolute path (the release's own rule: relative to `path`)."""
    import yaml

    data = yaml.safe_load(Path(data_yaml).read_text())
    root = Path(data.get("path") or Path(data_yaml).parent)
    train = data["train"]
    return str(train if Path(train).is_absolute() else root / train)


class _NoEpochs:
    """The release's loader reshuffles by itself every epoch; our trainer's set_epoch call is a no-op."""

    def set_epoch(self, epoch: int) -> None:
        pass


class _ReleaseBatches:
    """The release's training loader, as our trainer iterates it: 5-tuples, colour None (applied)."""

    def __init__(self, loader) -> None:
        self.loader, self.sampler, self.dataset = loader, _NoEpochs(), loader.dataset

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for imgs, targets, paths, shapes in self.loader:
            yield imgs, targets, paths, shapes, None


def ours_on_release(argv: list[str]) -> int:
    from yolov5.utils.dataloaders import create_dataloader

    from yolov5_smddp import cli
    from yolov5_smddp.train import data_wiring

    original = data_wiring.build_loaders

    def build_loaders(config, bundle, hyp, per_rank, info, stride, color_on_device, cache_dir):
        if color_on_device or info.world_size != 1:
            raise SystemExit("swap.py ours-on-release: one CPU process only (colour in the loader)")
        _, val_loader, workers = original(
            config, bundle, hyp, per_rank, info, stride, color_on_device, cache_dir
        )
        release_hyp = {"copy_paste": 0.0, **hyp}
        loader, dataset = create_dataloader(
            _train_path(config.data),
            config.imgsz,
            per_rank,
            stride,
            False,
            hyp=release_hyp,
            augment=True,
            cache=None,
            rect=False,
            rank=-1,
            workers=workers,
            prefix="train (the release's pipeline): ",
            shuffle=True,
            seed=config.seed,
        )
        print(
            f"swap: training batches from the release's LoadImagesAndLabels ({len(dataset)} images)",
            flush=True,
        )
        return _ReleaseBatches(loader), val_loader, workers

    # The release's label scan (a multiprocessing Pool, ended with SIGTERM) runs here, before our trainer
    # installs its SIGTERM handler: forked pool workers would inherit that handler and never exit. Inside
    # the trainer the release then reads its labels.cache.
    from yolov5.utils.dataloaders import LoadImagesAndLabels

    LoadImagesAndLabels(_train_path(argv[argv.index("--data") + 1]), prefix="train (label scan): ")
    data_wiring.build_loaders = build_loaders
    return cli.main(argv)


class _OurBatches:
    """Our training loader as the release's train.py iterates it: 4-tuples, contiguous NCHW images."""

    def __init__(self, loader) -> None:
        self.loader, self.sampler, self.num_workers = loader, loader.sampler, loader.num_workers

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for imgs, targets, paths, shapes, color in self.loader:
            assert color is None, "colour must be applied in the loader"
            yield imgs.contiguous(), targets, paths, shapes


def release_on_ours(argv: list[str]) -> int:
    import numpy as np
    import yolov5.utils.dataloaders as release_data

    from yolov5_smddp.data.dataset import YoloDataset
    from yolov5_smddp.data.index import LabelIndex, ScanReport
    from yolov5_smddp.data.loader import build_dataloader

    original = release_data.create_dataloader

    def create_dataloader(path, imgsz, batch_size, stride, single_cls=False, hyp=None, augment=False, **kw):
        if not augment:  # validation: the release's own
            return original(path, imgsz, batch_size, stride, single_cls, hyp=hyp, augment=augment, **kw)
        if kw.get("rank", -1) != -1 or kw.get("rect") or kw.get("image_weights") or kw.get("quad"):
            raise SystemExit("swap.py release-on-ours: one process, no --rect/--image-weights/--quad")
        # the release's dataset object: its label scan, which AutoAnchor and the class weights read
        dataset = release_data.LoadImagesAndLabels(
            path,
            imgsz,
            batch_size,
            augment=True,
            hyp=hyp,
            stride=int(stride),
            single_cls=single_cls,
            prefix="train (labels for the release, pixels from ours): ",
        )
        report = ScanReport(
            found=len(dataset.im_files),
            usable=len(dataset.im_files),
            missing_labels=0,
            empty_labels=0,
            bad=0,
            duplicate_files=0,
            polygon_files=0,
            boxes=int(sum(len(lb) for lb in dataset.labels)),
            messages=[],
            cache="release",
        )
        index = LabelIndex(
            root=Path(path),
            images=[Path(f) for f in dataset.im_files],
            shapes=np.asarray(dataset.shapes, dtype=np.int32)[
                :, ::-1
            ].copy(),  # the release's (w, h) -> (h, w)
            labels=[np.asarray(lb, dtype=np.float32).reshape(-1, 5) for lb in dataset.labels],
            report=report,
            cache_path=None,
        )
        seed = int(kw.get("seed", 0))
        ours = YoloDataset(
            index, imgsz, augment=True, hyp=hyp, batch_size=batch_size, stride=int(stride), seed=seed
        )
        workers = min(os.cpu_count() or 1, batch_size if batch_size > 1 else 0, int(kw.get("workers", 8)))
        loader = build_dataloader(
            ours,
            batch_size=batch_size,
            rank=0,
            world_size=1,
            workers=workers,
            shuffle=True,
            seed=seed,
            drop_last=False,
        )
        print(
            f"swap: training batches from our YoloDataset ({len(ours)} images, {workers} workers)", flush=True
        )
        return _OurBatches(loader), dataset

    release_data.create_dataloader = create_dataloader  # train.py imports it from this module when it runs
    sys.argv = ["train.py", *argv]
    runpy.run_module("yolov5.train", run_name="__main__")
    return 0


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[2] != "--" or sys.argv[1] not in ("ours-on-release", "release-on-ours"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, argv = sys.argv[1], sys.argv[3:]
    return ours_on_release(argv) if mode == "ours-on-release" else release_on_ours(argv)


if __name__ == "__main__":
    sys.exit(main())
