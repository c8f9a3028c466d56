"""Training augmentations with the release's semantics and hyperparameter names.

Boxes here are float32 [n, 5] rows (cls, x1, y1, x2, y2) in pixels of the image they go with; images
are uint8 HWC (BGR inside the dataset; the colour order does not matter except for HSV, which expects
BGR as OpenCV decodes it).

Mosaic is composed with the random affine: instead of pasting four tiles on a 2s x 2s canvas and
warping the canvas, each tile is warped once, straight into the s x s output, with the canvas
placement folded into its matrix (same geometry, no large canvas, one pass over the output pixels).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, fields

import cv2
import numpy as np

from yolov5_smddp.data import native

log = logging.getLogger(__name__)

PAD_VALUE = 114


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
    def from_hyp(cls, hyp: dict | None) -> AugmentParams:
        """Take the augmentation keys of a hyperparameter dict (other keys are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in (hyp or {}).items() if k in names})


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


def _warp(
    img: np.ndarray, m: np.ndarray, out_wh: tuple[int, int], dst: np.ndarray | None = None
) -> np.ndarray:
    border = cv2.BORDER_CONSTANT if dst is None else cv2.BORDER_TRANSPARENT
    if m[2, 0] or m[2, 1]:
        return cv2.warpPerspective(
            img, m, out_wh, dst=dst, flags=cv2.INTER_LINEAR, borderMode=border, borderValue=(PAD_VALUE,) * 3
        )
    return cv2.warpAffine(
        img, m[:2], out_wh, dst=dst, flags=cv2.INTER_LINEAR, borderMode=border, borderValue=(PAD_VALUE,) * 3
    )


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


@dataclass(frozen=True)
class MosaicGeometry:
    """The random part of one mosaic, drawn before any tile is decoded (`draw_mosaic_geometry`)."""

    size: int
    """Output side s (the virtual canvas is 2s x 2s)."""
    xc: int
    """Tile meeting point on the canvas, x in [s/2, 3s/2)."""
    yc: int
    """Tile meeting point on the canvas, y in [s/2, 3s/2)."""
    matrix: np.ndarray
    """float64 [3, 3]: canvas pixels → output pixels (the random affine)."""
    scale: float
    """The affine's scale factor (for `box_candidates`)."""
    tiles: dict = field(default_factory=dict, compare=False, repr=False)
    """Memo of `plan_tile` per (k, h, w): the dataset and `compose_mosaic` both ask for each tile."""


@dataclass(frozen=True)
class TilePlacement:
    """Where tile k's image lands on the canvas: its crop img[y0:y0+h, x0:x0+w] goes to canvas (cx, cy)."""

    x0: int
    y0: int
    w: int
    h: int
    cx: int
    cy: int


def draw_mosaic_geometry(size: int, p: AugmentParams, rng: np.random.Generator) -> MosaicGeometry:
    """The mosaic centre U[s/2, 3s/2)^2 (truncated to whole pixels), then the random affine of the 2s x 2s
    canvas to s x s: the release's draws. Independent of the tiles' pixels, so drawn before decoding."""
    s = size
    xc, yc = (int(v) for v in rng.uniform(s / 2, 3 * s / 2, 2))
    m, scale = random_affine_matrix((2 * s, 2 * s), (s, s), p, rng)
    return MosaicGeometry(size=s, xc=xc, yc=yc, matrix=m, scale=scale)


def tile_placement(k: int, hw: tuple[int, int], g: MosaicGeometry) -> TilePlacement:
    """Tile k (0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right) of an image of `hw` pixels: the
    part of the image that meets the centre, clipped to the 2s x 2s canvas."""
    h, w = hw
    xc, yc, s2 = g.xc, g.yc, 2 * g.size
    if k == 0:
        x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
        x1b, y1b = w - (x2a - x1a), h - (y2a - y1a)
    elif k == 1:
        x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, s2), yc
        x1b, y1b = 0, h - (y2a - y1a)
    elif k == 2:
        x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(s2, yc + h)
        x1b, y1b = w - (x2a - x1a), 0
    else:
        x1a, y1a, x2a, y2a = xc, yc, min(xc + w, s2), min(s2, yc + h)
        x1b, y1b = 0, 0
    return TilePlacement(x0=x1b, y0=y1b, w=x2a - x1a, h=y2a - y1a, cx=x1a, cy=y1a)


def _tile_matrix(t: TilePlacement, g: MosaicGeometry) -> np.ndarray:
    """Crop pixel → canvas → output."""
    return g.matrix @ _translation(t.cx, t.cy)


def plan_tile(k: int, hw: tuple[int, int], g: MosaicGeometry):
    """(placement, crop → output matrix, output region or None) of tile k of an image of `hw` pixels,
    computed once per geometry and tile."""
    key = (k, int(hw[0]), int(hw[1]))
    plan = g.tiles.get(key)
    if plan is None:
        t = tile_placement(k, hw, g)
        m = _tile_matrix(t, g)
        plan = g.tiles[key] = (t, m, _warp_region((g.size, g.size), (t.w, t.h), m))
    return plan


def _warp_region(
    out_wh: tuple[int, int], crop_wh: tuple[int, int], m: np.ndarray
) -> tuple[int, int, int, int] | None:
    """The output rectangle (x0, y0, x1, y1) `_paste_warped` warps into: the bounding box of the crop's
    footprint under `m`, one pixel wider on each side, clipped to the output; None when empty."""
    cw, ch = crop_wh
    if ch == 0 or cw == 0:
        return None
    ow, oh = out_wh
    footprint = transform_boxes(np.array([[0, 0, cw, ch]], np.float64), m, (ow, oh))[0]
    x0, y0 = max(int(math.floor(footprint[0])) - 1, 0), max(int(math.floor(footprint[1])) - 1, 0)
    x1, y1 = min(int(math.ceil(footprint[2])) + 1, ow), min(int(math.ceil(footprint[3])) + 1, oh)
    if x1 <= x0 or y1 <= y0:
        return None
    return x0, y0, x1, y1


_TAP_MARGIN = 2
"""Source pixels added on each side of the mapped-back output rectangle: the bilinear taps reach one pixel
past the mapped point, and OpenCV maps with fixed-point arithmetic (1/1024 px), so two is ample."""


def tile_source_rect(k: int, hw: tuple[int, int], g: MosaicGeometry) -> tuple[int, int, int, int] | None:
    """(x0, y0, x1, y1) in pixels of tile k's image (of `hw`): every pixel the mosaic's warp of that tile
    can read, or None when the tile does not show. Only for an affine matrix (no perspective: the
    inverse image of a rectangle is then a parallelogram, bounded by its four corners).

    The mosaic output depends on the tile image only through these pixels: the rest may hold anything
    (tests/unit/test_data_roi_mosaic.py fills it with noise; one pixel less on any side fails it)."""
    if g.matrix[2, 0] or g.matrix[2, 1]:
        raise ValueError("tile_source_rect needs an affine matrix (perspective 0)")
    t, m, region = plan_tile(k, hw, g)
    if region is None:
        return None
    x0, y0, x1, y1 = region
    # the inverse of [[a, b, c], [d, e, f]] in plain floats (a bound with a margin: no exact rounding needed)
    a, b, c, d, e, f = (float(v) for v in m[:2].reshape(-1))
    det = a * e - b * d
    ia, ib, id_, ie = e / det, -b / det, -d / det, a / det
    ic, if_ = -(ia * c + ib * f), -(id_ * c + ie * f)
    xs, ys = [], []
    for u, v in ((x0, y0), (x1 - 1, y0), (x0, y1 - 1), (x1 - 1, y1 - 1)):
        xs.append(ia * u + ib * v + ic)
        ys.append(id_ * u + ie * v + if_)
    sx0 = max(math.floor(min(xs)) - _TAP_MARGIN, 0)
    sy0 = max(math.floor(min(ys)) - _TAP_MARGIN, 0)
    sx1 = min(math.ceil(max(xs)) + _TAP_MARGIN + 1, t.w)
    sy1 = min(math.ceil(max(ys)) + _TAP_MARGIN + 1, t.h)
    if sx1 <= sx0 or sy1 <= sy0:
        return None
    return sx0 + t.x0, sy0 + t.y0, sx1 + t.x0, sy1 + t.y0


def mosaic(
    tiles: list[tuple[np.ndarray, np.ndarray]], size: int, p: AugmentParams, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Four (image, labels [n, 5] cls+xyxy px) tiles → (uint8 [size, size, 3], labels [m, 5]).

    Geometry of the release: the tiles meet at a centre drawn uniformly in [s/2, 3s/2]^2 of a virtual
    2s x 2s canvas filled with 114 (tile 0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right), then
    the random affine maps the canvas to s x s. Each tile is warped directly into the output.
    """
    return compose_mosaic(iter(tiles), draw_mosaic_geometry(size, p, rng))


def compose_mosaic(
    tiles: Iterator[tuple[np.ndarray, np.ndarray]], g: MosaicGeometry
) -> tuple[np.ndarray, np.ndarray]:
    """The mosaic of four tiles with geometry `g`: (uint8 [s, s, 3], labels [m, 5] cls+xyxy px).

    `tiles` is consumed one tile at a time, each warped into the output before the next is taken, so a
    producer may hand out the same buffer for every tile (`YoloDataset` does, for decoded regions)."""
    s = g.size
    out = np.full((s, s, 3), PAD_VALUE, dtype=np.uint8)
    all_labels = []
    for k, (img, labels) in enumerate(tiles):
        t, m, region = plan_tile(k, img.shape[:2], g)
        if region is not None:
            _paste_warped(out, img[t.y0 : t.y0 + t.h, t.x0 : t.x0 + t.w], m, region)
        shifted = labels.copy()
        shifted[:, [1, 3]] += t.cx - t.x0
        shifted[:, [2, 4]] += t.cy - t.y0
        all_labels.append(shifted)
    labels = np.concatenate(all_labels) if all_labels else np.zeros((0, 5), np.float32)
    labels[:, 1:] = labels[:, 1:].clip(0, 2 * s)
    return out, _apply_box_transform(labels, g.matrix, g.scale, (s, s))


def _paste_warped(
    out: np.ndarray, crop: np.ndarray, m: np.ndarray, region_box: tuple[int, int, int, int] | None = None
) -> None:
    """Warp `crop` by `m` into `out` in place, touching only the bounding box of its footprint.

    Always a warp, also when `m` only scales and translates: a cv2.resize placed at a whole output pixel
    would be cheaper, but its half-pixel sampling grid and the rounded placement shift the tile by up to
    a pixel against the labels (the release warps the canvas; measured: mean |difference| 7.0 grey
    levels against the canvas warp, 0.4 for the warp, only at tile seams), and at small image sizes that
    cost accuracy (docs/ACCURACY.md). `region_box`: `_warp_region`'s answer when the caller has it."""
    if region_box is None:
        region_box = _warp_region((out.shape[1], out.shape[0]), (crop.shape[1], crop.shape[0]), m)
    if region_box is None:
        return
    x0, y0, x1, y1 = region_box
    # straight into the view of `out` (OpenCV takes a row-strided view as its dst and writes through
    # it): no copy of the region out and back; copied only if a build of OpenCV ever hands back another array
    region = out[y0:y1, x0:x1]
    warped = _warp(crop, _translation(-x0, -y0) @ m, (x1 - x0, y1 - y0), dst=region)
    if warped is not region:
        region[...] = warped


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
    if "lib" not in _native_color:
        lib = native.library()
        if lib is not None and not _color_check(lib):
            log.info(
                "native HSV table off (%s: pixels differ from OpenCV's): using cv2.LUT", native.library_path()
            )
            lib = None
        _native_color["lib"] = lib
    return _native_color["lib"]


def apply_color_hwc(img: np.ndarray, params: np.ndarray) -> np.ndarray:
    """BGR uint8 [h, w, 3] → a new RGB uint8 image with `params` (see `draw_color_params`) applied: hue,
    saturation and value scaled through one 3-channel lookup table, then the flips.

    The colour-order change rides on the HSV → RGB conversion the jitter needs anyway (no extra pass).
    With the native library the table pass is `native.lut3_flip` (0.43 against cv2.LUT's 0.71 ms at
    640 x 640: OpenCV's 3-channel table is a scalar loop), which also does the up-down flip: rows are
    converted alike, so flipping them before HSV → RGB gives the same pixels. Not the left-right flip:
    OpenCV's HSV → RGB gives some pixels one level apart in its vector body and its scalar tail, so
    moving pixels along a row before it would change them (measured on widths not a multiple of 32).
    """
    up_down, left_right = bool(params[4]), bool(params[5])
    if params[3]:
        lut = _hsv_table(params)
        hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)  # the one new image; the table and the way back in place
        lib = color_lut()
        if lib is not None:
            out = np.empty_like(hsv)
            native.lut3_flip(lib, hsv, out, lut, flip_lr=False, flip_ud=up_down)
            img, up_down = cv2.cvtColor(out, cv2.COLOR_HSV2RGB, dst=out), False
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
