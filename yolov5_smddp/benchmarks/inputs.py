"""Batches for `bench train`: pre-staged on the device (measures the GPU alone) or from the full data
pipeline (the project's dataset + DataLoader, to expose input-bound settings).

Every batch is (images uint8 [B, 3, H, W], targets float32 [n, 6] = (image index, class, xc, yc, w, h)
normalised to the network input, colour): the loader's contract. colour is None, or with HSV and flips on
the device batch (`--color-aug`) the float64 [B, 6] parameters (`data.color`); the step converts images
(and applies the colour) on the device, as in training.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from yolov5_smddp.data.augment import AugmentParams, draw_color_params
from yolov5_smddp.data.config import load_data_config
from yolov5_smddp.data.dataset import YoloDataset
from yolov5_smddp.data.imageinfo import DEFAULT_MAX_PIXELS
from yolov5_smddp.data.loader import build_dataloader, num_workers_per_rank
from yolov5_smddp.data.synthetic import make_default_dataset
from yolov5_smddp.errors import DataError
from yolov5_smddp.train.data_wiring import scan_split

if TYPE_CHECKING:
    from yolov5_smddp.config.hyp import Hyp

STAGED_BATCHES = 4  # distinct device batches cycled through, so no step reuses the previous input
BOXES_PER_IMAGE = 8
SYNTHETIC_BATCHES_PER_EPOCH = 16  # long epochs: the loader restarts rarely in a measurement


def synthetic_targets(batch: int, nc: int, generator: torch.Generator) -> torch.Tensor:
    """[batch × BOXES_PER_IMAGE, 6] random boxes inside the image: centres in [0.2, 0.8], sizes in
    [0.05, 0.4] (normalised), classes uniform in [0, nc)."""
    n = batch * BOXES_PER_IMAGE
    image_index = torch.arange(batch).repeat_interleave(BOXES_PER_IMAGE).float()
    cls = torch.randint(0, nc, (n,), generator=generator).float()
    centres = 0.2 + 0.6 * torch.rand(n, 2, generator=generator)
    sizes = 0.05 + 0.35 * torch.rand(n, 2, generator=generator)
    return torch.cat([image_index[:, None], cls[:, None], centres, sizes], dim=1)


def staged_synthetic(
    batch: int, imgsz: int, nc: int, device: torch.device, hyp: Hyp | None = None
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """STAGED_BATCHES random uint8 batches and their targets, already on `device`; with `hyp` (HSV and
    flips on the device batch) also colour parameters drawn from its gains, as the workers draw them."""
    generator = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    staged = []
    for _ in range(STAGED_BATCHES):
        images = torch.randint(0, 256, (batch, 3, imgsz, imgsz), dtype=torch.uint8, generator=generator)
        targets = synthetic_targets(batch, nc, generator)
        color = None
        if hyp is not None:
            p = AugmentParams.from_hyp(hyp)
            color = torch.from_numpy(np.stack([draw_color_params(p, rng) for _ in range(batch)])).to(device)
        staged.append((images.to(device), targets.to(device), color))
    return staged


def stage(loader_batches: Iterator[tuple], device: torch.device) -> list:
    """The first STAGED_BATCHES batches of a real pipeline, copied to `device` once."""
    return [
        (images.to(device), targets.to(device), None if color is None else color.to(device))
        for images, targets, color in itertools.islice(loader_batches, STAGED_BATCHES)
    ]


def dataset_yaml(data: str, scratch: Path, imgsz: int, batch: int) -> Path:
    """`data` as a data.yaml path; "synthetic" writes the embedded default dataset under `scratch`
    (SYNTHETIC_BATCHES_PER_EPOCH batches of `batch` images)."""
    if data == "synthetic":
        folder = scratch / f"synthetic-{imgsz}-{batch}"
        return make_default_dataset(folder, n_train=batch * SYNTHETIC_BATCHES_PER_EPOCH, n_val=0, imgsz=imgsz)
    return Path(data)


def pipeline_batches(
    yaml_path: Path,
    *,
    imgsz: int,
    batch: int,
    workers: int,
    hyp: Hyp,
    cache_dir: Path,
    local_gpus: int,
    color_on_device: bool = False,
) -> tuple[Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]], int, int]:
    """Endless (images, targets, colour) from the training pipeline (mosaic augmentation on, as in
    training; `color_on_device` as `--color-aug`); returns (batches, number of classes, DataLoader workers
    used). Label caches go to `cache_dir`, never into the dataset."""
    config = load_data_config(yaml_path)
    # the training's one label scan (data_pipeline.scan_split)
    index = scan_split(
        config, "train", cache_dir=cache_dir, workers=max(workers, 1), max_pixels=DEFAULT_MAX_PIXELS
    )
    dataset = YoloDataset(
        index, imgsz, augment=True, hyp=hyp, batch_size=batch, color_on_device=color_on_device
    )
    used_workers = num_workers_per_rank(os.cpu_count() or 1, local_gpus, batch, workers)
    loader = build_dataloader(
        dataset,
        batch_size=batch,
        rank=0,
        world_size=1,
        workers=used_workers,
        shuffle=True,
        seed=0,
        drop_last=True,
    )
    if len(loader) == 0:
        raise DataError(f"{yaml_path}: {len(dataset)} training images are fewer than one batch of {batch}")

    def forever() -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        for epoch in itertools.count():
            loader.sampler.set_epoch(epoch)
            for images, targets, _paths, _shapes, color in loader:
                yield images, targets, color

    return forever(), config.nc, used_workers
