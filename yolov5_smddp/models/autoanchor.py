"""AutoAnchor: do the model's anchors fit the training labels, and if not, fit new ones.

The release's rule, at the start of every new (not resumed) run: the best possible recall (BPR) of the
anchors over the training boxes — box sizes at `imgsz` (each image's long side scaled to imgsz, times a
random 0.9..1.1 zoom per image), a box counted when some anchor is within a factor `anchor_t` of it in both
width and height. BPR >= 0.98 keeps the anchors. Otherwise k-means over the boxes (scipy's, 30 starts, on
whitened sizes) and 1000 generations of mutation evolution with the release's fitness (mean best
ratio over the boxes that pass) propose new anchors, kept only if their BPR is higher.

Bounded: the fit (k-means and evolution) works on at most FIT_SAMPLE boxes, a uniform sample drawn with
the run's generator (a 2.8 M-box label set kept the unbounded fit busy for 49 CPU-minutes); the recall is
measured on every box, in chunks. A degenerate box (a side of zero, or not finite) takes no part in either,
and no anchor under MIN_BOX_PX (2 px) is ever proposed or applied.

Every random draw comes from one `numpy.random.Generator` seeded with `--seed`, so a run's anchors are
reproducible. Under DDP only rank 0 computes; the anchors are broadcast, so every rank trains the same ones.
The anchors live in the Detect `anchors` buffer (saved in every checkpoint and in best.pt) and in the
model config (`model.cfg["anchors"]`, saved as best.pt's metadata and used to rebuild the model).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from yolov5_smddp.models.yolo import DetectionModel

try:  # in the DLC and in the stand-in; a plain Lloyd iteration below when it is missing
    from scipy.cluster.vq import kmeans as _scipy_kmeans
except ImportError:  # pragma: no cover - depends on the image
    _scipy_kmeans = None

log = logging.getLogger("yolov5_smddp")

GOOD_BPR = 0.98
GENERATIONS = 1000
KMEANS_STARTS = 30
MIN_BOX_PX = (
    2.0  # boxes smaller than this in both sides do not take part in the fit; the smallest anchor side
)
FIT_SAMPLE = 10_000
"""Boxes the fit works on at most (a uniform sample of the rest)."""
METRIC_CHUNK = 65_536
"""Boxes per chunk when the recall is measured over all of them (bounded memory: chunk x anchors x 2)."""
_MUTATION_PROB, _MUTATION_SIGMA = 0.9, 0.1


@dataclass(frozen=True)
class AnchorCheck:
    """What the check found and did. `anchors_px` [nl * na, 2] are the anchors the run trains with,
    smallest area first (level by level)."""

    bpr_before: float
    bpr_after: float
    anchors_px: np.ndarray
    changed: bool
    boxes: int

    def line(self) -> str:
        if self.boxes == 0:
            return "autoanchor: no training boxes, anchors kept"
        head = f"autoanchor: {self.bpr_before:.4f} best possible recall of the current anchors on {self.boxes} boxes"
        if self.bpr_before >= GOOD_BPR:
            return head + " (>= 0.98: anchors kept)"
        if self.changed:
            return (
                head
                + f"; new anchors (k-means + evolution) reach {self.bpr_after:.4f}: {_pairs(self.anchors_px)}"
            )
        return head + f"; fitted anchors reach only {self.bpr_after:.4f}: current anchors kept"

    def to_vector(self) -> np.ndarray:
        """float64 [4 + 2 * anchors]: bpr_before, bpr_after, changed (0/1), boxes, then anchors_px row by
        row — what a broadcast of plain floats carries to the other ranks (`from_vector` inverts it)."""
        head = [self.bpr_before, self.bpr_after, float(self.changed), float(self.boxes)]
        return np.concatenate(
            [np.asarray(head, np.float64), np.asarray(self.anchors_px, np.float64).reshape(-1)]
        )

    @staticmethod
    def from_vector(vector: np.ndarray) -> AnchorCheck:
        """The AnchorCheck `to_vector` encoded (anchors_px float32 [anchors, 2], as check_anchors makes them)."""
        values = np.asarray(vector, np.float64)
        return AnchorCheck(
            float(values[0]),
            float(values[1]),
            values[4:].reshape(-1, 2).astype(np.float32),
            bool(values[2]),
            int(values[3]),
        )


def _pairs(anchors: np.ndarray) -> str:
    return " ".join(f"{w:.0f},{h:.0f}" for w, h in anchors)


def label_sizes(
    shapes_hw: np.ndarray, labels: Sequence[np.ndarray], imgsz: int, zoom: np.ndarray | None = None
) -> np.ndarray:
    """Box (w, h) in pixels at `imgsz`: float32 [n, 2]. `shapes_hw` [N, 2] image (h, w); `labels` per
    image [k, 5] (cls, xc, yc, w, h normalised); `zoom` an optional per-image factor [N]."""
    shapes = np.asarray(shapes_hw, np.float64)[:, ::-1]  # (w, h)
    scaled = imgsz * shapes / shapes.max(1, keepdims=True)
    if zoom is not None:
        scaled = scaled * np.asarray(zoom, np.float64).reshape(-1, 1)
    rows = [lab[:, 3:5] * size for size, lab in zip(scaled, labels) if len(lab)]
    wh = np.concatenate(rows).astype(np.float32) if rows else np.zeros((0, 2), np.float32)
    return wh[np.isfinite(wh).all(1) & (wh > 0).all(1)]  # a zero-size box fits no anchor: never fitted to


def _best_ratios(anchors: np.ndarray, wh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per box and anchor the worse of the two side ratios (<= 1), and per box its best anchor's."""
    r = wh[:, None, :] / anchors[None, :, :]
    x = np.minimum(r, 1.0 / r).min(2)
    return x, x.max(1)


def anchor_metrics(anchors_px: np.ndarray, wh: np.ndarray, anchor_t: float) -> tuple[float, float]:
    """(best possible recall, anchors above threshold per box) of `anchors_px` [k, 2] over `wh` [n, 2]."""
    if len(wh) == 0:
        return 0.0, 0.0
    anchors, wh = np.asarray(anchors_px, np.float32), np.asarray(wh, np.float32)
    threshold = 1.0 / anchor_t
    recalled, above = 0, 0
    for start in range(0, len(wh), METRIC_CHUNK):
        x, best = _best_ratios(anchors, wh[start : start + METRIC_CHUNK])
        recalled += int((best > threshold).sum())
        above += int((x > threshold).sum())
    return recalled / len(wh), above / len(wh)


def _fitness(anchors: np.ndarray, wh: np.ndarray, threshold: float) -> float:
    _, best = _best_ratios(anchors, wh)
    return float((best * (best > threshold)).mean())


def _lloyd(points: np.ndarray, start: np.ndarray, iterations: int = 100) -> tuple[np.ndarray, float]:
    centres = start.copy()
    for _ in range(iterations):
        nearest = ((points[:, None] - centres[None]) ** 2).sum(2).argmin(1)
        moved = np.stack(
            [
                points[nearest == j].mean(0) if (nearest == j).any() else centres[j]
                for j in range(len(centres))
            ]
        )
        if np.allclose(moved, centres):
            break
        centres = moved
    distortion = float(np.sqrt(((points[:, None] - centres[None]) ** 2).sum(2).min(1)).mean())
    return centres, distortion


def _kmeans(points: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray | None:
    """Best of KMEANS_STARTS k-means runs, each started from n distinct points drawn by `rng`."""
    best, best_distortion = None, np.inf
    for _ in range(KMEANS_STARTS):
        start = points[rng.choice(len(points), n, replace=False)].astype(np.float64)
        if _scipy_kmeans is not None:
            centres, distortion = _scipy_kmeans(points.astype(np.float64), start)
        else:  # pragma: no cover - depends on the image
            centres, distortion = _lloyd(points.astype(np.float64), start)
        if len(centres) == n and distortion < best_distortion:
            best, best_distortion = centres, distortion
    return best


def fit_anchors(
    wh0: np.ndarray,
    n: int,
    imgsz: int,
    anchor_t: float,
    rng: np.random.Generator,
    generations: int = GENERATIONS,
) -> np.ndarray:
    """n anchors [n, 2] (pixels, smallest area first) for the box sizes `wh0`: k-means on sizes divided
    by their standard deviation, then `generations` rounds of mutation (each side of each anchor
    multiplied, with probability 0.9, by 1 + N(0, 1) * U(0, 1) * 0.1, clipped to 0.3..3, sides >= 2 px),
    a mutant kept when the fitness rises. Only boxes with both sides > 0 and one >= 2 px take part, at
    most FIT_SAMPLE of them (drawn by `rng`); every anchor side is >= MIN_BOX_PX."""
    wh = np.asarray(wh0, np.float32)
    wh = wh[(wh >= MIN_BOX_PX).any(1) & (wh > 0).all(1) & np.isfinite(wh).all(1)]
    if len(wh) > FIT_SAMPLE:
        wh = wh[np.sort(rng.choice(len(wh), FIT_SAMPLE, replace=False))]
    threshold = 1.0 / anchor_t
    anchors = None
    distinct = np.unique(wh, axis=0)
    if len(distinct) >= n:
        sigma = wh.std(0)
        sigma[sigma == 0] = 1.0
        centres = _kmeans(wh / sigma, n, rng)
        anchors = None if centres is None else centres * sigma
    if anchors is None:  # fewer distinct boxes than anchors: random sizes, as the release falls back to
        anchors = np.sort(rng.random(n * 2)).reshape(n, 2) * imgsz
    anchors = anchors[np.argsort(anchors.prod(1))].clip(min=MIN_BOX_PX).astype(np.float32)
    fit = _fitness(anchors, wh, threshold) if len(wh) else 0.0
    for _ in range(generations if len(wh) else 0):
        factors = np.ones_like(anchors)
        while (factors == 1).all():
            mutate = rng.random(anchors.shape) < _MUTATION_PROB
            factors = (mutate * rng.random() * rng.standard_normal(anchors.shape) * _MUTATION_SIGMA + 1).clip(
                0.3, 3.0
            )
        candidate = (anchors * factors).clip(min=MIN_BOX_PX).astype(np.float32)
        candidate_fit = _fitness(candidate, wh, threshold)
        if candidate_fit > fit:
            fit, anchors = candidate_fit, candidate
    return anchors[np.argsort(anchors.prod(1))].astype(np.float32)


def model_anchors_px(model: DetectionModel) -> np.ndarray:
    """The model's anchors in pixels, [nl * na, 2] level by level."""
    detect = model.detect
    stride = torch.tensor(detect.strides).view(-1, 1, 1)
    return (detect.anchors.detach().float().cpu() * stride).reshape(-1, 2).numpy()


def check_anchors(
    model: DetectionModel,
    shapes_hw: np.ndarray,
    labels: Sequence[np.ndarray],
    imgsz: int,
    anchor_t: float,
    seed: int,
    generations: int = GENERATIONS,
) -> AnchorCheck:
    """The release's check on one process: BPR of the model's anchors, and fitted anchors when it is below
    0.98 and they do better. Pure: the model is not changed (see `apply_anchors`)."""
    rng = np.random.default_rng(seed)
    current = model_anchors_px(model)
    zoom = rng.uniform(0.9, 1.1, size=len(shapes_hw))
    wh = label_sizes(shapes_hw, labels, imgsz, zoom)
    bpr, _ = anchor_metrics(current, wh, anchor_t)
    if len(wh) == 0 or bpr >= GOOD_BPR:
        return AnchorCheck(bpr, bpr, current, False, len(wh))
    fitted = fit_anchors(
        label_sizes(shapes_hw, labels, imgsz), len(current), imgsz, anchor_t, rng, generations
    )
    new_bpr, _ = anchor_metrics(fitted, wh, anchor_t)
    if new_bpr > bpr:
        return AnchorCheck(bpr, new_bpr, fitted, True, len(wh))
    return AnchorCheck(bpr, new_bpr, current, False, len(wh))


def apply_anchors(model: DetectionModel, anchors_px: np.ndarray) -> None:
    """Set the Detect anchors (pixels [nl * na, 2]) and the config's anchor rows; the smallest anchors go
    to the finest stride (the level order is flipped when the mean areas run against the strides)."""
    anchors_px = np.asarray(anchors_px, np.float32)
    if not (np.isfinite(anchors_px).all() and anchors_px.min() >= MIN_BOX_PX):
        raise ValueError(f"anchors under {MIN_BOX_PX:g} px or not finite: {anchors_px.tolist()}")
    detect = model.detect
    pixels = torch.as_tensor(anchors_px).view(detect.nl, detect.na, 2)
    area = pixels.prod(-1).mean(-1)
    strides = torch.tensor(detect.strides)
    if (area[-1] - area[0]).sign() * (strides[-1] - strides[0]).sign() < 0:
        pixels = pixels.flip(0)
    with torch.no_grad():
        detect.anchors.copy_((pixels / strides.view(-1, 1, 1)).to(detect.anchors))
    model.cfg["anchors"] = [[round(float(v), 2) for v in level.flatten()] for level in pixels]


def autoanchor(
    model: DetectionModel,
    shapes_hw: np.ndarray,
    labels: Sequence[np.ndarray],
    *,
    imgsz: int,
    anchor_t: float,
    seed: int,
    main: bool,
    share: Callable[[Any], Any],
) -> AnchorCheck:
    """Run `check_anchors` on the main rank, hand its result to every rank with `share` (a broadcast from
    rank 0, e.g. of `AnchorCheck.to_vector()`), log it, and put the anchors into the model."""
    result = share(check_anchors(model, shapes_hw, labels, imgsz, anchor_t, seed) if main else None)
    if main:
        log.info(result.line())
    if result.changed:
        apply_anchors(model, result.anchors_px)
    return result
