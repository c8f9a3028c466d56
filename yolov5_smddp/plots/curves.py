"""Precision / recall / F1 against confidence and the precision-recall curve per class at IoU 0.5 (pure),
from the statistics validation gathers (see metrics.match_predictions)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GRID = np.linspace(0.0, 1.0, 1000)  # confidence for P/R/F1, recall for the PR curve


@dataclass(frozen=True)
class Curves:
    """Per class with ground truth (`classes`, ascending), sampled on GRID: `precision`, `recall`, `f1`
    against confidence, `pr` (precision envelope against recall); `ap50` the area under `pr` sampled at
    GRID (trapezoid), shown in the PR legend."""

    classes: np.ndarray  # int [C]
    precision: np.ndarray  # [C, G]
    recall: np.ndarray  # [C, G]
    f1: np.ndarray  # [C, G]
    pr: np.ndarray  # [C, G]
    ap50: np.ndarray  # [C]


def compute_curves(
    correct50: np.ndarray, conf: np.ndarray, pred_cls: np.ndarray, target_cls: np.ndarray
) -> Curves:
    """correct50 bool [N] (true positive at IoU 0.5), conf [N], pred_cls [N] over all detections;
    target_cls [M] one entry per ground-truth box.

    Per class, detections in descending confidence give cumulative precision p_k and recall r_k. Against
    confidence c: recall and precision of the detections with conf >= c (linear between detections;
    recall 0 and precision 1 above the highest confidence). PR: the precision envelope (max precision at
    any recall >= r) sampled at recall r, 0 beyond the highest recall reached.
    """
    order = np.argsort(-conf, kind="mergesort")
    correct50, conf, pred_cls = correct50[order].astype(bool), conf[order], pred_cls[order].astype(np.int64)
    classes, counts = np.unique(target_cls.astype(np.int64), return_counts=True)
    shape = (len(classes), GRID.size)
    precision, recall, pr = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    for ci, (c, n_gt) in enumerate(zip(classes, counts)):
        mine = pred_cls == c
        if not mine.any():
            continue
        tp = np.cumsum(correct50[mine])
        fp = np.cumsum(~correct50[mine])
        r, p = tp / n_gt, tp / (tp + fp)
        recall[ci] = np.interp(-GRID, -conf[mine], r, left=0.0)
        precision[ci] = np.interp(-GRID, -conf[mine], p, left=1.0)
        envelope = np.maximum.accumulate(p[::-1])[::-1]
        idx = np.searchsorted(r, GRID, side="left")  # first detection reaching recall >= GRID value
        pr[ci] = np.where(idx < len(r), envelope[np.minimum(idx, len(r) - 1)], 0.0)
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-16)
    ap50 = np.trapezoid(pr, GRID, axis=1) if hasattr(np, "trapezoid") else np.trapz(pr, GRID, axis=1)
    return Curves(classes, precision, recall, f1, pr, ap50)
