"""The data wiring of a training run: the embedded dataset, the one label scan (`scan_split`, also used
by the SageMaker dataset check, `val` and `bench data`), the train/val `DataBundle`, the pixel and
restart-marker caches under the cache folder, and the loaders of this rank. It reads the run's options
(`config`: a TrainConfig, read by attribute); the data/ package it drives takes plain values and the typed
Hyp (read by attribute)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from yolov5_smddp.data.config import DataConfig, load_data_config
from yolov5_smddp.data.labels import LabelIndex, build_label_index, collapse_to_one_class, scan_workers
from yolov5_smddp.data.pixelcache import DiskPixelCache, check_space, entry_bytes
from yolov5_smddp.data.restart_cache import RestartCache, restart_cache_for

if TYPE_CHECKING:
    from yolov5_smddp.config.hyp import Hyp
    from yolov5_smddp.config.train_config import TrainConfig
    from yolov5_smddp.distributed.process_group import DistInfo

log = logging.getLogger("yolov5_smddp")

# LAZY: the SageMaker driver imports this module for `scan_split` and scans before any worker starts; it must
# not pull in torch or OpenCV (tests/unit/test_import_weight.py), so the functions that build datasets and
# loaders import them where they run.


def default_dataset(cache_dir: Path) -> Path:
    """The embedded dataset under `cache_dir` (never an output folder: SageMaker would upload it):
    generated once, in a temporary folder renamed into place, so concurrent ranks never see a
    half-written dataset (the first rename wins; it is deterministic). The folder name carries the
    generator's version, so a cache kept between jobs (warm pool) never serves an older dataset."""
    from yolov5_smddp.data.synthetic import DATASET_VERSION, make_default_dataset  # OpenCV: see LAZY

    name = f"default-dataset-v{DATASET_VERSION}"
    final = cache_dir / name
    if not (final / "data.yaml").is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=cache_dir))
        make_default_dataset(tmp)
        try:
            os.rename(tmp, final)
        except OSError:  # another rank's copy landed first
            shutil.rmtree(tmp, ignore_errors=True)
    return final / "data.yaml"


@dataclass
class DataBundle:
    """The run's dataset after the one label scan: class names and count (after --single-cls), the train
    and val label indexes."""

    names: list[str]
    nc: int
    train_index: LabelIndex
    val_index: LabelIndex


def scan_split(data: DataConfig, split: str, *, cache_dir: Path, workers: int, max_pixels: int) -> LabelIndex:
    """Index the labels of one split of `data` ("train", "val" or "test"): the one label scan of the
    trainer (every rank), the SageMaker pre-launch check, `val` and `bench data`. A stale or foreign label
    cache is reported and ignored (ours is rebuilt under `cache_dir`, nothing is written elsewhere);
    `workers` scan threads; images whose header claims more than `max_pixels` pixels are skipped."""
    return build_label_index(
        {"train": data.train, "val": data.val, "test": data.test}[split],
        image_dir=data.image_dirs.get(split),
        nc=data.nc,
        root=data.root,
        cache_policy="rebuild",
        cache_dir=cache_dir,
        workers=workers,
        max_pixels=max_pixels,
    )


def scan_data(config: TrainConfig, cache_dir: Path) -> DataBundle:
    """Resolve data.yaml (or the embedded dataset) and index train and val labels (every rank does this);
    with --single-cls every label is class 0 (named 'item' unless the dataset names its one class)."""
    data_yaml = Path(config.data) if config.data else default_dataset(cache_dir)
    data = load_data_config(data_yaml, cache_dir=cache_dir)
    scan = {
        "cache_dir": cache_dir,
        "workers": scan_workers(os.cpu_count() or 1),
        "max_pixels": config.max_image_pixels,
    }
    train_index = scan_split(data, "train", **scan)
    val_index = scan_split(data, "val", **scan)
    if config.single_cls:  # the release's --single-cls
        names, nc = single_class(data, train_index, val_index)
        return DataBundle(names, nc, train_index, val_index)
    return DataBundle(list(data.names), data.nc, train_index, val_index)


def single_class(data: DataConfig, *indexes: LabelIndex) -> tuple[list[str], int]:
    """--single-cls (train and val alike): every label of `indexes` becomes class 0; returns the one
    class's (names, nc): named as the dataset names its one class, else 'item'."""
    for index in indexes:
        collapse_to_one_class(index)
    return (list(data.names) if data.nc == 1 else ["item"]), 1


def disk_caches(
    config: TrainConfig, bundle: DataBundle, cache_dir: Path, *, main: bool
) -> tuple[DiskPixelCache | None, DiskPixelCache | None]:
    """With `--cache disk`: the train and val pixel caches under cache_dir/pixels (one resize rule each),
    after checking that the folder can hold them (DataError naming sizes and folder); else (None, None)."""
    if config.cache != "disk":
        return None, None
    from yolov5_smddp.data.dataset import resized_hw  # OpenCV: see LAZY

    train = DiskPixelCache(cache_dir / "pixels", config.imgsz, augment=True)
    val = DiskPixelCache(cache_dir / "pixels", config.imgsz, augment=False)

    def need(index) -> int:
        shapes = np.asarray(index.shapes).reshape(-1, 2)
        return entry_bytes(resized_hw(shape, config.imgsz) for shape in shapes)

    caches = [(train, need(bundle.train_index))]
    if bundle.val_index is not None and len(bundle.val_index.images):
        caches.append((val, need(bundle.val_index)))
    line = check_space(caches)
    if main:
        log.info("%s", line)
    return train, val if len(caches) > 1 else None


def restart_cache(
    config: TrainConfig, bundle: DataBundle, cache_dir: Path, *, main: bool
) -> RestartCache | None:
    """With `--jpeg-restart-cache on` where tiles are region-decoded (mosaic with the release's sampling,
    no --cache): the restart-marker copies' cache under cache_dir, when its disk has room for them
    (data.restart_cache); else None. The main rank logs which."""
    from yolov5_smddp.data.dataset import decodes_regions  # OpenCV: see LAZY

    regions = decodes_regions(
        augment=True, cached=config.cache is not None, mosaic_partners=config.mosaic_partners
    )
    if config.jpeg_restart_cache != "on" or not regions:
        return None
    cache, line = restart_cache_for(cache_dir, list(bundle.train_index.images))
    if main:
        log.info("%s", line)
    return cache


def build_loaders(
    config: TrainConfig,
    bundle: DataBundle,
    hyp: Hyp,
    per_rank: int,
    info: DistInfo,
    stride: int,
    color_on_device: bool,
    cache_dir: Path,
):
    """Train loader for this rank; val loader over this rank's shard of whole val batches (see valshard).
    `color_on_device`: the train items leave HSV and flips to the device batch; `cache_dir`: where
    `--cache disk` keeps the decoded images. DataError when the training set cannot fill one batch per
    rank, or the cache folder cannot hold the decoded images."""
    # torch and OpenCV, imported here (LAZY)
    from yolov5_smddp.data.dataset import YoloDataset
    from yolov5_smddp.data.loader import build_dataloader, check_batch_fits, num_workers_per_rank
    from yolov5_smddp.train.compile_settings import fixed_shape_compile

    check_batch_fits(len(bundle.train_index.images), per_rank, info.world_size)
    workers = num_workers_per_rank(os.cpu_count() or 1, info.local_world_size, per_rank, config.workers)
    workers = shm_workers(workers, per_rank, config.imgsz, info)
    train_pixels, val_pixels = disk_caches(config, bundle, cache_dir, main=info.rank == 0)
    dataset_class = YoloDataset
    if config.loader == "gpu":  # issue 40: the workers read bytes, the device decodes and augments
        from yolov5_smddp.data.bytes_dataset import BytesDataset

        dataset_class = BytesDataset
    train_set = dataset_class(
        bundle.train_index,
        config.imgsz,
        augment=True,
        hyp=hyp,
        rect=config.rect,
        batch_size=per_rank,
        stride=stride,
        cache_images="ram" if config.cache == "ram" else None,  # disk: disk_cache
        mosaic_partners=config.mosaic_partners,
        seed=config.seed,
        color_on_device=color_on_device,
        disk_cache=train_pixels,
        restart_cache=restart_cache(config, bundle, cache_dir, main=info.rank == 0),
    )
    train_loader = build_dataloader(
        train_set,
        batch_size=per_rank,
        rank=info.rank,
        world_size=info.world_size,
        workers=workers,
        shuffle=not config.rect,
        seed=config.seed,
        # the release's: each epoch sees every image (last batch may be partial); under a fixed-shape
        # --compile the partial batch is dropped (one shape, one compile: compile_settings)
        drop_last=fixed_shape_compile(config.compile, config.rect, config.multi_scale),
    )
    if config.loader == "gpu":  # batches assembled on the device (data.gpu_batch)
        from yolov5_smddp.data.gpu_batch import wrap_loader

        train_loader = wrap_loader(train_loader)
    val_loader = val_shard_loader(config, bundle, hyp, per_rank, info, stride, workers, val_pixels)
    return train_loader, val_loader, workers


def shm_workers(workers: int, per_rank: int, imgsz: int, info) -> int:
    """`workers`, or fewer when /dev/shm cannot hold their batches (data/shm_budget: one line says so)."""
    from yolov5_smddp.data.shm_budget import plan_workers, shm_free_bytes

    plan = plan_workers(
        workers, per_rank=per_rank, imgsz=imgsz, local_ranks=info.local_world_size, shm_free=shm_free_bytes()
    )
    if plan.line and info.local_rank == 0:
        log.warning("%s", plan.line)
    return plan.workers


def val_shard_loader(
    config: TrainConfig,
    bundle: DataBundle,
    hyp: Hyp,
    per_rank: int,
    info: DistInfo,
    stride: int,
    workers: int,
    val_pixels: DiskPixelCache | None,
):
    """The val loader of this rank: its shard of whole batches of 2 x `per_rank` images (valshard; one
    log line on rank 0 says the split)."""
    from yolov5_smddp.data.loader import build_val_loader  # torch (see build_loaders)
    from yolov5_smddp.distributed.valshard import split_summary

    val_batch = per_rank * 2
    val_loader = build_val_loader(
        bundle.val_index,
        config.imgsz,
        batch_size=val_batch,
        stride=stride,
        workers=workers,
        rank=info.rank,
        world_size=info.world_size,
        hyp=hyp,
        disk_cache=val_pixels,
    )
    if info.rank == 0:
        log.info("val: %s", split_summary(len(val_loader.dataset), val_batch, info.world_size))
    return val_loader
