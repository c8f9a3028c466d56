"""The model sees the same data with region decoding: the mosaic reads a tile's image only inside
`tile_source_rect` (proved with noise everywhere else, and one pixel less on any side is seen), and the
dataset's samples with the region path are identical, pixel for pixel and label for label, to the
whole-image path for the same seed."""

from __future__ import annotations

import numpy as np
import pytest
from native_part import required

from yolov5_smddp.data import dataset as dataset_module
from yolov5_smddp.data.augment import (
    AugmentParams,
    compose_mosaic,
    draw_mosaic_geometry,
    mosaic,
    tile_source_rect,
)
from yolov5_smddp.data.dataset import YoloDataset
from yolov5_smddp.data.jpeg_roi import region_decoder
from yolov5_smddp.data.labels import build_label_index
from yolov5_smddp.data.pixelcache import DiskPixelCache
from yolov5_smddp.data.synthetic import make_default_dataset


def _tiles(rng: np.random.Generator, size: int):
    tiles = []
    for _ in range(4):
        h, w = int(rng.integers(size // 3, size + 1)), int(rng.integers(size // 3, size + 1))
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        labels = np.array([[0, w * 0.2, h * 0.3, w * 0.7, h * 0.9]], np.float32)
        tiles.append((img, labels))
    return tiles


HYPS = [
    {},
    {"degrees": 10.0, "shear": 5.0, "translate": 0.2, "scale": 0.9},
    {"scale": 0.0, "translate": 0.0},
    {"perspective": 0.0008, "degrees": 5.0},
]


def _with_noise_outside(tiles, g, rng, shrink=None):
    """The tiles with every pixel outside `tile_source_rect` replaced by noise (with `shrink` = side, the
    rectangle one pixel smaller on that side first)."""
    noisy, shown = [], 0
    for k, (img, labels) in enumerate(tiles):
        other = rng.integers(0, 256, img.shape, dtype=np.uint8)
        other ^= (other == img).astype(np.uint8)  # never the tile's own value
        rect = tile_source_rect(k, img.shape[:2], g)
        if rect is not None:
            x0, y0, x1, y1 = rect
            if shrink == "left":
                x0 += 1
            elif shrink == "top":
                y0 += 1
            elif shrink == "right":
                x1 -= 1
            elif shrink == "bottom":
                y1 -= 1
            other[y0:y1, x0:x1] = img[y0:y1, x0:x1]
            shown += 1
        noisy.append((other, labels))
    return noisy, shown


@pytest.mark.parametrize("hyp", HYPS)
def test_the_mosaic_reads_tiles_only_inside_their_source_rectangles(hyp):
    p = AugmentParams(**hyp)
    rng = np.random.default_rng(1)
    shown = 0
    for seed in range(60):
        size = int(rng.choice([64, 96, 160]))
        tiles = _tiles(rng, size)
        g = draw_mosaic_geometry(size, p, np.random.default_rng(seed))
        expected, expected_labels = compose_mosaic(iter(tiles), g)
        noisy, n = _with_noise_outside(tiles, g, rng)
        shown += n
        got, got_labels = compose_mosaic(
            iter(noisy), g, canvas=rng.integers(0, 256, (2 * size, 2 * size, 3), dtype=np.uint8)
        )
        assert np.array_equal(got, expected), (hyp, seed)
        assert np.array_equal(got_labels, expected_labels)
    assert shown > 150


@pytest.mark.parametrize("side", ["left", "top", "right", "bottom"])
def test_one_pixel_less_on_any_side_changes_the_mosaic(side):
    """The rectangle is no larger than the mosaic needs: one pixel less on any side shows."""
    rng = np.random.default_rng(4)
    changed = 0
    for seed in range(40):
        tiles = _tiles(rng, 96)
        g = draw_mosaic_geometry(96, AugmentParams(), np.random.default_rng(seed))
        expected, _ = compose_mosaic(iter(tiles), g)
        noisy, _ = _with_noise_outside(tiles, g, rng, shrink=side)
        changed += not np.array_equal(compose_mosaic(iter(noisy), g)[0], expected)
    assert changed > 20


def test_the_rectangle_is_a_fraction_of_the_image_on_the_default_hyp():
    """The saving: at 640 with 640x480 tiles a tile needs about a third of its image on average."""
    p = AugmentParams()
    rng = np.random.default_rng(0)
    areas = []
    for _ in range(400):
        g = draw_mosaic_geometry(640, p, rng)
        for k in range(4):
            rect = tile_source_rect(k, (480, 640), g)
            areas.append(0 if rect is None else (rect[2] - rect[0]) * (rect[3] - rect[1]) / (640 * 480))
    assert 0.25 < np.mean(areas) < 0.5, np.mean(areas)


def test_geometry_first_keeps_the_random_stream():
    """`mosaic` draws the centre and the affine from the same stream positions as before the split:
    composing with geometry drawn first equals the one-call mosaic for the same seed."""
    p = AugmentParams(degrees=5.0)
    tiles = _tiles(np.random.default_rng(2), 96)
    a = mosaic(tiles, 96, p, np.random.default_rng(5))
    b = compose_mosaic(iter(tiles), draw_mosaic_geometry(96, p, np.random.default_rng(5)))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("roi")
    yaml_path = make_default_dataset(tmp / "d", n_train=24, n_val=0, imgsz=160, seed=3)
    return build_label_index(
        [yaml_path.parent / "images" / "train"], nc=3, root=yaml_path.parent, cache_dir=tmp / "c"
    )


def test_samples_with_region_decoding_equal_the_whole_image_samples(index, monkeypatch):
    required(region_decoder())
    real = dataset_module.decode_region
    calls = {"region": 0, "ok": 0}
    noise = np.random.default_rng(9)

    def noisy_region(data, out, rect):  # stale pixels everywhere: only the decoded rectangle is trusted
        out[...] = noise.integers(0, 256, out.shape, dtype=np.uint8)
        calls["region"] += 1
        ok = real(data, out, rect)
        calls["ok"] += ok
        return ok

    monkeypatch.setattr(dataset_module, "decode_region", noisy_region)
    for hyp in ({}, {"degrees": 8.0, "shear": 3.0, "mixup": 0.5}, {"perspective": 0.0005}):
        fast = YoloDataset(index, 160, augment=True, hyp=AugmentParams(**hyp), seed=11)
        whole = YoloDataset(index, 160, augment=True, hyp=AugmentParams(**hyp), seed=11, region_decode=False)
        assert fast.region_decode and not whole.region_decode
        for i in list(range(len(index.images))) * 2:
            a, b = fast[i], whole[i]
            assert np.array_equal(a[0], b[0]), (hyp, i)
            assert np.array_equal(a[1], b[1]), (hyp, i)
    assert calls["ok"] == calls["region"] > 50  # the region path did the work


def test_region_decoding_is_used_only_where_it_can_be_exact(index, tmp_path):
    on = YoloDataset(index, 160, augment=True, hyp=None)
    assert on.region_decode
    assert not YoloDataset(index, 160, augment=False, hyp=None).region_decode
    assert not YoloDataset(index, 160, augment=True, hyp=None, cache_images="ram").region_decode
    assert not YoloDataset(index, 160, augment=True, hyp=None, mosaic_partners="recent").region_decode
    cache = DiskPixelCache(tmp_path / "px", 160, augment=True)
    assert not YoloDataset(index, 160, augment=True, hyp=None, disk_cache=cache).region_decode
    resized = YoloDataset(index, 128, augment=True, hyp=None)  # 160 px files resized to 128: decoded whole
    assert resized.region_decode and not resized.region_eligible(0)
    if region_decoder() is not None:
        assert on.region_eligible(0)


def test_the_per_image_table_is_the_per_image_rule(index):
    """`region_files` (computed once per dataset) says what the per-tile rule said: a JPEG kept at its
    stored size by `resized_hw`, decoded with IMREAD_COLOR (no DCT scaling)."""
    import cv2

    from yolov5_smddp.data.dataset import region_files, resized_hw

    rng = np.random.default_rng(0)
    shapes = np.concatenate(
        [rng.integers(1, 1400, (400, 2)), [[160, 160], [160, 90], [90, 160], [159, 160], [161, 10], [320, 5]]]
    ).astype(np.int32)
    names = [f"{k}.{['jpg', 'JPEG', 'png', 'jpeg'][k % 4]}" for k in range(len(shapes))]
    images = [index.images[0].parent / n for n in names]
    ds = YoloDataset(index, 160, augment=True, hyp=None)
    expected = []
    for p, shape in zip(images, shapes):
        ds.images[0], ds.shapes[0] = p, shape
        kept = resized_hw(shape, 160) == (int(shape[0]), int(shape[1]))
        jpeg = p.suffix.lower() in (".jpg", ".jpeg")
        expected.append(jpeg and kept and ds.decode_flag(0) == cv2.IMREAD_COLOR)
    got = region_files(images, shapes, 160)
    bad = [(n, s) for n, s, a, b in zip(names, shapes.tolist(), got.tolist(), expected) if a != b]
    assert not bad and 2 < sum(expected) < len(expected), bad
