"""Default mosaic sampling is the release's: the item's image in a uniformly random quadrant and three
partners drawn uniformly, with replacement, from the whole dataset (with the RAM cache: from this rank's
cached shard). Checked on the plans (which images, in which tiles), decided before any decode."""

from types import SimpleNamespace

import numpy as np
import pytest

from yolov5_smddp.data.dataset import YoloDataset
from yolov5_smddp.data.labels import build_label_index
from yolov5_smddp.data.synthetic import make_default_dataset

N, BATCH, BATCHES = 400, 16, 300


def _index(n: int) -> SimpleNamespace:
    """What YoloDataset reads of a LabelIndex; planning a mosaic touches no file."""
    return SimpleNamespace(
        images=[f"/nonexistent/{i}.jpg" for i in range(n)],
        shapes=np.full((n, 2), (192, 256), np.int32),
        labels=[np.zeros((0, 5), np.float32)] * n,
    )


def _release_expected_distinct(n: int, batch: int) -> float:
    """Expected distinct images in a batch of `batch` mosaics: the batch's own images are distinct (one
    shuffled pass), each of the 3 * batch partners is uniform over n, so an image outside the batch is
    missed by all of them with probability (1 - 1/n)^(3 * batch)."""
    return batch + (n - batch) * (1 - (1 - 1 / n) ** (3 * batch))


def test_default_partners_are_uniform_over_the_dataset_and_the_primary_quadrant_is_random():
    ds = YoloDataset(_index(N), 160, augment=True, hyp=None, seed=3)
    assert ds.mosaic_partners == "random"
    order = np.random.default_rng(0).permutation(N)
    distinct, quadrants, partner_counts = [], np.zeros(4, int), np.zeros(N, int)
    for b in range(BATCHES):
        items = order[(b * BATCH) % N : (b * BATCH) % N + BATCH]
        seen = set()
        for i in items:
            plan = ds.mosaic_plan(int(i))
            assert len(plan) == 4 and int(i) in plan and all(0 <= j < N for j in plan)
            quadrants[plan.index(int(i))] += 1
            partners = list(plan)
            partners.remove(int(i))
            partner_counts[partners] += 1
            seen.update(plan)
        distinct.append(len(seen))
    expected = _release_expected_distinct(N, BATCH)  # 59.5 for 400 images, batch 16
    # sd of one batch's count is about 3; the mean of 300 batches is within +/- 1 of the expectation
    assert abs(np.mean(distinct) - expected) < 1.0, (np.mean(distinct), expected)
    # every quadrant ~ 1/4 of 4,800 plans (sd ~30)
    assert (np.abs(quadrants - BATCHES * BATCH / 4) < 150).all(), quadrants
    # 14,400 partner draws over 400 images: every image drawn, none far from 36 per image (Poisson sd 6)
    assert partner_counts.min() > 10 and partner_counts.max() < 70
    chi2 = ((partner_counts - partner_counts.mean()) ** 2 / partner_counts.mean()).sum()
    assert chi2 < 520, chi2  # 399 degrees of freedom: p ~ 3e-5 beyond


def test_plans_depend_only_on_the_seed():
    a = YoloDataset(_index(50), 160, augment=True, hyp=None, seed=7)
    b = YoloDataset(_index(50), 160, augment=True, hyp=None, seed=7)
    assert [a.mosaic_plan(i) for i in range(50)] == [b.mosaic_plan(i) for i in range(50)]


@pytest.mark.parametrize("mode", ["bogus", ""])
def test_unknown_partner_mode_is_refused(mode):
    with pytest.raises(Exception, match="mosaic_partners must be one of"):
        YoloDataset(_index(4), 160, augment=True, hyp=None, mosaic_partners=mode)


def test_ram_cache_partners_come_from_this_ranks_shard(tmp_path):
    yaml_path = make_default_dataset(tmp_path / "d", n_train=12, n_val=0, imgsz=64, seed=1)
    index = build_label_index(
        [yaml_path.parent / "images" / "train"], nc=3, root=yaml_path.parent, cache_dir=tmp_path / "c"
    )
    ds = YoloDataset(index, 64, augment=True, hyp=None, cache_images="ram", seed=2)
    shard = list(range(1, 12, 3))  # rank 1 of 3
    ds.cache_shard(shard)
    for i in shard * 20:
        plan = ds.mosaic_plan(i)
        assert set(plan) <= set(shard), plan
    img, targets, _path, _shapes, _color = ds[shard[0]]
    assert img.shape == (3, 64, 64) and targets.shape[1] == 6
