"""Restart-marker copies (data/native.c yv5_rst_*, data/jpeg_roi.py, data/restart_cache.py): the copy
decodes to exactly OpenCV's decode of the ORIGINAL; a region decoded from the copy's restart segments
equals that decode inside the rectangle, at every edge and corner; other layouts are declined; and the
dataset's items with the copies are the items without them, with nothing written under the dataset,
stale copies never read, and a cache folder that cannot be written costing nothing but one log line."""

from __future__ import annotations

import hashlib
import io
import logging
import os

import cv2
import numpy as np
import pytest
from jpegs import jpeg_variants, photo, pil_jpeg
from native_part import required
from PIL import Image

from yolov5_smddp.data import dataset as dataset_module
from yolov5_smddp.data import jpeg_roi, restart_cache
from yolov5_smddp.data.augment import AugmentParams
from yolov5_smddp.data.dataset import YoloDataset
from yolov5_smddp.data.labels import build_label_index
from yolov5_smddp.data.restart_cache import RestartCache, enough_space, restart_cache_for
from yolov5_smddp.data.synthetic import make_default_dataset


@pytest.fixture(scope="module")
def lib():
    """The library itself (not through the restart path's self-check: these tests must see a broken
    restart path fail on their own, not only at the fixture)."""
    return required(jpeg_roi.region_decoder())


def test_the_restart_path_passes_its_self_check(lib):
    assert jpeg_roi.restart_decoder() is lib


def _decode(data: bytes) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)


def _copy(lib, data: bytes) -> bytes:
    full = _decode(data)
    copy = jpeg_roi._transcode(lib, data, full.shape[1], full.shape[0])
    assert copy is not None
    return copy


def _rects(w: int, h: int, rng: np.random.Generator, n_random: int) -> list[tuple[int, int, int, int]]:
    rects = [
        (0, 0, w, h),
        (0, 0, 1, 1),
        (w - 1, h - 1, w, h),
        (0, h - 1, w, h),
        (w - 1, 0, w, h),
        (0, 0, w, 1),
        (0, 0, 1, h),
        (w - 1, 0, w, 1),
        (0, h - 1, 1, h),
        (w // 2, 0, w, h // 2),
        (0, h // 2, w // 2, h),
        (w // 3, h // 3, w // 3 + 1, h // 3 + 1),
        (0, h // 2, w, h // 2 + 1),  # a single row
    ]
    for b in (8, 16, 32):  # edges at, one before and one after MCU boundaries (8 and 16 px MCUs)
        for d in (-2, -1, 0, 1, 2):
            x0, y0 = min(max(b + d, 0), w - 1), min(max(b + d, 0), h - 1)
            rects.append((x0, y0, min(x0 + b, w), min(y0 + b, h)))
            rects.append((0, 0, min(max(b + d, 1), w), min(max(b + d, 1), h)))
    n_fixed = len(rects)
    while len(rects) < n_fixed + n_random:
        x0, x1 = sorted(int(v) for v in rng.integers(0, w + 1, 2))
        y0, y1 = sorted(int(v) for v in rng.integers(0, h + 1, 2))
        if x1 > x0 and y1 > y0:
            rects.append((x0, y0, x1, y1))
    return rects


def test_the_copy_decodes_to_the_original_pixels(lib):
    for name, data in jpeg_variants().items():
        copy = _copy(lib, data)
        assert copy.count(b"\xff\xdd") >= 1, name  # a DRI segment: restart markers
        assert np.array_equal(_decode(copy), _decode(data)), name


def test_regions_of_the_copy_equal_the_full_decode(lib):
    rng = np.random.default_rng(1)
    checked = 0
    for name, data in jpeg_variants().items():
        full = _decode(data)
        h, w = full.shape[:2]
        copy = _copy(lib, data)
        for rect in _rects(w, h, rng, 6 if w * h < 2000 else 14):
            out = rng.integers(0, 256, full.shape, dtype=np.uint8)  # stale pixels
            wide = jpeg_roi.widen(rect, w, h, jpeg_roi.RESTART_CONTEXT_MARGIN)
            assert jpeg_roi._call_restarts(lib, copy, out, wide) == 0, (name, rect)
            x0, y0, x1, y1 = rect
            assert np.array_equal(out[y0:y1, x0:x1], full[y0:y1, x0:x1]), (name, rect)
            checked += 1
    assert checked > 300


def test_the_public_functions(lib):
    data = pil_jpeg(photo(203, 151, seed=2), quality=90)
    full = _decode(data)
    copy = jpeg_roi.transcode_with_restarts(data, 203, 151)
    assert copy is not None and copy.count(b"\xff\xd0") > 1
    out = np.zeros_like(full)
    assert jpeg_roi.decode_region_restarts(copy, out, (50, 60, 120, 100))
    assert np.array_equal(out[60:100, 50:120], full[60:100, 50:120])


def test_into_a_strided_view_and_only_the_kept_mcus_are_written(lib):
    img = photo(640, 480, seed=4)
    data = pil_jpeg(img, quality=90)  # 4:2:0: 16 x 16 MCUs
    full = _decode(data)
    copy = _copy(lib, data)
    big = np.zeros((640, 704, 3), np.uint8)
    view = big[:480, :640]
    rect = (300, 200, 360, 260)
    assert jpeg_roi.decode_region_restarts(copy, view, rect)
    assert np.array_equal(view[200:260, 300:360], full[200:260, 300:360])
    m = jpeg_roi.RESTART_CONTEXT_MARGIN
    top, bottom = (200 - m) // 16 * 16, -(-(260 + m) // 16) * 16  # MCU rows holding the widened rows
    assert not big[:top].any() and not big[bottom:].any()
    assert not big[:, 640:].any()  # nothing beyond the image's width
    left, right = (300 - m) // 16 * 16, -(-(360 + m) // 16) * 16
    assert not big[:, :left].any() and not big[:, right:640].any()


def test_other_layouts_are_declined(lib):
    """An original without restart markers, one with another interval, a progressive file, a damaged
    copy: False (the caller decodes otherwise), never pixels."""
    img = photo(203, 151, seed=5)
    plain = pil_jpeg(img, quality=90)
    copy = _copy(lib, plain)
    cases = {
        "no restarts": plain,
        "interval 3": cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_RST_INTERVAL, 3])[1].tobytes(),
        "progressive": pil_jpeg(img, quality=90, progressive=True),
        "truncated copy": copy[: len(copy) // 2],
        "a marker dropped": copy.replace(b"\xff\xd3", b"", 1),
        "not a JPEG": b"\x89PNG" + copy[4:],
    }
    for name, data in cases.items():
        out = np.zeros((151, 203, 3), np.uint8)
        assert not jpeg_roi.decode_region_restarts(data, out, (10, 100, 60, 140)), name
    assert not jpeg_roi.decode_region_restarts(copy, np.zeros((151, 204, 3), np.uint8), (0, 0, 9, 9))


def test_damaged_copies_never_crash_or_write_outside(lib):
    """Random byte changes and truncations of a copy (a damaged cache file): a status, never a crash,
    and never a pixel outside the image's rows in the caller's buffer."""
    img = photo(203, 151, seed=11)
    copy = _copy(lib, pil_jpeg(img, quality=90))
    rng = np.random.default_rng(3)
    outcomes = set()
    for trial in range(400):
        data = bytearray(copy)
        if trial % 4 == 0:
            data = data[: int(rng.integers(2, len(data)))]
        for _ in range(int(rng.integers(1, 6))):
            if len(data) > 2:
                data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
        big = np.zeros((160, 210, 3), np.uint8)
        x0, y0 = (int(v) for v in rng.integers(0, 150, 2))
        rect = jpeg_roi.widen((x0, y0, x0 + 40, y0 + 1), 203, 151, jpeg_roi.RESTART_CONTEXT_MARGIN)
        outcomes.add(jpeg_roi._call_restarts(lib, bytes(data), big[:151, :203], rect))
        assert not big[151:].any() and not big[:, 203:].any()
    assert outcomes <= {0, 1, 2} and {1, 2} & outcomes


@pytest.mark.parametrize("case", ["grey", "exif6", "other_size", "truncated", "cmyk"])
def test_files_the_region_path_declines_are_not_copied(lib, case):
    img = photo(120, 90, seed=6)
    if case == "grey":
        buf = io.BytesIO()
        Image.fromarray(img[:, :, 0]).save(buf, format="JPEG")
        data = buf.getvalue()
    elif case == "exif6":
        exif = Image.Exif()
        exif[0x0112] = 6
        data = pil_jpeg(img, exif=exif)
    elif case == "other_size":
        data = pil_jpeg(photo(121, 90, seed=6))
    elif case == "truncated":
        data = pil_jpeg(img)[:-600]
    else:
        buf = io.BytesIO()
        Image.fromarray(img).convert("CMYK").save(buf, format="JPEG")
        data = buf.getvalue()
    assert jpeg_roi.transcode_with_restarts(data, 120, 90) is None


def test_a_progressive_file_with_coefficient_bits_never_sent_is_not_copied(lib):
    """libjpeg decodes such a file with block smoothing (its estimate of the missing bits), which a
    sequential copy of the same coefficients would not get: declined."""
    data = pil_jpeg(photo(203, 151, seed=8), quality=90, progressive=True)
    scans = [i for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] == 0xDA]
    assert len(scans) > 3
    partial = data[: scans[2]] + b"\xff\xd9"  # the first two scans (DC, then the first AC band) only
    full = _decode(partial)
    assert full is not None and full.shape == (151, 203, 3)
    assert jpeg_roi.transcode_with_restarts(partial, 203, 151) is None
    assert jpeg_roi.transcode_with_restarts(data, 203, 151) is not None


def test_a_broken_restart_path_fails_its_self_check(lib, monkeypatch, caplog):
    class Shifted:  # pixels one bit off here and there: a libjpeg other than OpenCV's
        def __init__(self, real):
            self.real = real

        def __getattr__(self, name):
            return getattr(self.real, name)

        def yv5_rst_decode(self, data, size, w, h, box, ptr, stride, scratch, cap):
            code = self.real.yv5_rst_decode(data, size, w, h, box, ptr, stride, scratch, cap)
            arr = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * (stride * h)).from_address(ptr))
            arr[: stride * h : 7] ^= 1
            return code

    assert jpeg_roi._self_check_restarts(lib) is None
    monkeypatch.setattr(jpeg_roi, "_state", {"lib": Shifted(lib)})
    with caplog.at_level("INFO", logger="yolov5_smddp.data.jpeg_roi"):
        assert jpeg_roi.restart_decoder() is None
    assert "restart-marker copies off" in caplog.text and "differs" in caplog.text
    assert jpeg_roi.transcode_with_restarts(b"\xff\xd8", 4, 4) is None


# ------------------------------------------------------------------------------------------ the cache


def test_copy_names():
    base = restart_cache.copy_name("/d/a.jpg", 100, 5)
    assert base == restart_cache.copy_name("/d/a.jpg", 100, 5) and base.endswith(".jpg")
    others = {
        restart_cache.copy_name(*a)
        for a in (("/d/b.jpg", 100, 5), ("/d/a.jpg", 101, 5), ("/d/a.jpg", 100, 6))
    }
    assert len(others) == 3 and base not in others


def test_space_rule():
    gib = 1 << 30
    assert enough_space(12 * gib + gib, 10 * gib)
    assert not enough_space(12 * gib + gib - 1, 10 * gib)
    assert not enough_space(gib - 1, 0)


def test_total_bytes_exact_and_estimated(tmp_path):
    paths = []
    for k in range(10):
        p = tmp_path / f"{k}.jpg"
        p.write_bytes(b"x" * (100 + k))
        paths.append(p)
    exact = sum(100 + k for k in range(10))
    assert restart_cache.total_bytes(paths) == exact
    assert restart_cache.total_bytes(paths + [tmp_path / "absent.jpg"]) == exact
    assert restart_cache.total_bytes(paths, sample=5) == round((100 + 102 + 104 + 106 + 108) * 10 / 5)
    assert restart_cache.total_bytes([]) == 0


def test_restart_cache_for_checks_the_free_space(tmp_path, monkeypatch):
    img = tmp_path / "a.jpg"
    img.write_bytes(b"x" * 1000)
    cache, line = restart_cache_for(tmp_path / "c", [img])
    assert cache is not None and cache.folder.parent == tmp_path / "c" and str(cache.folder) in line
    monkeypatch.setattr(restart_cache, "enough_space", lambda free, need: need != 1000)
    cache, line = restart_cache_for(tmp_path / "c", [img])
    assert cache is None and "off" in line and "GB free" in line
    (tmp_path / "file").write_bytes(b"")
    cache, line = restart_cache_for(tmp_path / "file", [img])  # not a folder
    assert cache is None and "cannot use" in line


@pytest.fixture()
def data_root(tmp_path):
    yaml_path = make_default_dataset(tmp_path / "d", n_train=16, n_val=0, imgsz=160, seed=3)
    return yaml_path.parent


def _index(root, tmp_path):
    return build_label_index([root / "images" / "train"], nc=3, root=root, cache_dir=tmp_path / "labels")


def _tree(root) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _counting(monkeypatch):
    """Count the restart-path region decodes that succeed (and fill the buffer with noise before each
    region decode, so only decoded pixels can reach the sample)."""
    calls = {"copy": 0, "original": 0}
    noise = np.random.default_rng(9)
    real_copy, real_original = dataset_module.decode_region_restarts, dataset_module.decode_region

    def from_copy(data, out, rect):
        out[...] = noise.integers(0, 256, out.shape, dtype=np.uint8)
        ok = real_copy(data, out, rect)
        calls["copy"] += ok
        return ok

    def from_original(data, out, rect):
        out[...] = noise.integers(0, 256, out.shape, dtype=np.uint8)
        ok = real_original(data, out, rect)
        calls["original"] += ok
        return ok

    monkeypatch.setattr(dataset_module, "decode_region_restarts", from_copy)
    monkeypatch.setattr(dataset_module, "decode_region", from_original)
    return calls


def test_items_with_the_copies_equal_the_items_without(lib, data_root, tmp_path, monkeypatch):
    index = _index(data_root, tmp_path)
    before = _tree(data_root)
    calls = _counting(monkeypatch)
    cache = RestartCache(tmp_path / "cache")
    for hyp in ({}, {"degrees": 8.0, "shear": 3.0, "mixup": 0.5}):
        fast = YoloDataset(index, 160, augment=True, hyp=AugmentParams(**hyp), seed=11, restart_cache=cache)
        plain = YoloDataset(index, 160, augment=True, hyp=AugmentParams(**hyp), seed=11)
        assert fast.restart_cache is cache and plain.restart_cache is None
        for i in list(range(len(index.images))) * 3:
            a, b = fast[i], plain[i]
            assert np.array_equal(a[0], b[0]), (hyp, i)
            assert np.array_equal(a[1], b[1]), (hyp, i)
    assert calls["copy"] > 50  # most tiles came from the copies
    copies = sorted(cache.folder.iterdir())
    assert 0 < len(copies) <= len(index.images) and all(p.suffix == ".jpg" for p in copies)
    assert _tree(data_root) == before  # nothing written, changed or added under the dataset


def test_the_copies_are_only_used_where_regions_are_decoded(data_root, tmp_path):
    index = _index(data_root, tmp_path)
    cache = RestartCache(tmp_path / "cache")
    assert YoloDataset(index, 160, augment=False, hyp=None, restart_cache=cache).restart_cache is None
    assert (
        YoloDataset(
            index, 160, augment=True, hyp=None, restart_cache=cache, region_decode=False
        ).restart_cache
        is None
    )
    recent = YoloDataset(index, 160, augment=True, hyp=None, restart_cache=cache, mosaic_partners="recent")
    assert recent.restart_cache is None


def test_a_changed_image_gets_a_new_copy(lib, data_root, tmp_path, monkeypatch):
    index = _index(data_root, tmp_path)
    cache = RestartCache(tmp_path / "cache")
    image = index.images[0]
    old = cache.copy_path(image)
    ds = YoloDataset(index, 160, augment=True, hyp=AugmentParams(mosaic=1.0), seed=1, restart_cache=cache)
    for _ in range(40):  # until image 0 was a shown tile twice: copied, then read
        ds[0]
        if old.exists():
            break
    assert old.exists()
    st = os.stat(image)
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert cache.copy_path(image) != old  # the same bytes with a new mtime: another copy
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.copy_path(image) == old
    # the image is replaced by another picture of the same size; its mtime moves on
    h, w = (int(v) for v in ds.shapes[0])
    other = cv2.imencode(".jpg", photo(w, h, seed=7))[1].tobytes()
    st = os.stat(image)
    image.write_bytes(other)
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    new = cache.copy_path(image)
    assert new != old and not new.exists()
    calls = _counting(monkeypatch)
    fresh = YoloDataset(index, 160, augment=True, hyp=AugmentParams(mosaic=1.0), seed=5, restart_cache=cache)
    plain = YoloDataset(index, 160, augment=True, hyp=AugmentParams(mosaic=1.0), seed=5)
    for _ in range(30):
        a, b = fresh[0], plain[0]
        assert np.array_equal(a[0], b[0])
    assert new.exists() and calls["copy"] > 0
    assert np.array_equal(_decode(new.read_bytes()), _decode(other))  # the new picture's copy


def test_a_cache_that_cannot_be_written_costs_one_log_line(lib, data_root, tmp_path, monkeypatch, caplog):
    index = _index(data_root, tmp_path)
    blocker = tmp_path / "not-a-folder"
    blocker.write_bytes(b"")  # the cache root is a file: every write fails (also as root)
    cache = RestartCache(blocker)
    calls = _counting(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="yolov5_smddp.data.restart_cache"):
        fast = YoloDataset(index, 160, augment=True, hyp=None, seed=2, restart_cache=cache)
        plain = YoloDataset(index, 160, augment=True, hyp=None, seed=2)
        for i in list(range(len(index.images))) * 2:
            a, b = fast[i], plain[i]
            assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    said = [r for r in caplog.records if "--jpeg-restart-cache" in r.getMessage()]
    assert len(said) == 1 and "cannot write" in said[0].getMessage()
    assert not cache.enabled and calls["copy"] == 0 and calls["original"] > 20


def test_the_option_and_where_the_trainer_uses_the_copies(tmp_path, caplog):
    from types import SimpleNamespace

    from yolov5_smddp.config.train_config import parse_train_args
    from yolov5_smddp.errors import ConfigError
    from yolov5_smddp.train import data_wiring

    assert parse_train_args([]).jpeg_restart_cache == "on"
    assert parse_train_args(["--jpeg-restart-cache", "off"]).jpeg_restart_cache == "off"
    assert parse_train_args(["--jpeg_restart_cache", "OFF"]).jpeg_restart_cache == "off"
    with pytest.raises(ConfigError):
        parse_train_args(["--jpeg-restart-cache", "maybe"])
    image = tmp_path / "a.jpg"
    image.write_bytes(b"x")
    bundle = SimpleNamespace(train_index=SimpleNamespace(images=[image]))

    def config(**kw):
        return SimpleNamespace(
            **{"jpeg_restart_cache": "on", "cache": None, "mosaic_partners": "random", **kw}
        )

    with caplog.at_level(logging.INFO, logger="yolov5_smddp"):
        cache = data_wiring.restart_cache(config(), bundle, tmp_path / "c", main=True)
    assert isinstance(cache, RestartCache) and cache.folder == tmp_path / "c" / restart_cache.FOLDER
    assert str(cache.folder) in caplog.text
    for off in (
        {"jpeg_restart_cache": "off"},
        {"cache": "ram"},
        {"cache": "disk"},
        {"mosaic_partners": "recent"},
    ):
        assert data_wiring.restart_cache(config(**off), bundle, tmp_path / "c", main=True) is None


def test_read_copies_of_any_size(tmp_path):
    """A copy that fits the reused buffer comes back as a view of it; a larger one whole, on its own."""
    path = tmp_path / "c.jpg"
    data = np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    big, small = np.zeros(8000, np.uint8), np.zeros(1000, np.uint8)
    got = RestartCache.read(path, big)
    assert got.tobytes() == data and np.shares_memory(got, big)
    got = RestartCache.read(path, small)
    assert got.tobytes() == data and not np.shares_memory(got, small)
    exact = np.zeros(5000, np.uint8)  # exactly the file's size: read on to the end
    assert RestartCache.read(path, exact).tobytes() == data
    assert RestartCache.read(tmp_path / "absent.jpg", big) is None
