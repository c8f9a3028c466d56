"""`--cache disk` (data/pixelcache.py): the items are the same pixels and labels as without the cache, on
the filling pass and on the memory-mapped one; edited images and damaged entries are misses; a folder
that cannot be written or is too small is handled with a clear message; nothing is written in the dataset."""

import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from datatree import tree_state

from yolov5_smddp.data.augment import AugmentParams
from yolov5_smddp.data.dataset import YoloDataset
from yolov5_smddp.data.labels import build_label_index
from yolov5_smddp.data.pixelcache import DiskPixelCache, check_space, entry_bytes
from yolov5_smddp.data.synthetic import make_default_dataset
from yolov5_smddp.errors import DataError

IMGSZ = 96


@pytest.fixture()
def data(tmp_path: Path):
    yaml_path = make_default_dataset(tmp_path / "data", n_train=10, n_val=4, imgsz=128, seed=2)
    root = yaml_path.parent

    def index(split: str):
        return build_label_index([root / "images" / split], nc=3, root=root, cache_dir=tmp_path / "labels")

    return root, index("train"), index("val")


def _items(ds: YoloDataset, seed: int, n: int) -> list:
    ds.reseed(seed)
    return [ds[i % len(ds)] for i in range(n)]


def _assert_same(a: list, b: list) -> None:
    for (img_a, t_a, path_a, shapes_a, _), (img_b, t_b, path_b, shapes_b, _) in zip(a, b, strict=True):
        assert path_a == path_b and shapes_a == shapes_b
        np.testing.assert_array_equal(np.asarray(img_a), np.asarray(img_b))
        np.testing.assert_array_equal(t_a, t_b)


def test_items_are_the_same_pixels_filling_and_reading(data, tmp_path):
    root, train, val = data
    before = tree_state(root)
    plain = YoloDataset(train, IMGSZ, augment=True, hyp=AugmentParams(mixup=0.3), seed=0)
    cache = DiskPixelCache(tmp_path / "pixels", IMGSZ, augment=True)
    cached = YoloDataset(train, IMGSZ, augment=True, hyp=AugmentParams(mixup=0.3), seed=0, disk_cache=cache)
    expected = _items(plain, 5, 24)
    _assert_same(_items(cached, 5, 24), expected)  # filling (mosaic partners: decoded, then written)
    entries = sorted(cache.folder.rglob("*.bgr"))
    assert len(entries) == len(train.images)  # 24 mosaics of 10 images: every image was drawn
    assert not list(cache.folder.rglob("*.tmp"))
    entry = cache.get(cache.key(train.images[0]), cached.resized_hw(0))
    np.testing.assert_array_equal(entry, plain._decode_resized(0))
    assert entries[0].stat().st_size == entry.nbytes  # raw pixels, nothing else
    _assert_same(_items(cached, 5, 24), expected)  # reading: every image from the cache
    # validation (letterbox, INTER_AREA when shrinking) has its own entries
    val_plain = YoloDataset(val, IMGSZ, augment=False, hyp=None, rect=True, batch_size=2, pad=0.5)
    val_cache = DiskPixelCache(tmp_path / "pixels", IMGSZ, augment=False)
    val_cached = YoloDataset(
        val, IMGSZ, augment=False, hyp=None, rect=True, batch_size=2, pad=0.5, disk_cache=val_cache
    )
    for _ in range(2):
        _assert_same(_items(val_cached, 0, 4), _items(val_plain, 0, 4))
    assert val_cache.folder != cache.folder and len(list(val_cache.folder.rglob("*.bgr"))) == 4
    assert tree_state(root) == before  # nothing written in the dataset


def test_an_edited_image_is_a_miss_and_a_damaged_entry_is_redone(data, tmp_path):
    _, train, _ = data
    cache = DiskPixelCache(tmp_path / "pixels", IMGSZ, augment=True)
    ds = YoloDataset(train, IMGSZ, augment=True, hyp=None, disk_cache=cache)
    image = train.images[3]
    first = np.array(ds.load_image(3))
    old_key = cache.key(image)
    assert cache.get(old_key, ds.resized_hw(3)) is not None
    # the image is replaced by its mirror image (same size on disk, new mtime): a new entry
    import cv2

    cv2.imwrite(str(image), cv2.flip(cv2.imread(str(image)), 1))
    os.utime(image, ns=(os.stat(image).st_atime_ns, os.stat(image).st_mtime_ns + 10**9))
    assert cache.key(image) != old_key
    fresh = YoloDataset(train, IMGSZ, augment=True, hyp=None, disk_cache=cache).load_image(3)
    np.testing.assert_array_equal(fresh, YoloDataset(train, IMGSZ, augment=True, hyp=None)._decode_resized(3))
    assert not np.array_equal(np.asarray(fresh), first)
    # a truncated entry (and so one of another shape) is a miss, and gets rewritten by the next decode
    key = cache.key(image)
    entry = next(cache.folder.rglob(f"{key}.bgr"))
    entry.write_bytes(entry.read_bytes()[:200])
    assert cache.get(key, ds.resized_hw(3)) is None
    ds.load_image(3)
    np.testing.assert_array_equal(cache.get(key, ds.resized_hw(3)), fresh)


def test_a_folder_that_cannot_be_written_warns_once_and_decodes(data, tmp_path, caplog):
    _, train, _ = data
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    cache = DiskPixelCache(blocker, IMGSZ, augment=True)
    plain = YoloDataset(train, IMGSZ, augment=True, hyp=None, seed=1)
    cached = YoloDataset(train, IMGSZ, augment=True, hyp=None, seed=1, disk_cache=cache)
    with caplog.at_level(logging.WARNING, logger="yolov5_smddp.data.pixelcache"):
        _assert_same(_items(cached, 2, 6), _items(plain, 2, 6))
    warnings = [r.getMessage() for r in caplog.records if "--cache disk: cannot write" in r.getMessage()]
    assert len(warnings) == 1 and str(blocker) in warnings[0]
    assert cache.writable is False


def test_space_check_names_the_folder_and_the_sizes(tmp_path, monkeypatch):
    cache = DiskPixelCache(tmp_path / "pixels", 640, augment=True)
    need = entry_bytes([(480, 640)] * 1000)
    assert need == 1000 * 480 * 640 * 3
    assert "0.92 GB in all, 0.00 GB cached already" in check_space([(cache, need)])
    free = shutil.disk_usage(tmp_path).free
    monkeypatch.setattr(
        "yolov5_smddp.data.pixelcache.shutil.disk_usage", lambda _p: shutil._ntuple_diskusage(1, 1, 10**8)
    )
    with pytest.raises(DataError) as exc:
        check_space([(cache, need)])
    message = str(exc.value)
    assert str(tmp_path / "pixels") in message and "need 0.9 GB" in message and "0.1 GB is free" in message
    assert "--cache-dir" in message and free > 0
