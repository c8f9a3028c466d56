"""DataLoader assembly: samplers, worker count, seeding and the batch collate.

Seeding: the loader's generator is seeded with seed + rank, so each rank draws its own base seed each
epoch; each worker reseeds its dataset copy (augmentations), numpy and random from torch's per-worker
seed (base seed + worker id). Same seed, rank and worker count → the same batches.

Sampler: torch's DistributedSampler (global shuffle per epoch; call `loader.sampler.set_epoch(e)` every
epoch). With the RAM cache under DDP a ShardSampler is used instead: each rank keeps a FIXED shard
(indices rank, rank + world, ...) shuffled within itself each epoch, so a rank only ever reads — and
caches — its own 1/world of the images, and a node holds the decoded dataset once, not once per rank.

Failures: the loader (`YoloLoader`) turns a dead worker into a message naming --workers, /dev/shm and
the memory figures (see `worker_errors`), and after each pass logs how many samples hit an image that
could not be decoded (training: replaced; validation: left out of the batch by `collate`).
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import threading
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from yolov5_smddp.data.augment import AugmentSource
from yolov5_smddp.data.dataset import Skipped, YoloDataset
from yolov5_smddp.data.worker_errors import (
    LoaderContext,
    dead_workers,
    explain_worker_failure,
    install_sigchld_explainer,
    worker_death_error,
)
from yolov5_smddp.distributed.valshard import ContiguousSampler, shard_images
from yolov5_smddp.errors import DataError

log = logging.getLogger(__name__)
_EMPTY_SIDE = 32  # an all-skipped validation batch: no images, one stride in size


def num_workers_per_rank(cpu_count: int, local_gpus: int, batch_per_rank: int, user_workers: int) -> int:
    """DataLoader workers for one rank: the CPUs of THIS node split over its local GPUs (never the global
    world size), capped by the user's --workers and by the batch size. 0 means load in the main process."""
    per_device = max(cpu_count, 0) // max(local_gpus, 1)
    return max(min(per_device, max(batch_per_rank, 0), max(user_workers, 0)), 0)


def steps_per_epoch(n_images: int, batch_per_rank: int, world_size: int) -> int:
    """Training batches per rank and epoch, as the release's loader (drop_last=False): each rank gets
    ceil(n / world) indices (the sampler pads short ranks by repeating indices, so all ranks take the same
    number of steps) and the last batch may be incomplete (the same size on every rank)."""
    per_rank = math.ceil(max(n_images, 0) / max(world_size, 1))
    return math.ceil(per_rank / max(batch_per_rank, 1))


def check_batch_fits(n_images: int, batch_per_rank: int, world_size: int) -> None:
    """DataError when the training set cannot fill one batch per rank.

    An error rather than a smaller batch: the global batch fixes the gradient accumulation, the weight
    decay scale and the learning rates, so training every step on fewer images would train something
    else than asked. (A partial LAST batch of an epoch is kept, as the release keeps it.)
    """
    per_rank_images = n_images // max(world_size, 1)
    if per_rank_images >= batch_per_rank:
        return
    fix = (
        f"use --batch-per-gpu {per_rank_images} or less (--batch-size {per_rank_images * world_size}), or add images"
        if per_rank_images
        else f"use at most {n_images} rank(s), or add images"
    )
    raise DataError(
        f"the training set has {n_images} usable images: with {world_size} rank(s) each rank gets "
        f"{per_rank_images}, fewer than its batch of {batch_per_rank}, so every step would train on fewer "
        f"images than the batch asked for; {fix}"
    )


class ShardSampler(Sampler[int]):
    """A fixed per-rank shard (rank::world_size), reshuffled inside itself every epoch.

    Ranks' shards are disjoint and together cover the dataset; with drop_last all shards are cut to
    the same length (so ranks take the same number of steps), without it short shards are padded by
    repeating their own indices.
    """

    def __init__(
        self, n: int, *, rank: int, world_size: int, shuffle: bool, seed: int, drop_last: bool
    ) -> None:
        self.shard = list(range(rank, n, world_size))
        self.length = n // world_size if drop_last else math.ceil(n / world_size)
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[int]:
        order = list(self.shard)
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = [order[i] for i in torch.randperm(len(order), generator=g).tolist()]
        while order and len(order) < self.length:
            order += order[: self.length - len(order)]
        return iter(order[: self.length])


def collate(
    batch: list[tuple],
) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...], tuple, torch.Tensor | None]:
    """Items → (imgs uint8 [B, 3, H, W], targets float32 [n, 6] (image index in batch, cls, xc, yc, w, h),
    paths, shapes, colour).

    `imgs` has channels-last strides (memory order B, H, W, C): the items are CHW views of HWC arrays,
    so stacking them as HWC is one plain copy per image, where a CHW copy would be a strided transpose.
    `imgs.float()` keeps that layout (torch.channels_last); call `.contiguous()` for NCHW memory.
    colour: None, or float64 [B, 6] when the items leave HSV and flips to the device batch (imgs are then
    BGR; see `data.color.apply_color`). `Skipped` items (validation images that could not be decoded)
    are left out.
    """
    batch = [item for item in batch if not isinstance(item, Skipped)]
    if not batch:
        empty = torch.zeros((0, 3, _EMPTY_SIDE, _EMPTY_SIDE), dtype=torch.uint8)
        return empty, torch.zeros((0, 6)), (), (), None
    imgs, labels, paths, shapes, colors = zip(*batch)
    for i, lb in enumerate(labels):
        lb[:, 0] = i
    images = torch.from_numpy(np.stack([img.transpose(1, 2, 0) for img in imgs])).permute(0, 3, 1, 2)
    targets = torch.from_numpy(np.concatenate(labels)) if labels else torch.zeros((0, 6))
    color = None if colors[0] is None else torch.from_numpy(np.stack(colors))
    return images, targets, paths, shapes, color


def obey_only_the_trainers_sigterm() -> None:
    """In a loader worker: a SIGTERM from the trainer (its parent: multiprocessing's terminate()) ends
    the worker at once, as torch's own handler does; one from anyone else is ignored.

    A stop (docker stop, StopTrainingJob, max_run) sends SIGTERM to every process: the container's PID 1
    (docker/entry.py) and torch's launchers (killpg of each rank's process group) alike. torch's handler
    dies of such a signal, and the trainer, which is still finishing its step, its checkpoint and its
    model folder, would report a dead worker. So SIGTERM is blocked in this thread (and the threads it
    starts) and a watcher thread takes it with sigwaitinfo, which names the sender."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def watch() -> None:
        while True:
            info = signal.sigwaitinfo({signal.SIGTERM})
            if info.si_pid == os.getppid():
                os._exit(0)

    threading.Thread(target=watch, name="sigterm-from-trainer", daemon=True).start()


def _worker_init(worker_id: int) -> None:
    import cv2

    from yolov5_smddp import hostmem

    obey_only_the_trainers_sigterm()
    cv2.setNumThreads(0)  # one OpenCV thread per worker: workers are the parallelism
    hostmem.tune_malloc()  # inherited when forked; needed when spawned
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
    info = torch.utils.data.get_worker_info()
    if info is not None and hasattr(info.dataset, "reseed"):
        info.dataset.reseed(seed)


class YoloLoader(DataLoader):
    """A DataLoader whose iteration explains a failed worker (LoaderWorkerDied, see `worker_errors`) and,
    at the end of each pass, logs the samples that hit an undecodable image (the dataset counts them)."""

    def __init__(self, *args, rank: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rank = rank

    def __iter__(self):
        context = LoaderContext(self.rank, self.num_workers, self.batch_size or 1)
        counter = getattr(self.dataset, "undecodable_samples", None)
        before = counter.value if counter is not None else 0
        batches = None
        try:
            batches = super().__iter__()
            if self.num_workers > 0:
                install_sigchld_explainer(context)
            yield from batches
        except Exception as exc:
            if isinstance(exc, (EOFError, ConnectionError)) and (dead := dead_workers(batches)):
                exc = worker_death_error(dead)  # killed while handing a batch over
            explained = explain_worker_failure(exc, context)
            if explained is None:
                raise
            raise explained from exc
        failed = counter.value - before if counter is not None else 0
        if failed and getattr(self.dataset, "augment", True):
            log.warning(
                "rank %d: %d training sample(s) of this pass hit an image that could not be decoded and "
                "used another in its place (the files are named in the 'skipped:' lines)",
                self.rank,
                failed,
            )
        elif failed:
            log.warning(
                "validation left out %d of %d images that could not be decoded (named in the 'skipped:' "
                "lines): the metrics cover %d images",
                failed,
                len(self.dataset),
                len(self.dataset) - failed,
            )


def build_dataloader(
    dataset,
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    workers: int,
    shuffle: bool,
    seed: int,
    drop_last: bool,
    pin_memory: bool | None = None,
) -> DataLoader:
    """A DataLoader over `dataset` for one rank; `loader.sampler.set_epoch(epoch)` every epoch.

    `workers` is the already-decided count (see num_workers_per_rank). With a RAM-caching dataset the
    rank's shard is decoded here, before the workers start. Rectangular (rect) batches assume
    world_size 1 and shuffle=False, so that loader batches are the dataset's shape batches.
    """
    world_size = max(world_size, 1)
    if getattr(dataset, "cache_images", None) == "ram":
        sampler = ShardSampler(
            len(dataset), rank=rank, world_size=world_size, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        dataset.cache_shard(sampler.shard)
    else:
        sampler = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
    generator = torch.Generator().manual_seed(seed + rank)
    if hasattr(dataset, "reseed"):
        dataset.reseed(seed + rank)
    return YoloLoader(
        dataset,
        rank=rank,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        drop_last=drop_last,
        persistent_workers=workers > 0,
        worker_init_fn=_worker_init,
        generator=generator,
    )


def build_val_loader(
    index,
    imgsz: int,
    *,
    batch_size: int,
    stride: int,
    workers: int,
    rank: int = 0,
    world_size: int = 1,
    hyp: AugmentSource | None = None,
    disk_cache=None,
) -> YoloLoader:
    """The validation loader of training and of `yolov5-smddp val` for one rank: images of `index`
    letterboxed in rectangular batches (pad 0.5 stride), no augmentation, in order; this rank's contiguous
    block of WHOLE batches (see `valshard`), nothing padded or repeated. `disk_cache`: a
    data.pixelcache.DiskPixelCache for validation's resize rule (`--cache disk`), or None."""
    dataset = YoloDataset(
        index,
        imgsz,
        augment=False,
        hyp=hyp,
        rect=True,
        batch_size=batch_size,
        stride=stride,
        pad=0.5,
        disk_cache=disk_cache,
    )
    indices = shard_images(len(dataset), batch_size, max(world_size, 1), rank)
    return YoloLoader(
        dataset,
        rank=rank,
        batch_size=batch_size,
        sampler=ContiguousSampler(indices),
        num_workers=workers,
        collate_fn=collate,
        pin_memory=torch.cuda.is_available(),
        drop_last=False,
        persistent_workers=workers > 0,
        worker_init_fn=_worker_init,
    )
