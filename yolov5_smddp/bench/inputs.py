"""Batches for `bench train`: pre-staged on the device (measures the GPU alone) or from the full data
pipeline (the project's dataset + DataLoader, to expose input-bound settings).

Every batch is (images uint8 [B, 3, H, W], targets float32 [n, 6] = (image index, class, xc, yc, w, h)
normalised to the network input), the loader's contract; the step converts images on the device.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from yolov5_smddp.errors import DataError

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
    batch: int, imgsz: int, nc: int, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """STAGED_BATCHES random uint8 batches and their targets, already on `device`."""
    generator = torch.Generator().manual_seed(0)
    return [
        (
            torch.randint(0, 256, (batch, 3, imgsz, imgsz), dtype=torch.uint8, generator=generator).to(
                device
            ),
            synthetic_targets(batch, nc, generator).to(device),
        )
        for _ in range(STAGED_BATCHES)
    ]


def stage(loader_batches: Iterator[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> list:
    """The first STAGED_BATCHES batches of a real pipeline, copied to `device` once."""
    return [
        (images.to(device), targets.to(device))
        for images, targets in itertools.islice(loader_batches, STAGED_BATCHES)
    ]


def dataset_yaml(data: str, scratch: Path, imgsz: int, batch: int) -> Path:
    """`data` as a data.yaml path; "synthetic" writes the embedded default dataset under `scratch`
    (SYNTHETIC_BATCHES_PER_EPOCH batches of `batch` images)."""
    if data == "synthetic":
        from yolov5_smddp.data.synthetic import make_default_dataset

        folder = scratch / f"synthetic-{imgsz}-{batch}"
        return make_default_dataset(folder, n_train=batch * SYNTHETIC_BATCHES_PER_EPOCH, n_val=0, imgsz=imgsz)
    return Path(data)


def pipeline_batches(
    yaml_path: Path, *, imgsz: int, batch: int, workers: int, hyp: dict, cache_dir: Path, local_gpus: int
) -> tuple[Iterator[tuple[torch.Tensor, torch.Tensor]], int, int]:
    """Endless (images, targets) from the training pipeline (mosaic augmentation on, as in training);
    returns (batches, number of classes, DataLoader workers used). Label caches go to `cache_dir`, never
    into the dataset."""
    from yolov5_smddp.data.config import load_data_config
    from yolov5_smddp.data.dataset import YoloDataset
    from yolov5_smddp.data.labels import build_label_index
    from yolov5_smddp.data.loader import build_dataloader, num_workers_per_rank

    config = load_data_config(yaml_path)
    index = build_label_index(
        config.train, nc=config.nc, root=config.root, cache_dir=cache_dir, workers=max(workers, 1)
    )
    dataset = YoloDataset(index, imgsz, augment=True, hyp=hyp, batch_size=batch)
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

    def forever() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for epoch in itertools.count():
            loader.sampler.set_epoch(epoch)
            for images, targets, _paths, _shapes, _color in loader:
                yield images, targets

    return forever(), config.nc, used_workers
