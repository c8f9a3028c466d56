"""The label cache notices an image whose content changed at the same size (issue 50 item 5): the next
run re-checks it instead of trusting the cache, as a fresh scan would."""

from __future__ import annotations

import logging
import os

import cv2
import numpy as np

from yolov5_smddp.data.content_mark import EDGE_BYTES, image_mark
from yolov5_smddp.data.labels import build_label_index


def _dataset(root, n=4):
    for i in range(n):
        img = root / "images" / "train" / f"{i}.jpg"
        img.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(img), np.full((20, 30, 3), 40 + i, np.uint8))
        lbl = root / "labels" / "train" / f"{i}.txt"
        lbl.parent.mkdir(parents=True, exist_ok=True)
        lbl.write_text(f"{i % 2} 0.5 0.5 0.25 0.25\n")


def _index(root, cache):
    return build_label_index([root / "images" / "train"], nc=2, root=root, workers=1, cache_dir=cache)


def _usable(index) -> int:
    return sum(1 for labels in index.labels if len(labels))


def test_an_image_replaced_by_garbage_of_the_same_size_is_rechecked(tmp_path, caplog):
    data, cache = tmp_path / "data", tmp_path / "cache"
    _dataset(data)
    first = _index(data, cache)
    assert (first.report.cache, _usable(first)) == ("built", 4)
    image = data / "images" / "train" / "2.jpg"
    stat = image.stat()
    image.write_bytes(b"\x00garbage" * (stat.st_size // 8) + b"\x00" * (stat.st_size % 8))
    os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
    with caplog.at_level(logging.INFO, logger="yolov5_smddp.data.labels"):
        second = _index(data, cache)
    assert second.report.cache == "built"
    assert _usable(second) == 3  # as a fresh scan counts
    assert any("1 (e.g. images/train/2.jpg) images changed content" in r.getMessage() for r in caplog.records)
    assert _index(data, cache).report.cache == "loaded"  # and the new cache is trusted again


def test_the_mark_sees_either_end_and_the_size(tmp_path):
    path = tmp_path / "a.bin"
    data = bytearray(os.urandom(3 * EDGE_BYTES))
    path.write_bytes(data)
    mark = image_mark(str(path))
    for offset in (0, len(data) - 1):
        changed = bytearray(data)
        changed[offset] ^= 1
        path.write_bytes(changed)
        assert image_mark(str(path)) != mark
    path.write_bytes(data + b"x")
    assert image_mark(str(path)) != mark
    assert image_mark(str(tmp_path / "missing.jpg")) == ""
