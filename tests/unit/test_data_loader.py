"""Worker count formula, rank shards, collate, and seeded determinism of the loader."""

import numpy as np
import pytest
import torch
from datatree import watch

from yolov5_smddp.data.dataset import YoloDataset
from yolov5_smddp.data.labels import build_label_index
from yolov5_smddp.data.loader import ShardSampler, build_dataloader, collate, num_workers_per_rank
from yolov5_smddp.data.synthetic import make_default_dataset


@pytest.mark.parametrize(
    ("cpus", "local_gpus", "batch", "user", "expected"),
    [
        (96, 8, 16, 16, 12),  # 8 nodes of 8 GPUs: the node's CPUs over its LOCAL GPUs, not the world
        (96, 8, 16, 8, 8),  # capped by --workers
        (96, 8, 4, 16, 4),  # capped by the batch per rank
        (2, 1, 16, 8, 2),
        (4, 0, 16, 8, 4),  # CPU-only: all CPUs for the one process
        (8, 16, 16, 8, 0),
        (96, 8, 16, 0, 0),
    ],
)
def test_num_workers_per_rank(cpus, local_gpus, batch, user, expected):
    assert num_workers_per_rank(cpus, local_gpus, batch, user) == expected


@pytest.mark.parametrize("drop_last", [True, False])
def test_two_rank_shards_are_disjoint_and_cover(drop_last):
    ranks = [
        ShardSampler(11, rank=r, world_size=2, shuffle=True, seed=3, drop_last=drop_last) for r in (0, 1)
    ]
    for s in ranks:
        s.set_epoch(4)
    a, b = (list(s) for s in ranks)
    assert len(a) == len(b) == (5 if drop_last else 6)
    assert set(ranks[0].shard).isdisjoint(ranks[1].shard)
    assert set(ranks[0].shard) | set(ranks[1].shard) == set(range(11))
    assert set(a) <= set(ranks[0].shard) and set(b) <= set(ranks[1].shard)
    ranks[0].set_epoch(5)
    assert sorted(set(ranks[0])) == sorted(set(a)) or drop_last  # the same shard every epoch


def test_shard_order_changes_with_epoch_but_is_seeded():
    s = ShardSampler(40, rank=1, world_size=2, shuffle=True, seed=0, drop_last=True)
    s.set_epoch(0)
    e0 = list(s)
    s.set_epoch(1)
    assert list(s) != e0
    s.set_epoch(0)
    assert list(s) == e0


def test_collate_uint8_and_image_index():
    items = [
        (np.zeros((3, 8, 8), np.uint8), np.array([[0, 1, 0.5, 0.5, 0.1, 0.1]], np.float32), "a", None, None),
        (np.ones((3, 8, 8), np.uint8), np.zeros((0, 6), np.float32), "b", None, None),
        (
            np.ones((3, 8, 8), np.uint8),
            np.array([[0, 2, 0.5, 0.5, 0.1, 0.1]] * 2, np.float32),
            "c",
            None,
            None,
        ),
    ]
    imgs, targets, paths, shapes, color = collate(items)
    assert imgs.dtype == torch.uint8 and imgs.shape == (3, 3, 8, 8)
    assert imgs[1].eq(1).all() and imgs[0].eq(0).all()
    assert targets.shape == (3, 6) and targets[:, 0].tolist() == [0, 2, 2]
    assert paths == ("a", "b", "c") and shapes == (None, None, None) and color is None


@pytest.fixture(scope="module")
def small_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("syn")
    make_default_dataset(root, n_train=12, n_val=0, imgsz=96)
    watch(root, persistent=True)
    cache = tmp_path_factory.mktemp("cache")
    return build_label_index([root / "images" / "train"], nc=3, root=root, cache_dir=cache, workers=1)


def _batches(index, seed, workers, rank=0, world=1, cache=None):
    ds = YoloDataset(index, 64, augment=True, hyp=None, cache_images=cache)
    loader = build_dataloader(
        ds,
        batch_size=4,
        rank=rank,
        world_size=world,
        workers=workers,
        shuffle=True,
        seed=seed,
        drop_last=True,
    )
    loader.sampler.set_epoch(0)
    return [(imgs.clone(), targets.clone()) for imgs, targets, _p, _s, _c in loader]


def test_loader_is_deterministic_per_seed(small_index):
    a, b, c = _batches(small_index, 0, 0), _batches(small_index, 0, 0), _batches(small_index, 1, 0)
    assert len(a) == 3
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
    assert not all(torch.equal(x[0], y[0]) for x, y in zip(a, c))
    assert a[0][0].dtype == torch.uint8 and a[0][0].shape == (4, 3, 64, 64)


def test_loader_with_workers_and_ram_shard(small_index):
    batches = _batches(small_index, 0, 1, rank=1, world=2, cache="ram")
    assert len(batches) == 1  # 6 of 12 images on rank 1, batch 4, drop_last
    ds = YoloDataset(small_index, 64, augment=True, hyp=None, cache_images="ram")
    build_dataloader(ds, batch_size=4, rank=1, world_size=2, workers=0, shuffle=True, seed=0, drop_last=True)
    assert sorted(ds._ram) == list(range(1, 12, 2))  # the rank caches only its own shard


def test_default_sampler_ranks_are_disjoint_and_cover(small_index):
    seen = []
    for rank in (0, 1):
        ds = YoloDataset(small_index, 64, augment=False, hyp=None)
        loader = build_dataloader(
            ds, batch_size=3, rank=rank, world_size=2, workers=0, shuffle=True, seed=0, drop_last=True
        )
        loader.sampler.set_epoch(2)
        seen.append([p for _imgs, _t, paths, _s, _c in loader for p in paths])
    assert len(seen[0]) == len(seen[1]) == 6
    assert set(seen[0]).isdisjoint(seen[1])
    assert set(seen[0]) | set(seen[1]) == {str(p) for p in small_index.images}
