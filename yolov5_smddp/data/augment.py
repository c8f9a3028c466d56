"""Training augmentations with the release's semantics and hyperparameter names.

Boxes here are float32 [n, 5] rows (cls, x1, y1, x2, y2) in pixels of the image they go with; images
are uint8 HWC (BGR inside the dataset; the colour order does not matter except for HSV, which expects
BGR as OpenCV decodes it).

Mosaic is the release's: four tiles on a 2s x 2s canvas of grey 114, the canvas warped to s x s by the
random affine. Only the canvas window the warp reads (the inverse image of the output, plus the
bilinear taps) is filled and pasted, in a canvas reused from sample to sample, so a sample costs about
the output's size in copies however large the canvas; the pixels are the full canvas warp's, seams
included (where the tiles meet, the warp blends across them, as in the release).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Protocol

import cv2
import numpy as np

from yolov5_smddp.data import native

log = logging.getLogger(__name__)

PAD_VALUE = 114


class AugmentSource(Protocol):
    """What `AugmentParams.from_hyp` reads, by attribute: the run's typed hyperparameters (config.hyp.Hyp)
    have these keys; data/ names only this shape, so it never imports config/."""

    hsv_h: float
    hsv_s: float
    hsv_v: float
    degrees: float
    translate: float
    scale: float
    shear: float
    perspective: float
    flipud: float
    fliplr: float
    mosaic: float
    mixup: float


@dataclass(frozen=True, kw_only=True)
class AugmentParams:
    """Augmentation hyperparameters (names and "scratch-low" defaults of the release)."""

    hsv_h: float = 0.015
    """Hue gain (fraction)."""
    hsv_s: float = 0.7
    """Saturation gain (fraction)."""
    hsv_v: float = 0.4
    """Value gain (fraction)."""
    degrees: float = 0.0
    """Rotation range (+/- degrees)."""
    translate: float = 0.1
    """Translation range (+/- fraction of the output size)."""
    scale: float = 0.5
    """Scale range (1 +/- scale)."""
    shear: float = 0.0
    """Shear range (+/- degrees)."""
    perspective: float = 0.0
    """Perspective range (+/- fraction, 0..0.001)."""
    flipud: float = 0.0
    """Vertical flip probability."""
    fliplr: float = 0.5
    """Horizontal flip probability."""
    mosaic: float = 1.0
    """Mosaic probability."""
    mixup: float = 0.0
    """MixUp probability."""

    @classmethod
    def from_hyp(cls, hyp: AugmentSource | None) -> AugmentParams:
        """The augmentation values of the run's typed hyperparameters (config.Hyp, or an AugmentParams),
        read by attribute; None: the defaults."""
        if hyp is None:
            return cls()
        return cls(**{f.name: float(getattr(hyp, f.name)) for f in fields(cls)})


def _translation(dx: float, dy: float) -> np.ndarray:
    m = np.eye(3)
    m[0, 2], m[1, 2] = dx, dy
    return m


def random_affine_matrix(
    in_wh: tuple[float, float], out_wh: tuple[int, int], p: AugmentParams, rng: np.random.Generator
) -> tuple[np.ndarray, float]:
    """3x3 matrix from input pixels to output pixels, and its scale factor.

    M = T @ S @ R @ P @ C: C moves the input centre to the origin, P perspective, R rotation + scale,
    S shear, T moves the origin to U(0.5 +/- translate) of the output size.
    """
    c = _translation(-in_wh[0] / 2, -in_wh[1] / 2)
    persp = np.eye(3)
    persp[2, 0], persp[2, 1] = rng.uniform(-p.perspective, p.perspective, 2)
    angle = rng.uniform(-p.degrees, p.degrees)
    s = rng.uniform(1 - p.scale, 1 + p.scale)
    rot = np.eye(3)
    rot[:2] = cv2.getRotationMatrix2D(center=(0, 0), angle=angle, scale=s)
    shear = np.eye(3)
    shear[0, 1] = math.tan(rng.uniform(-p.shear, p.shear) * math.pi / 180)
    shear[1, 0] = math.tan(rng.uniform(-p.shear, p.shear) * math.pi / 180)
    tx, ty = rng.uniform(0.5 - p.translate, 0.5 + p.translate, 2)
    t = _translation(tx * out_wh[0], ty * out_wh[1])
    return t @ shear @ rot @ persp @ c, s


def transform_boxes(boxes: np.ndarray, m: np.ndarray, out_wh: tuple[int, int]) -> np.ndarray:
    """xyxy [n, 4] → the xyxy boxes enclosing their four transformed corners, clipped to out_wh."""
    n = len(boxes)
    if n == 0:
        return boxes.reshape(0, 4).astype(np.float32)
    corners = np.ones((n * 4, 3))
    corners[:, :2] = boxes[:, [0, 1, 2, 3, 0, 3, 2, 1]].reshape(n * 4, 2)
    corners = corners @ m.T
    xy = corners[:, :2] / corners[:, 2:3] if m[2, 0] or m[2, 1] else corners[:, :2]
    xy = xy.reshape(n, 8)
    x, y = xy[:, 0::2], xy[:, 1::2]
    out = np.stack([x.min(1), y.min(1), x.max(1), y.max(1)], axis=1)
    out[:, 0::2] = out[:, 0::2].clip(0, out_wh[0])
    out[:, 1::2] = out[:, 1::2].clip(0, out_wh[1])
    return out.astype(np.float32)


def box_candidates(
    before: np.ndarray, after: np.ndarray, wh_thr: float = 2, ar_thr: float = 100, area_thr: float = 0.1
) -> np.ndarray:
    """bool [n]: keep boxes wider and taller than wh_thr px, with area after / before > area_thr and
    aspect ratio < ar_thr. `before` is xyxy already multiplied by the augmentation's scale."""
    eps = 1e-16
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    aspect = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (aspect < ar_thr)


def _apply_box_transform(labels: np.ndarray, m: np.ndarray, s: float, out_wh: tuple[int, int]) -> np.ndarray:
    new = transform_boxes(labels[:, 1:5], m, out_wh)
    keep = box_candidates(labels[:, 1:5] * s, new)
    return np.concatenate([labels[keep, :1], new[keep]], axis=1).astype(np.float32)


def _warp(img: np.ndarray, m: np.ndarray, out_wh: tuple[int, int]) -> np.ndarray:
    if m[2, 0] or m[2, 1]:
        return cv2.warpPerspective(img, m, out_wh, flags=cv2.INTER_LINEAR, borderValue=(PAD_VALUE,) * 3)
    return cv2.warpAffine(img, m[:2], out_wh, flags=cv2.INTER_LINEAR, borderValue=(PAD_VALUE,) * 3)


def random_perspective(
    img: np.ndarray, labels: np.ndarray, p: AugmentParams, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Random affine/perspective of a whole image (the non-mosaic path), output the same size.

    labels [n, 5] (cls, xyxy px) → transformed, clipped and filtered (box_candidates).
    """
    h, w = img.shape[:2]
    m, s = random_affine_matrix((w, h), (w, h), p, rng)
    if not np.allclose(m, np.eye(3)):
        img = _warp(img, m, (w, h))
    return img, _apply_box_transform(labels, m, s, (w, h))


def tile_placement(k: int, hw: tuple[int, int], centre: tuple[int, int], size: int) -> tuple[int, ...]:
    """Where tile k (0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right of the centre (xc, yc)) of an
    image of `hw` pixels goes on the 2s x 2s canvas, the release's geometry, cut by the canvas edge:
    (x1a, y1a, x2a, y2a, x1b, y1b), the canvas rectangle it fills and the tile pixel at its top-left."""
    s, (xc, yc), (h, w) = size, centre, hw
    if k == 0:
        x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
        x1b, y1b = w - (x2a - x1a), h - (y2a - y1a)
    elif k == 1:
        x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, 2 * s), yc
        x1b, y1b = 0, h - (y2a - y1a)
    elif k == 2:
        x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(2 * s, yc + h)
        x1b, y1b = w - (x2a - x1a), 0
    else:
        x1a, y1a, x2a, y2a = xc, yc, min(xc + w, 2 * s), min(2 * s, yc + h)
        x1b, y1b = 0, 0
    return x1a, y1a, x2a, y2a, x1b, y1b


WARP_TAP_MARGIN = 2
"""Source pixels read around a sampled point: the bilinear taps (floor, floor + 1) and one more for the
warp's fixed-point rounding of the coordinates (1/32 px)."""


def source_window(
    m: np.ndarray, out_wh: tuple[int, int], in_wh: tuple[int, int]
) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1): the pixels of a source of size in_wh that warping it by `m` into out_wh can read
    (the inverse image of the output's pixel centres, widened by the bilinear taps), clipped to the source."""
    ow, oh = out_wh
    corners = np.array([[0, 0, 1], [ow - 1, 0, 1], [0, oh - 1, 1], [ow - 1, oh - 1, 1]], np.float64)
    back = corners @ np.linalg.inv(m).T
    xy = back[:, :2] / back[:, 2:3]
    x0 = max(int(math.floor(xy[:, 0].min())) - WARP_TAP_MARGIN, 0)
    y0 = max(int(math.floor(xy[:, 1].min())) - WARP_TAP_MARGIN, 0)
    x1 = min(int(math.floor(xy[:, 0].max())) + WARP_TAP_MARGIN + 1, in_wh[0])
    y1 = min(int(math.floor(xy[:, 1].max())) + WARP_TAP_MARGIN + 1, in_wh[1])
    return x0, y0, max(x1, x0), max(y1, y0)


@dataclass(frozen=True)
class MosaicGeometry:
    """The random part of one mosaic, drawn before any tile is decoded (`draw_mosaic_geometry`)."""

    size: int
    """Output side s (the canvas is 2s x 2s)."""
    centre: tuple[int, int]
    """(xc, yc): where the tiles meet on the canvas, each in [s/2, 3s/2)."""
    matrix: np.ndarray
    """float64 [3, 3]: canvas pixels → output pixels (the random affine)."""
    scale: float
    """The affine's scale factor (for `box_candidates`)."""
    window: tuple[int, int, int, int]
    """(x0, y0, x1, y1): the canvas pixels the warp reads (`source_window`)."""


def draw_mosaic_geometry(size: int, p: AugmentParams, rng: np.random.Generator) -> MosaicGeometry:
    """The centre U[s/2, 3s/2)^2 (truncated to whole pixels), then the random affine of the 2s x 2s canvas
    to s x s: the release's draws, in its order. Independent of the tiles' pixels (their sizes only
    enter the placement), so drawn before anything is decoded."""
    s = size
    xc, yc = (int(v) for v in rng.uniform(s / 2, 3 * s / 2, 2))
    m, scale = random_affine_matrix((2 * s, 2 * s), (s, s), p, rng)
    return MosaicGeometry(
        size=s, centre=(xc, yc), matrix=m, scale=scale, window=source_window(m, (s, s), (2 * s, 2 * s))
    )


def _tile_in_window(k: int, hw: tuple[int, int], g: MosaicGeometry):
    """(placement, (cx0, cy0, cx1, cy1) the part of the tile's canvas rectangle inside the window, or None)."""
    x1a, y1a, x2a, y2a, x1b, y1b = placement = tile_placement(k, hw, g.centre, g.size)
    wx0, wy0, wx1, wy1 = g.window
    cx0, cy0, cx1, cy1 = max(x1a, wx0), max(y1a, wy0), min(x2a, wx1), min(y2a, wy1)
    return placement, ((cx0, cy0, cx1, cy1) if cx1 > cx0 and cy1 > cy0 else None)


def _window_quadrants(g: MosaicGeometry) -> list[tuple[int, int, int, int]]:
    """The window cut at the centre into the four quadrants (tile order); tile k lies in quadrant k."""
    (xc, yc), (wx0, wy0, wx1, wy1) = g.centre, g.window
    xm, ym = min(max(xc, wx0), wx1), min(max(yc, wy0), wy1)
    return [(wx0, wy0, xm, ym), (xm, wy0, wx1, ym), (wx0, ym, xm, wy1), (xm, ym, wx1, wy1)]


def _fill_around(
    canvas: np.ndarray, box: tuple[int, int, int, int], hole: tuple[int, int, int, int] | None
) -> None:
    """Fill `box` minus `hole` (a rectangle inside it, or None) with the pad value: at most four strips,
    so the canvas is written once per pixel of the window instead of filled and then pasted over."""
    bx0, by0, bx1, by1 = box
    if hole is None:
        canvas[by0:by1, bx0:bx1] = PAD_VALUE
        return
    hx0, hy0, hx1, hy1 = hole
    canvas[by0:hy0, bx0:bx1] = PAD_VALUE
    canvas[hy1:by1, bx0:bx1] = PAD_VALUE
    canvas[hy0:hy1, bx0:hx0] = PAD_VALUE
    canvas[hy0:hy1, hx1:bx1] = PAD_VALUE


def tile_source_rect(k: int, hw: tuple[int, int], g: MosaicGeometry) -> tuple[int, int, int, int] | None:
    """(x0, y0, x1, y1) in pixels of tile k's image (of `hw`): the pixels the mosaic pastes on the canvas
    and the warp can read, or None when the tile does not show. The mosaic depends on the tile image
    only through these pixels (tests/unit/test_data_roi_mosaic.py fills the rest with noise)."""
    (x1a, y1a, _, _, x1b, y1b), inside = _tile_in_window(k, hw, g)
    if inside is None:
        return None
    cx0, cy0, cx1, cy1 = inside
    return x1b + cx0 - x1a, y1b + cy0 - y1a, x1b + cx1 - x1a, y1b + cy1 - y1a


def mosaic(
    tiles: list[tuple[np.ndarray, np.ndarray]],
    size: int,
    p: AugmentParams,
    rng: np.random.Generator,
    canvas: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Four (image, labels [n, 5] cls+xyxy px) tiles → (uint8 [size, size, 3], labels [m, 5]).

    The release's: the tiles meet at a centre drawn uniformly in [s/2, 3s/2]^2 of a 2s x 2s canvas filled
    with 114 (see `tile_placement`), then the random affine maps the canvas to s x s (bilinear, border
    114). `canvas`: a uint8 [2s, 2s, 3] scratch array to reuse (its content does not matter: only the
    window the warp reads is filled); None allocates one.
    """
    return compose_mosaic(iter(tiles), draw_mosaic_geometry(size, p, rng), canvas)


def compose_mosaic(
    tiles: Iterator[tuple[np.ndarray, np.ndarray]], g: MosaicGeometry, canvas: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """`mosaic` for a geometry drawn beforehand. `tiles` is consumed one tile at a time, each pasted on the
    canvas before the next is taken, so a producer may hand out the same buffer for every tile
    (`YoloDataset` does, for tiles decoded only inside `tile_source_rect`)."""
    s, m = g.size, g.matrix
    if canvas is None or canvas.shape != (2 * s, 2 * s, 3) or canvas.dtype != np.uint8:
        canvas = np.empty((2 * s, 2 * s, 3), np.uint8)
    all_labels = []
    quadrants = _window_quadrants(g)
    for k, (img, labels) in enumerate(tiles):
        (x1a, y1a, _, _, x1b, y1b), inside = _tile_in_window(k, img.shape[:2], g)
        if inside is not None:  # the part of the tile's rectangle inside the window
            cx0, cy0, cx1, cy1 = inside
            canvas[cy0:cy1, cx0:cx1] = img[
                y1b + cy0 - y1a : y1b + cy1 - y1a, x1b + cx0 - x1a : x1b + cx1 - x1a
            ]
        _fill_around(canvas, quadrants[k], inside)  # 114 only where the tile does not cover its quadrant
        shifted = labels.copy()
        shifted[:, [1, 3]] += x1a - x1b
        shifted[:, [2, 4]] += y1a - y1b
        all_labels.append(shifted)
    for k in range(len(all_labels), 4):  # fewer than four tiles: their quadrants are grey
        _fill_around(canvas, quadrants[k], None)
    out = _warp(canvas, m, (s, s))
    labels = np.concatenate(all_labels) if all_labels else np.zeros((0, 5), np.float32)
    labels[:, 1:] = labels[:, 1:].clip(0, 2 * s)
    return out, _apply_box_transform(labels, m, g.scale, (s, s))


COLOR_COLUMNS = 6
"""Per-sample colour parameters: (gain_h, gain_s, gain_v, hsv_on, flip_ud, flip_lr), float64."""


def draw_color_params(p: AugmentParams, rng: np.random.Generator) -> np.ndarray:
    """float64 [6] for one sample: the HSV gains U(1 +/- gain) (drawn only when a gain is set), then the
    up-down and left-right flips. The one place these draws happen, whichever side applies them
    (`apply_color_hwc` in the worker, `data.color.apply_color` on the device batch)."""
    out = np.zeros(COLOR_COLUMNS, np.float64)
    if p.hsv_h or p.hsv_s or p.hsv_v:
        out[:3] = rng.uniform(-1, 1, 3) * (p.hsv_h, p.hsv_s, p.hsv_v) + 1
        out[3] = 1
    else:
        out[:3] = 1
    out[4] = rng.random() < p.flipud
    out[5] = rng.random() < p.fliplr
    return out


def _hsv_table(params: np.ndarray) -> np.ndarray:
    """uint8 [256, 1, 3]: the hue, saturation and value gains of `params` as one 3-channel table."""
    x = np.arange(256, dtype=np.float32)
    lut = np.empty((256, 1, 3), np.uint8)
    lut[:, 0, 0] = (x * params[0]) % 180
    lut[:, 0, 1] = np.clip(x * params[1], 0, 255)
    lut[:, 0, 2] = np.clip(x * params[2], 0, 255)
    return lut


_native_color: dict[str, object] = {}  # "lib": the checked native library for the table + flips, or None


def _color_check(lib) -> bool:
    """The native table + flips give cv2.LUT + cv2.flip's pixels on a small random image."""
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (23, 37, 3), dtype=np.uint8)
    table = rng.integers(0, 256, (256, 1, 3), dtype=np.uint8)
    for flip_ud, flip_lr in ((False, False), (False, True), (True, False), (True, True)):
        expected = cv2.LUT(src, table)
        if flip_ud or flip_lr:
            expected = cv2.flip(expected, -1 if flip_ud and flip_lr else (0 if flip_ud else 1))
        got = np.zeros_like(src)
        native.lut3_flip(lib, src, got, table, flip_lr, flip_ud)
        if not np.array_equal(got, expected):
            return False
    return True


def color_lut():
    """The native library for the HSV table fused with the flips, checked against OpenCV once per process;
    None (OpenCV's LUT and flip are used) when it is missing or its pixels differ."""
    return native.checked(
        _native_color,
        "lib",
        lambda lib: None if _color_check(lib) else "its table pass gives other pixels than cv2.LUT",
        "native HSV table off (%s): using cv2.LUT",
        log,
    )


_MIRROR_COMMUTES: dict[tuple[int, int], bool] = {}  # (h, w) -> mirror_commutes_with_hsv2rgb (per process)
_MIRROR_SHAPES_KEPT = 256


def mirror_commutes_with_hsv2rgb(shape_hw: tuple[int, int]) -> bool:
    """Whether OpenCV's 8-bit HSV → RGB of an (h, w) image, mirrored left-right, equals the mirror of its
    HSV → RGB, i.e. every pixel of a row takes the same code path (no scalar tail: true for widths a
    multiple of the SIMD block, e.g. 640), so the left-right flip may ride on the table pass before it.
    Decided by trying it, once per shape and process, on random HSV pixels of that shape (the path
    depends on the position in a row, not on the values: a tail shows on many of them)."""
    shape = (int(shape_hw[0]), int(shape_hw[1]))
    known = _MIRROR_COMMUTES.get(shape)
    if known is not None:
        return known
    rng = np.random.default_rng(shape[0] * 100_003 + shape[1])
    hsv = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
    hsv[..., 0] %= 180  # 8-bit hue is 0..179, as the table makes it
    mirrored_first = cv2.cvtColor(np.ascontiguousarray(hsv[:, ::-1]), cv2.COLOR_HSV2RGB)
    same = bool(np.array_equal(mirrored_first, cv2.flip(cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB), 1)))
    if len(_MIRROR_COMMUTES) < _MIRROR_SHAPES_KEPT:  # rectangular batches bring a few shapes, not many
        _MIRROR_COMMUTES[shape] = same
    return same


def apply_color_hwc(img: np.ndarray, params: np.ndarray) -> np.ndarray:
    """BGR uint8 [h, w, 3] → a new RGB uint8 image with `params` (see `draw_color_params`) applied: hue,
    saturation and value scaled through one 3-channel lookup table, then the flips.

    The colour-order change rides on the HSV → RGB conversion the jitter needs anyway (no extra pass).
    With the native library the table pass is `native.lut3_flip` (0.43 against cv2.LUT's 0.71 ms at
    640 x 640: OpenCV's 3-channel table is a scalar loop), which also does the up-down flip: rows are
    converted alike, so flipping them before HSV → RGB gives the same pixels. The left-right flip only
    where `mirror_commutes_with_hsv2rgb` says so for the image's shape: OpenCV's HSV → RGB gives some
    pixels one level apart in its vector body and its scalar tail, so moving pixels along a row before
    it changes them where a row has a tail (widths not a multiple of 32 here); elsewhere cv2.flip after.
    """
    up_down, left_right = bool(params[4]), bool(params[5])
    if params[3]:
        lut = _hsv_table(params)
        hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)  # the one new image; the table and the way back in place
        lib = color_lut()
        if lib is not None:
            out = np.empty_like(hsv)
            fold_lr = left_right and mirror_commutes_with_hsv2rgb(hsv.shape[:2])
            native.lut3_flip(lib, hsv, out, lut, flip_lr=fold_lr, flip_ud=up_down)
            img, up_down = cv2.cvtColor(out, cv2.COLOR_HSV2RGB, dst=out), False
            left_right = left_right and not fold_lr
        else:
            img = cv2.cvtColor(cv2.LUT(hsv, lut, dst=hsv), cv2.COLOR_HSV2RGB, dst=hsv)
    else:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    if up_down or left_right:
        img = cv2.flip(img, -1 if up_down and left_right else (0 if up_down else 1))
    return img


def flip_labels(labels_xywhn: np.ndarray, up_down: bool, left_right: bool) -> np.ndarray:
    """[n, 5] (cls, xc, yc, w, h normalised) as they are after the image is flipped (a copy)."""
    labels = labels_xywhn.copy()
    if up_down:
        labels[:, 2] = 1 - labels[:, 2]
    if left_right:
        labels[:, 1] = 1 - labels[:, 1]
    return labels


def mixup(
    img: np.ndarray, labels: np.ndarray, img2: np.ndarray, labels2: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Blend two same-size images with r ~ Beta(32, 32); the labels of both are kept."""
    r = rng.beta(32.0, 32.0)
    blended = (img.astype(np.float32) * r + img2.astype(np.float32) * (1 - r)).astype(np.uint8)
    return blended, np.concatenate([labels, labels2])


def xyxy_to_xywhn(labels: np.ndarray, w: int, h: int) -> np.ndarray:
    """[n, 5] (cls, xyxy px) → (cls, xc, yc, w, h) normalised to (w, h), boxes clipped inside the image."""
    out = labels.astype(np.float32).copy()
    x1, x2 = labels[:, 1].clip(0, w), labels[:, 3].clip(0, w)
    y1, y2 = labels[:, 2].clip(0, h), labels[:, 4].clip(0, h)
    out[:, 1], out[:, 2] = (x1 + x2) / 2 / w, (y1 + y2) / 2 / h
    out[:, 3], out[:, 4] = (x2 - x1) / w, (y2 - y1) / h
    return out


def xywhn_to_xyxy(
    labels: np.ndarray, w: float, h: float, pad_w: float = 0.0, pad_h: float = 0.0
) -> np.ndarray:
    """[n, 5] (cls, xywh normalised) → (cls, xyxy px) for an image of (w, h) pixels placed at (pad_w, pad_h)."""
    out = labels.astype(np.float32).copy()
    out[:, 1] = w * (labels[:, 1] - labels[:, 3] / 2) + pad_w
    out[:, 2] = h * (labels[:, 2] - labels[:, 4] / 2) + pad_h
    out[:, 3] = w * (labels[:, 1] + labels[:, 3] / 2) + pad_w
    out[:, 4] = h * (labels[:, 2] + labels[:, 4] / 2) + pad_h
    return out
