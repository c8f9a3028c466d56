"""Our label cache (relocatable, content-validated, atomic) and the release's foreign pickle cache."""

import logging
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

from yolov5_smddp.data import labels as labels_module
from yolov5_smddp.data.cache import ScanTable, stale_reason
from yolov5_smddp.data.labels import build_label_index
from yolov5_smddp.errors import DataError

LOG = "yolov5_smddp.data.labels"


def _dataset(root: Path, n: int = 3) -> Path:
    for i in range(n):
        img = root / "images" / "train" / f"{i}.jpg"
        img.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(img), np.full((20, 30, 3), 50 + i, np.uint8))
        lbl = root / "labels" / "train" / f"{i}.txt"
        lbl.parent.mkdir(parents=True, exist_ok=True)
        lbl.write_text(f"{i % 2} 0.5 0.5 0.25 0.25\n")
    return root / "images" / "train"


def _index(root: Path, **kwargs):
    return build_label_index([root / "images" / "train"], nc=2, root=root, workers=2, **kwargs)


def test_cache_is_written_next_to_labels_and_reused(tmp_path, caplog):
    _dataset(tmp_path)
    first = _index(tmp_path, cache_dir=tmp_path / "elsewhere")
    assert first.report.cache == "built"
    assert first.cache_path.parent == tmp_path / "labels"
    assert first.cache_path.suffix == ".npz"
    with np.load(first.cache_path, allow_pickle=False) as npz:  # plain arrays only
        assert not any(npz[k].dtype == object for k in npz.files)
        assert npz["images"].tolist() == ["images/train/0.jpg", "images/train/1.jpg", "images/train/2.jpg"]
    second = _index(tmp_path)
    assert second.report.cache == "loaded"
    assert [lb.tolist() for lb in second.labels] == [lb.tolist() for lb in first.labels]


def test_relocated_dataset_keeps_its_cache(tmp_path):
    original = tmp_path / "laptop" / "data"
    _dataset(original)
    built = _index(original)
    moved = tmp_path / "opt" / "ml" / "input" / "data" / "training"
    shutil.copytree(original, moved)
    shutil.rmtree(original)
    index = _index(moved)
    assert index.report.cache == "loaded"
    assert index.images[0] == moved / "images" / "train" / "0.jpg"
    assert [lb.tolist() for lb in index.labels] == [lb.tolist() for lb in built.labels]


def test_same_size_label_edit_rejects_cache_with_one_line(tmp_path, caplog):
    _dataset(tmp_path)
    _index(tmp_path)
    label = tmp_path / "labels" / "train" / "1.txt"
    before = label.read_text()
    label.write_text(before.replace("0.25 0.25", "0.20 0.25"))
    assert len(label.read_text()) == len(before)
    with caplog.at_level(logging.INFO, logger=LOG):
        index = _index(tmp_path)
    assert index.report.cache == "built"
    stale = [r.getMessage() for r in caplog.records if "stale" in r.getMessage()]
    assert len(stale) == 1
    assert "labels of 1 (e.g. images/train/1.jpg) images edited" in stale[0]
    np.testing.assert_allclose(index.labels[1][0, 3], 0.20)


def _read_only(monkeypatch, folder: Path) -> None:
    """Make `folder` read-only for the scan (permission bits alone do not stop root in the container)."""
    real = labels_module.is_writable_dir
    monkeypatch.setattr(labels_module, "is_writable_dir", lambda d: Path(d) != folder and real(d))


def test_read_only_labels_folder_writes_to_cache_dir(tmp_path, monkeypatch):
    _dataset(tmp_path)
    _read_only(monkeypatch, tmp_path / "labels")
    index = _index(tmp_path, cache_dir=tmp_path / "cachedir")
    assert index.cache_path.parent == tmp_path / "cachedir"
    assert not list((tmp_path / "labels").glob("*.npz"))
    assert _index(tmp_path, cache_dir=tmp_path / "cachedir").report.cache == "loaded"


def _table(images, sizes, hashes) -> ScanTable:
    n = len(images)
    return ScanTable(
        images=images,
        image_bytes=np.array(sizes),
        label_hashes=hashes,
        shapes=np.zeros((n, 2)),
        flags=np.zeros(n),
        reasons=[""] * n,
        counts=np.zeros(n),
        labels=np.zeros((0, 5)),
    )


def test_stale_reason_names_what_changed():
    cached = _table(["a.jpg", "b.jpg"], [10, 20], ["h1", "h2"])
    assert stale_reason(cached, ["a.jpg", "b.jpg"], np.array([10, 20]), ["h1", "h2"]) is None
    assert stale_reason(cached, ["a.jpg", "b.jpg", "c.jpg"], np.array([10, 20, 5]), ["h1", "h2", ""]) == (
        "1 (e.g. c.jpg) images added"
    )
    assert stale_reason(cached, ["a.jpg"], np.array([10]), ["h1"]) == "1 (e.g. b.jpg) images removed or moved"
    assert stale_reason(cached, ["a.jpg", "b.jpg"], np.array([10, 21]), ["h1", "h2"]) == (
        "1 (e.g. b.jpg) images changed size"
    )


class _CreatesFile:
    """Unpickling this calls pathlib.Path.touch — a stand-in for arbitrary code execution."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (Path.touch, (Path(self.target),))


def _release_cache(path: Path, payload: dict) -> None:
    """The release's format: np.save of a pickled dict (object array), renamed to .cache."""
    np.save(str(path) + ".npy", np.array(payload, dtype=object), allow_pickle=True)
    Path(str(path) + ".npy").rename(path)


def test_release_cache_is_inspected_not_loaded_and_names_its_origin(tmp_path, caplog):
    _dataset(tmp_path)
    payload = {
        "/home/me/data/images/train/0.jpg": [np.zeros((1, 5), np.float32), (20, 30), []],
        "/home/me/data/images/train/1.jpg": [np.zeros((1, 5), np.float32), (20, 30), []],
        "hash": "abc",
        "version": 0.6,
        "msgs": [],
        "results": (2, 0, 0, 0, 2),
    }
    _release_cache(tmp_path / "labels" / "train.cache", payload)
    with caplog.at_level(logging.WARNING, logger=LOG):
        index = _index(tmp_path)
    assert len(index.images) == 3
    [line] = [r.getMessage() for r in caplog.records if "release-format" in r.getMessage()]
    assert str(tmp_path / "labels" / "train.cache") in line
    assert "built for /home/me/data/images/train" in line
    assert "never loaded" in line


def test_crafted_release_cache_in_read_only_folder_does_not_execute(tmp_path, caplog, monkeypatch):
    _dataset(tmp_path)
    marker = tmp_path / "pwned"
    payload = {"/x/images/0.jpg": _CreatesFile(str(marker)), "hash": "h", "version": 0.6}
    cache = tmp_path / "labels" / "train.cache"
    _release_cache(cache, payload)
    _read_only(monkeypatch, tmp_path / "labels")
    with caplog.at_level(logging.WARNING, logger=LOG):
        index = _index(tmp_path, cache_dir=tmp_path / "cachedir")
    assert index.cache_path.parent == tmp_path / "cachedir"
    assert not marker.exists()
    assert len(index.images) == 3
    [line] = [r.getMessage() for r in caplog.records if "release-format" in r.getMessage()]
    assert str(cache) in line
    assert "could not be inspected safely" in line and "pathlib" in line and "touch" in line
    # the same file through numpy's normal (unsafe) path would create the marker
    np.load(cache, allow_pickle=True)
    assert marker.exists()


def test_strict_policy_makes_a_foreign_cache_fatal(tmp_path):
    _dataset(tmp_path)
    cache = tmp_path / "labels" / "train.cache"
    _release_cache(cache, {"hash": "h", "version": 0.6})
    with pytest.raises(DataError, match=f"strict cache policy: {cache}"):
        _index(tmp_path, cache_policy="strict")


def test_strict_policy_makes_a_stale_cache_fatal(tmp_path):
    _dataset(tmp_path)
    built = _index(tmp_path)
    (tmp_path / "labels" / "train" / "0.txt").write_text("1 0.5 0.5 0.25 0.25\n")
    with pytest.raises(DataError, match=f"strict cache policy: label cache {built.cache_path} is stale"):
        _index(tmp_path, cache_policy="strict")


def test_concurrent_writers_leave_one_complete_cache(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from yolov5_smddp.data.cache import load_cache, save_cache

    tables = [_table([f"{i}.jpg" for i in range(50)], list(range(50)), [str(k)] * 50) for k in range(8)]
    target = tmp_path / "x.labelcache.npz"
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda t: save_cache(target, t, root=tmp_path), tables))
    loaded = load_cache(target)
    assert loaded.images == tables[0].images and len(set(loaded.label_hashes)) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["x.labelcache.npz"]  # no temporary files left
