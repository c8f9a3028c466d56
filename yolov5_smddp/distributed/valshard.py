"""Splitting validation across ranks: each rank validates a contiguous block of WHOLE rectangular batches.

Whole batches keep every batch's letterbox shape the one a single process would use (the dataset sorts
images by aspect ratio and gives each batch its own input size), so each image's detections are the
same at any world size. Contiguous blocks in rank order mean that concatenating the ranks' match
results in rank order gives exactly the single-process order, so the (stable-sorted) metrics are
identical too. Nothing is padded or repeated: torch's DistributedSampler would duplicate images to
even out the shards and count them twice.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import Sampler


def shard_batches(batch_count: int, world: int, rank: int) -> range:
    """The batch indices rank `rank` of `world` validates: a contiguous block; block sizes differ by at
    most one, larger blocks first; ranks past the batch count get an empty range."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"shard_batches: rank {rank} is not in a world of {world}")
    base, extra = divmod(max(batch_count, 0), world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def shard_images(n_images: int, batch_size: int, world: int, rank: int) -> range:
    """The dataset indices of rank `rank`'s batches (batches of `batch_size`, the last one short)."""
    batch_size = max(batch_size, 1)
    batches = shard_batches(-(-n_images // batch_size), world, rank)
    return range(min(batches.start * batch_size, n_images), min(batches.stop * batch_size, n_images))


def split_summary(n_images: int, batch_size: int, world: int) -> str:
    """How the images are split, for the log: '15 of 30 images on each of 2 ranks', or
    'images per rank 16/14 of 30 on 2 ranks' when the shares differ, '8 of 8 images on 1 rank' alone."""
    counts = [len(shard_images(n_images, batch_size, world, r)) for r in range(world)]
    if world == 1:
        return f"{n_images} of {n_images} images on 1 rank"
    if len(set(counts)) == 1:
        return f"{counts[0]} of {n_images} images on each of {world} ranks"
    return f"images per rank {'/'.join(map(str, counts))} of {n_images} on {world} ranks"


class ContiguousSampler(Sampler[int]):
    """Yields the indices of a `range` in order (one rank's validation shard)."""

    def __init__(self, indices: range) -> None:
        self.indices = indices

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def set_epoch(self, epoch: int) -> None:  # the same shard every epoch
        del epoch
