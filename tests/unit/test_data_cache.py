"""Our label cache (in the cache folder only, relocatable, keyed by content, atomic) and the release's
foreign pickle cache. Every scan here asserts that the dataset tree is byte-identical afterwards."""

import logging
import re
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from datatree import make_read_only, tree_state

from yolov5_smddp.data.cache import ScanTable, default_cache_dir, stale_reason
from yolov5_smddp.data.labels import build_label_index
from yolov5_smddp.errors import DataError

LOG = "yolov5_smddp.data.labels"
CACHE_NAME = re.compile(r"yolov5-smddp-[0-9a-f]{12}-[0-9a-f]{16}\.labelcache\.npz")


def _dataset(root: Path, n: int = 3, shade: int = 50) -> Path:
    for i in range(n):
        img = root / "images" / "train" / f"{i}.jpg"
        img.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(img), np.full((20, 30, 3), shade + i, np.uint8))
        lbl = root / "labels" / "train" / f"{i}.txt"
        lbl.parent.mkdir(parents=True, exist_ok=True)
        lbl.write_text(f"{i % 2} 0.5 0.5 0.25 0.25\n")
    return root / "images" / "train"


def _index(root: Path, cache_dir: Path, **kwargs):
    before = tree_state(root)
    index = build_label_index(
        [root / "images" / "train"],
        nc=kwargs.pop("nc", 2),
        root=root,
        workers=2,
        cache_dir=cache_dir,
        **kwargs,
    )
    assert tree_state(root) == before  # nothing written, renamed or removed under the dataset
    return index


def test_cache_goes_to_the_cache_folder_only_and_is_reused(tmp_path):
    data, cache = tmp_path / "data", tmp_path / "cache"
    _dataset(data)
    first = _index(data, cache)
    assert first.report.cache == "built"
    assert first.cache_path.parent == cache and CACHE_NAME.fullmatch(first.cache_path.name)
    with np.load(first.cache_path, allow_pickle=False) as npz:  # plain arrays only
        assert not any(npz[k].dtype == object for k in npz.files)
        assert npz["images"].tolist() == ["images/train/0.jpg", "images/train/1.jpg", "images/train/2.jpg"]
    second = _index(data, cache)
    assert second.report.cache == "loaded" and second.cache_path == first.cache_path
    assert [lb.tolist() for lb in second.labels] == [lb.tolist() for lb in first.labels]
    assert [p.name for p in cache.iterdir()] == [first.cache_path.name]


def test_relocated_dataset_keeps_its_cache(tmp_path):
    original, cache = tmp_path / "laptop" / "data", tmp_path / "cache"
    _dataset(original)
    built = _index(original, cache)
    moved = tmp_path / "opt" / "ml" / "input" / "data" / "training"
    shutil.copytree(original, moved)
    shutil.rmtree(original)
    index = _index(moved, cache)
    assert index.report.cache == "loaded" and index.cache_path == built.cache_path
    assert index.images[0] == moved / "images" / "train" / "0.jpg"
    assert [lb.tolist() for lb in index.labels] == [lb.tolist() for lb in built.labels]


def test_read_only_dataset_is_scanned_and_left_untouched(tmp_path):
    data, cache = tmp_path / "data", tmp_path / "cache"
    _dataset(data)
    make_read_only(data)
    index = _index(data, cache)
    assert index.report.cache == "built" and len(index.images) == 3
    assert _index(data, cache).report.cache == "loaded"


def test_same_size_label_edit_replaces_its_cache_with_one_line(tmp_path, caplog):
    data, cache = tmp_path / "data", tmp_path / "cache"
    _dataset(data)
    old = _index(data, cache).cache_path
    label = data / "labels" / "train" / "1.txt"
    before = label.read_text()
    label.write_text(before.replace("0.25 0.25", "0.20 0.25"))
    assert len(label.read_text()) == len(before)
    with caplog.at_level(logging.INFO, logger=LOG):
        index = _index(data, cache)
    assert index.report.cache == "built" and index.cache_path != old
    stale = [r.getMessage() for r in caplog.records if "stale" in r.getMessage()]
    assert stale == [
        f"label cache {old} is stale (labels of 1 (e.g. images/train/1.jpg) images edited, added or removed); rebuilding"
    ]
    np.testing.assert_allclose(index.labels[1][0, 3], 0.20)
    assert [p.name for p in cache.iterdir()] == [index.cache_path.name]  # the stale one is gone


def test_datasets_with_the_same_layout_keep_their_own_caches(tmp_path):
    a, b, cache = tmp_path / "a", tmp_path / "b", tmp_path / "cache"
    _dataset(a, shade=10)
    _dataset(b, shade=90)
    (b / "labels" / "train" / "0.txt").write_text("1 0.5 0.5 0.1 0.1\n")
    first_a, first_b = _index(a, cache), _index(b, cache)
    assert first_a.cache_path != first_b.cache_path
    assert _index(a, cache).report.cache == "loaded" and _index(b, cache).report.cache == "loaded"
    assert len(list(cache.iterdir())) == 2


def test_class_count_and_pixel_limit_are_part_of_the_key(tmp_path):
    data, cache = tmp_path / "data", tmp_path / "cache"
    _dataset(data)
    base = _index(data, cache)
    assert _index(data, cache, nc=3).cache_path != base.cache_path
    with pytest.raises(DataError, match="3 unusable .*over the limit of 599"):  # 30x20 = 600 pixels
        _index(data, cache, max_pixels=599)
    assert _index(data, cache).report.cache == "loaded"  # caches of the same files, other settings, stay
    assert len(list(cache.iterdir())) == 3


def test_unwritable_cache_folder_still_scans(tmp_path, caplog):
    data, blocker = tmp_path / "data", tmp_path / "not-a-folder"
    _dataset(data)
    blocker.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING, logger=LOG):
        index = _index(data, blocker / "cache")
    assert len(index.images) == 3 and index.cache_path is None
    assert index.report.cache.startswith("built (not written: ")
    assert any("label cache not written" in r.getMessage() for r in caplog.records)


def test_default_cache_folder_follows_xdg(tmp_path, monkeypatch):
    home = Path("/home/me")
    assert default_cache_dir({}, home) == home / ".cache" / "yolov5-smddp"
    assert default_cache_dir({"XDG_CACHE_HOME": "/var/cache/me"}, home) == Path("/var/cache/me/yolov5-smddp")
    assert default_cache_dir({"XDG_CACHE_HOME": "rel/cache"}, home) == home / ".cache" / "yolov5-smddp"
    data = tmp_path / "data"
    _dataset(data)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    index = _index(data, None)
    assert index.cache_path.parent == tmp_path / "xdg" / "yolov5-smddp"


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
    data = tmp_path / "data"
    _dataset(data)
    payload = {
        "/home/me/data/images/train/0.jpg": [np.zeros((1, 5), np.float32), (20, 30), []],
        "/home/me/data/images/train/1.jpg": [np.zeros((1, 5), np.float32), (20, 30), []],
        "hash": "abc",
        "version": 0.6,
        "msgs": [],
        "results": (2, 0, 0, 0, 2),
    }
    _release_cache(data / "labels" / "train.cache", payload)
    with caplog.at_level(logging.WARNING, logger=LOG):
        index = _index(data, tmp_path / "cache")
    assert len(index.images) == 3
    [line] = [r.getMessage() for r in caplog.records if "release-format" in r.getMessage()]
    assert str(data / "labels" / "train.cache") in line
    assert "built for /home/me/data/images/train" in line
    assert "never loaded" in line


def test_crafted_release_cache_in_read_only_folder_does_not_execute(tmp_path, caplog):
    data = tmp_path / "data"
    _dataset(data)
    marker = tmp_path / "pwned"
    payload = {"/x/images/0.jpg": _CreatesFile(str(marker)), "hash": "h", "version": 0.6}
    cache = data / "labels" / "train.cache"
    _release_cache(cache, payload)
    make_read_only(data)
    with caplog.at_level(logging.WARNING, logger=LOG):
        index = _index(data, tmp_path / "cachedir")
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
    data = tmp_path / "data"
    _dataset(data)
    cache = data / "labels" / "train.cache"
    _release_cache(cache, {"hash": "h", "version": 0.6})
    with pytest.raises(DataError, match=f"strict cache policy: {cache}"):
        _index(data, tmp_path / "cache", cache_policy="strict")


def test_strict_policy_makes_a_stale_cache_fatal(tmp_path):
    data = tmp_path / "data"
    _dataset(data)
    built = _index(data, tmp_path / "cache")
    (data / "labels" / "train" / "0.txt").write_text("1 0.5 0.5 0.25 0.25\n")
    with pytest.raises(DataError, match=f"strict cache policy: label cache {built.cache_path} is stale"):
        _index(data, tmp_path / "cache", cache_policy="strict")


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
