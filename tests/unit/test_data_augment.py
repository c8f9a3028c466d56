"""Geometry: after letterbox, perspective, mosaic and flips every kept box still encloses its object.

Each test image holds one solid rectangle whose colour is its class; after augmenting, every pixel of
that colour in the output must lie inside a box of that class, and every box must contain such pixels.
"""

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from datatree import watch

from yolov5_smddp.data.augment import (
    AugmentParams,
    _apply_box_transform,
    apply_color_hwc,
    box_candidates,
    draw_color_params,
    mosaic,
    random_affine_matrix,
    transform_boxes,
)
from yolov5_smddp.data.dataset import YoloDataset, rect_batch_shapes
from yolov5_smddp.data.labels import build_label_index
from yolov5_smddp.detection.boxes import scale_boxes

COLOURS = [(0, 0, 255), (0, 255, 0), (255, 0, 0), (0, 255, 255)]  # RGB, one per class
NO_COLOUR_JITTER = {"hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0}


def _dataset(root: Path, sizes=((60, 80), (80, 50), (64, 64), (45, 90))):
    rng = np.random.default_rng(1)
    for i, (h, w) in enumerate(sizes):
        img = np.zeros((h, w, 3), np.uint8)
        bw, bh = int(rng.integers(w // 4, w // 2)), int(rng.integers(h // 4, h // 2))
        x1, y1 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
        img[y1 : y1 + bh, x1 : x1 + bw] = COLOURS[i][::-1]  # written as BGR
        path = root / "images" / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(path), img)
        label = root / "labels" / f"{i}.txt"
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text(f"{i} {(x1 + bw / 2) / w} {(y1 + bh / 2) / h} {bw / w} {bh / h}\n")
    watch(root)
    return build_label_index(
        [root / "images"], nc=4, root=root, cache_dir=root.parent / f"{root.name}-cache", workers=1
    )


def _check_enclosed(img_chw: np.ndarray, targets: np.ndarray) -> int:
    """Asserts the enclosure property; returns the number of boxes checked."""
    img = img_chw.transpose(1, 2, 0).astype(int)
    h, w = img.shape[:2]
    boxes = targets[:, 2:].copy()
    xyxy = np.stack(
        [
            (boxes[:, 0] - boxes[:, 2] / 2) * w,
            (boxes[:, 1] - boxes[:, 3] / 2) * h,
            (boxes[:, 0] + boxes[:, 2] / 2) * w,
            (boxes[:, 1] + boxes[:, 3] / 2) * h,
        ],
        axis=1,
    )
    for cls, colour in enumerate(COLOURS):
        ys, xs = np.nonzero(np.abs(img - np.array(colour)).max(axis=2) < 30)
        mine = xyxy[targets[:, 1] == cls]
        inside = np.zeros(len(xs), bool)
        for x1, y1, x2, y2 in mine:
            in_box = (xs >= x1 - 1.5) & (xs + 1 <= x2 + 1.5) & (ys >= y1 - 1.5) & (ys + 1 <= y2 + 1.5)
            assert in_box.sum() > 0, f"class {cls} box {x1, y1, x2, y2} contains none of its pixels"
            inside |= in_box
        if len(mine):  # without a kept box the object was dropped by the filter: nothing to enclose
            assert (~inside).sum() <= 4, f"class {cls}: {(~inside).sum()} pixels outside its boxes"
    return len(xyxy)


@pytest.mark.parametrize(
    "hyp",
    [
        {"mosaic": 0.0, "degrees": 0.0, "translate": 0.1, "scale": 0.5, "fliplr": 0.5, "flipud": 0.5},
        {"mosaic": 0.0, "degrees": 20.0, "shear": 5.0, "translate": 0.2, "scale": 0.3, "fliplr": 0.5},
        {"mosaic": 1.0, "degrees": 0.0, "translate": 0.1, "scale": 0.5, "fliplr": 0.5, "flipud": 0.5},
        {"mosaic": 1.0, "degrees": 15.0, "shear": 3.0, "perspective": 0.0005, "translate": 0.1, "scale": 0.4},
    ],
    ids=["letterbox-affine-flips", "rotate-shear", "mosaic-flips", "mosaic-perspective"],
)
@pytest.mark.parametrize("partners", ["recent", "random"])
def test_kept_boxes_enclose_their_objects(tmp_path, hyp, partners):
    index = _dataset(tmp_path)
    ds = YoloDataset(
        index,
        96,
        augment=True,
        hyp=AugmentParams(**NO_COLOUR_JITTER, **hyp),
        mosaic_partners=partners,
        partner_pool=4,
    )
    checked = 0
    for k in range(12):
        img, targets, _path, _shapes, _color = ds[k % len(ds)]
        assert img.dtype == np.uint8 and img.shape == (3, 96, 96)
        assert targets.dtype == np.float32 and targets.shape[1] == 6
        assert (targets[:, 2:] >= 0).all() and (targets[:, 2:] <= 1).all()
        checked += _check_enclosed(img, targets)
    assert checked > 6


def test_val_letterbox_shapes_undo_to_original_pixels(tmp_path):
    index = _dataset(tmp_path)
    ds = YoloDataset(index, 64, augment=False, hyp=None, rect=True, batch_size=2)
    for i in range(len(ds)):
        img, targets, path, ((h0, w0), ratio_pad), _color = ds[i]
        _, h, w = img.shape
        assert h % 32 == 0 and w % 32 == 0 and max(h, w) == 64
        cls = int(targets[0, 1])
        original = cv2.imread(path)[..., ::-1]
        ys, xs = np.nonzero((original == COLOURS[cls]).all(axis=2))
        xc, yc, bw, bh = targets[0, 2:]
        box = torch.tensor([[(xc - bw / 2) * w, (yc - bh / 2) * h, (xc + bw / 2) * w, (yc + bh / 2) * h]])
        back = scale_boxes(box, (h, w), (h0, w0), ratio_pad=ratio_pad)[0].tolist()
        np.testing.assert_allclose(back, [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], atol=1.0)
        assert _check_enclosed(img, targets) == 1


def test_rect_batch_shapes_exact():
    shapes = np.array([[30, 60], [40, 60], [90, 60], [120, 60]])  # h, w sorted by h / w
    np.testing.assert_array_equal(rect_batch_shapes(shapes, 2, 640, 32, 0.0), [[448, 640], [640, 448]])
    np.testing.assert_array_equal(rect_batch_shapes(shapes, 4, 640, 32, 0.5), [[672, 672]])
    np.testing.assert_array_equal(rect_batch_shapes(shapes[:3], 2, 640, 32, 0.0), [[448, 640], [640, 448]])


def test_box_candidates_thresholds():
    before = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 300, 10]], float)
    after = np.array([[0, 0, 10, 10], [0, 0, 1.5, 10], [0, 0, 3, 3], [0, 0, 300, 2.5]], float)
    assert box_candidates(before, after).tolist() == [True, False, False, False]


def test_identity_affine_and_box_transform():
    p = AugmentParams(translate=0.0, scale=0.0)
    m, s = random_affine_matrix((100, 50), (100, 50), p, np.random.default_rng(0))
    np.testing.assert_allclose(m, np.eye(3), atol=1e-12)
    assert s == 1.0
    rot = np.array(
        [[0.0, -1.0, 50.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    )  # 90 degrees about (0, 0) then shift
    np.testing.assert_allclose(
        transform_boxes(np.array([[10.0, 20.0, 30.0, 25.0]]), rot, (100, 100)), [[25, 10, 30, 30]]
    )


def test_hsv_jitter_exact_values_and_rgb_order():
    bgr = np.zeros((4, 4, 3), np.uint8)
    bgr[..., 0], bgr[..., 2] = 200, 10  # blue-ish in BGR
    no_hsv = AugmentParams(hsv_h=0, hsv_s=0, hsv_v=0, fliplr=0)
    plain = apply_color_hwc(bgr, draw_color_params(no_hsv, np.random.default_rng(0)))
    assert plain[0, 0].tolist() == [10, 0, 200]  # channels are now RGB
    grey = np.full((4, 4, 3), 100, np.uint8)
    gain = np.random.default_rng(7).uniform(-1, 1, 3)[2] * 0.4 + 1
    value_only = AugmentParams(hsv_h=0, hsv_s=0, hsv_v=0.4)
    out = apply_color_hwc(grey, draw_color_params(value_only, np.random.default_rng(7)))
    assert (out == int(np.clip(np.float32(100) * np.float32(gain), 0, 255))).all()


def _release_canvas_mosaic(tiles, s, params, rng):
    """The release's mosaic written out independently: each whole tile pasted at its corner of the
    centre on a padded canvas of 114, the padding cut off (so the 2s x 2s canvas), one warp of the whole
    canvas by the same draws (centre, then the affine)."""
    xc, yc = (int(v) for v in rng.uniform(s / 2, 3 * s / 2, 2))
    m, scale = random_affine_matrix((2 * s, 2 * s), (s, s), params, rng)
    pad = max(max(t[0].shape[:2]) for t in tiles)
    big = np.full((2 * s + 2 * pad, 2 * s + 2 * pad, 3), 114, np.uint8)
    shifted = []
    for k, (img, labels) in enumerate(tiles):
        h, w = img.shape[:2]
        left = xc - w if k in (0, 2) else xc  # tiles 0, 2 end at the centre's column; 1, 3 start there
        top = yc - h if k in (0, 1) else yc
        big[pad + top : pad + top + h, pad + left : pad + left + w] = img
        moved = labels.copy()
        moved[:, [1, 3]] += left
        moved[:, [2, 4]] += top
        shifted.append(moved)
    canvas = big[pad : pad + 2 * s, pad : pad + 2 * s]
    warp = cv2.warpPerspective if (m[2, 0] or m[2, 1]) else cv2.warpAffine
    out = warp(canvas, m if warp is cv2.warpPerspective else m[:2], (s, s), borderValue=(114, 114, 114))
    labels = np.concatenate(shifted)
    labels[:, 1:] = labels[:, 1:].clip(0, 2 * s)
    return out, _apply_box_transform(labels, m, scale, (s, s))


@pytest.mark.parametrize(
    "hyp",
    [{}, {"degrees": 10.0, "shear": 3.0, "scale": 0.9}, {"perspective": 0.0008, "translate": 0.3}],
)
def test_mosaic_pixels_are_the_release_canvas_warp(hyp):
    """Every pixel of our mosaic equals the release's whole-canvas warp for the same draws, the seams
    where tiles meet and the tiles' outer edges included (tiles of odd sizes, partly outside the
    canvas), although only the window the warp reads is filled, in a reused canvas full of garbage."""
    params = AugmentParams(**hyp)
    garbage = np.random.default_rng(99).integers(0, 256, (128, 128, 3), dtype=np.uint8)
    for seed in range(16):
        rng = np.random.default_rng(seed)
        tiles = []
        for _ in range(4):
            h, w = (int(v) for v in rng.integers(20, 64, 2))
            img = cv2.resize(rng.integers(0, 256, (6, 7, 3), dtype=np.uint8), (w, h))
            tiles.append((img, np.array([[0, 2, 3, w - 2, h - 3]], np.float32)))
        originals = [t[0].copy() for t in tiles]
        canvas = garbage.copy()
        ours, our_labels = mosaic(tiles, 64, params, np.random.default_rng(seed), canvas=canvas)
        release, release_labels = _release_canvas_mosaic(tiles, 64, params, np.random.default_rng(seed))
        np.testing.assert_array_equal(ours, release)
        np.testing.assert_array_equal(our_labels, release_labels)
        assert all(np.array_equal(t[0], o) for t, o in zip(tiles, originals))  # tiles untouched


def _apply_color_by_copies(img, params):
    """The worker's colour step as it was before the in-place table: a new image per step."""
    x = np.arange(256, dtype=np.float32)
    lut = np.empty((256, 1, 3), np.uint8)
    lut[:, 0, 0] = (x * params[0]) % 180
    lut[:, 0, 1] = np.clip(x * params[1], 0, 255)
    lut[:, 0, 2] = np.clip(x * params[2], 0, 255)
    out = cv2.cvtColor(cv2.LUT(cv2.cvtColor(img, cv2.COLOR_BGR2HSV), lut), cv2.COLOR_HSV2RGB)
    if params[4] or params[5]:
        out = cv2.flip(out, -1 if params[4] and params[5] else (0 if params[4] else 1))
    return out


def test_in_place_colour_is_the_copying_pixels():
    """The HSV table applied in place gives exactly the pixels of the copying path it replaced, and
    leaves its input untouched."""
    for seed in range(12):
        rng = np.random.default_rng(seed)
        img = cv2.resize(rng.integers(0, 256, (6, 7, 3), dtype=np.uint8), (64, 48))
        color = draw_color_params(AugmentParams(flipud=0.5), rng)
        before = img.copy()
        np.testing.assert_array_equal(apply_color_hwc(img, color), _apply_color_by_copies(img, color))
        np.testing.assert_array_equal(img, before)


def test_large_jpeg_decoded_at_reduced_scale_keeps_geometry(tmp_path):
    img = np.zeros((300, 400, 3), np.uint8)
    img[60:200, 100:260] = COLOURS[1][::-1]
    (tmp_path / "images").mkdir()
    cv2.imwrite(str(tmp_path / "images" / "big.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 95])
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "big.txt").write_text(f"1 {180 / 400} {130 / 300} {160 / 400} {140 / 300}\n")
    watch(tmp_path)
    index = build_label_index(
        [tmp_path / "images"],
        nc=4,
        root=tmp_path,
        cache_dir=tmp_path.parent / f"{tmp_path.name}-cache",
        workers=1,
    )
    ds = YoloDataset(index, 96, augment=False, hyp=None)  # 400 px >= 4 x 96: a 1/4-scale JPEG decode
    out, targets, _path, ((h0, w0), ((gain_h, gain_w), pad)), _color = ds[0]
    assert out.shape == (3, 96, 96) and (h0, w0) == (300, 400)
    assert gain_w == pytest.approx(96 / 400) and gain_h == pytest.approx(72 / 300) and pad == (0.0, 12.0)
    assert _check_enclosed(out, targets) == 1


def test_letterbox_pads_with_the_releases_grey_114():
    from yolov5_smddp.data.letterbox import letterbox

    img = np.full((20, 40, 3), 7, np.uint8)  # 2:1 → 32 x 64 at 64, 16 px of padding above and below
    out, ratio, pad = letterbox(img, 64)
    assert out.shape == (64, 64, 3) and ratio == (1.6, 1.6) and pad == (0.0, 16.0)
    assert (out[:16] == 114).all() and (out[48:] == 114).all()
    assert (out[16:48] == 7).all()
