"""Detection metrics, COCO-style: per-IoU-threshold matching, 101-point interpolated AP per class,
precision and recall at the confidence of best mean F1, the fitness used to pick "best" weights, and the
per-class table (class / images / instances / P / R / mAP50 / mAP50-95).

Box format everywhere here: xyxy pixels. AP is averaged over the classes that have ground truth
(as COCOeval does); a class with ground truth and no detection scores 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torchvision.ops import box_iou

IOU_THRESHOLDS = torch.linspace(0.5, 0.95, 10)  # [T]
RECALL_POINTS = np.linspace(0.0, 1.0, 101)  # COCO's recThrs


def fitness(map50: float, map50_95: float) -> float:
    """The scalar that ranks checkpoints: 0.1 * mAP50 + 0.9 * mAP50-95."""
    return 0.1 * map50 + 0.9 * map50_95


def match_predictions(
    pred_boxes: torch.Tensor,
    pred_conf: torch.Tensor,
    pred_cls: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_cls: torch.Tensor,
    iou_thresholds: torch.Tensor = IOU_THRESHOLDS,
) -> torch.Tensor:
    """Which predictions are true positives at each IoU threshold.

    pred_boxes (Tensor[N, 4]) and gt_boxes (Tensor[M, 4]) in xyxy; pred_conf [N], pred_cls [N], gt_cls [M].
    Greedy one-to-one, per threshold: predictions in descending confidence each take the still-unmatched
    ground truth of the same class with the highest IoU >= threshold (COCOeval's rule; ranking pairs by
    IoU alone can hand a ground truth to a low-confidence duplicate and disagrees with pycocotools).
    Returns correct (BoolTensor[N, T]).
    """
    n, t = pred_boxes.shape[0], iou_thresholds.numel()
    correct = np.zeros((n, t), dtype=bool)
    if n == 0 or gt_boxes.shape[0] == 0:
        return torch.from_numpy(correct)
    iou = box_iou(pred_boxes.float(), gt_boxes.float())  # [N, M]
    iou_np = (iou * (pred_cls.view(-1, 1) == gt_cls.view(1, -1))).cpu().numpy()
    thresholds = iou_thresholds.cpu().numpy()[:, None]  # [T, 1]
    candidates = np.nonzero((iou_np >= thresholds[0, 0]).any(1))[0]
    candidates = candidates[np.argsort(-pred_conf.cpu().numpy()[candidates], kind="mergesort")]
    gt_used = np.zeros((t, gt_boxes.shape[0]), dtype=bool)
    levels = np.arange(t)
    for p in candidates:
        ok = (iou_np[p][None, :] >= thresholds) & ~gt_used  # [T, M]
        best_gt = np.where(ok, iou_np[p][None, :], -1.0).argmax(1)  # [T]
        hit = ok.any(1)
        gt_used[levels[hit], best_gt[hit]] = True
        correct[p] = hit
    return torch.from_numpy(correct)


def crowd_ignored(
    pred_boxes: torch.Tensor,
    pred_cls: torch.Tensor,
    correct: torch.Tensor,
    crowd_boxes: torch.Tensor,
    crowd_cls: torch.Tensor,
    iou_thresholds: torch.Tensor = IOU_THRESHOLDS,
) -> torch.Tensor:
    """Which predictions pycocotools ignores at each IoU threshold because of crowd regions.

    COCOeval matches a detection to a crowd region (`iscrowd: 1`) only when no ordinary ground truth is
    left for it at that threshold, using intersection / detection area as the overlap, and a crowd
    region may absorb any number of detections. Such detections count as neither true nor false
    positives. correct (BoolTensor[N, T]) from `match_predictions`; crowd_boxes [K, 4] xyxy, crowd_cls
    [K]. Returns ignored (BoolTensor[N, T]).
    """
    n, t = pred_boxes.shape[0], iou_thresholds.numel()
    if n == 0 or crowd_boxes.shape[0] == 0:
        return torch.zeros((n, t), dtype=torch.bool)
    p, c = pred_boxes.float().cpu(), crowd_boxes.float().cpu()
    wh = (torch.min(p[:, None, 2:], c[None, :, 2:]) - torch.max(p[:, None, :2], c[None, :, :2])).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]  # [N, K]
    area = ((p[:, 2] - p[:, 0]) * (p[:, 3] - p[:, 1]))[:, None]
    ioa = torch.where(area > 0, inter / area.clamp(min=1e-12), torch.zeros_like(inter))
    ioa = ioa * (pred_cls.cpu().view(-1, 1) == crowd_cls.cpu().view(1, -1))
    best = ioa.max(1).values  # [N]
    return (best[:, None] >= iou_thresholds.cpu()[None, :]) & ~correct.cpu()


def _interpolated_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    """COCO's 101-point AP from cumulative recall/precision [K] in descending-confidence order."""
    envelope = np.maximum.accumulate(precision[::-1])[::-1]
    idx = np.searchsorted(recall, RECALL_POINTS, side="left")
    sampled = np.where(idx < len(envelope), envelope[np.minimum(idx, len(envelope) - 1)], 0.0)
    return float(sampled.mean())


@dataclass
class DetectionMetrics:
    """Validation summary. Means are over classes with ground truth; `per_class_*` keyed by class id
    (the classes with ground truth): AP, P and R at the confidence of best MEAN F1 (`best_conf`, one
    confidence for every class, so the means of the per-class P and R are `precision` and `recall`),
    instances (ground-truth boxes) and images (images holding at least one box of the class)."""

    precision: float
    recall: float
    map50: float
    map50_95: float
    best_conf: float
    per_class_ap50: dict[int, float] = field(default_factory=dict)
    per_class_ap50_95: dict[int, float] = field(default_factory=dict)
    num_images: int = 0
    num_targets: int = 0
    per_class_precision: dict[int, float] = field(default_factory=dict)
    per_class_recall: dict[int, float] = field(default_factory=dict)
    per_class_instances: dict[int, int] = field(default_factory=dict)
    per_class_images: dict[int, int] = field(default_factory=dict)

    @property
    def fitness(self) -> float:
        return fitness(self.map50, self.map50_95)

    def to_dict(self) -> dict[str, float]:
        return {
            "precision": self.precision,
            "recall": self.recall,
            "mAP50": self.map50,
            "mAP50-95": self.map50_95,
            "fitness": self.fitness,
        }

    def per_class(self, names: Sequence[str]) -> list[dict[str, Any]]:
        """One JSON-able row per class with ground truth, by class id: class, name, images, instances,
        precision, recall, mAP50, mAP50-95 (`names[class]`, or the id as text when `names` is short)."""
        return [
            {
                "class": c,
                "name": str(names[c]) if 0 <= c < len(names) else str(c),
                "images": self.per_class_images.get(c, 0),
                "instances": self.per_class_instances.get(c, 0),
                "precision": self.per_class_precision.get(c, 0.0),
                "recall": self.per_class_recall.get(c, 0.0),
                "mAP50": ap50,
                "mAP50-95": self.per_class_ap50_95[c],
            }
            for c, ap50 in sorted(self.per_class_ap50.items())
        ]


TABLE_HEADER = ("Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95")


def results_table(metrics: DetectionMetrics, names: Sequence[str], *, per_class: bool = True) -> str:
    """The release's results table: a header, the row "all" (images scored, boxes, mean P/R, mAP50,
    mAP50-95) and, with `per_class` and more than one class name, one row per class with ground truth
    (its images = images holding the class, instances = its boxes). Lines joined by newlines."""
    width = max([len(TABLE_HEADER[0]), len("all"), *(len(str(n)) for n in names)]) + 2

    def line(name: str, images: int, instances: int, p: float, r: float, ap50: float, ap: float) -> str:
        numbers = f"{images:>11d}{instances:>11d}" + "".join(f"{v:>11.3g}" for v in (p, r, ap50, ap))
        return f"{name:>{width}}{numbers}"

    rows = [
        f"{TABLE_HEADER[0]:>{width}}" + "".join(f"{h:>11}" for h in TABLE_HEADER[1:]),
        line(
            "all",
            metrics.num_images,
            metrics.num_targets,
            metrics.precision,
            metrics.recall,
            metrics.map50,
            metrics.map50_95,
        ),
    ]
    if per_class and len(names) > 1:
        for row in metrics.per_class(names):
            rows.append(
                line(
                    row["name"],
                    row["images"],
                    row["instances"],
                    row["precision"],
                    row["recall"],
                    row["mAP50"],
                    row["mAP50-95"],
                )
            )
    return "\n".join(rows)


def ap_per_class(
    correct: np.ndarray,
    conf: np.ndarray,
    pred_cls: np.ndarray,
    target_cls: np.ndarray,
    target_first: np.ndarray | None = None,
    ignored: np.ndarray | None = None,
) -> DetectionMetrics:
    """AP per class and IoU threshold, and P/R at the best mean-F1 confidence (overall and per class).

    correct (bool[N, T]) from match_predictions over all images; conf [N]; pred_cls [N]; target_cls [M]
    (one entry per ground-truth box); target_first (bool[M], optional) marks each box that is the first
    of its class in its image, so that the per-class image counts are sums of it (none without it);
    ignored (bool[N, T], optional) from `crowd_ignored`: those predictions count neither as true nor as
    false positives at that threshold.
    """
    order = np.argsort(-conf, kind="mergesort")
    correct, conf, pred_cls = correct[order], conf[order], pred_cls[order]
    counted = np.ones_like(correct, dtype=bool) if ignored is None else ~ignored[order]
    classes, gt_counts = np.unique(target_cls.astype(np.int64), return_counts=True)
    t = correct.shape[1] if correct.ndim == 2 else IOU_THRESHOLDS.numel()
    ap = np.zeros((len(classes), t))
    grid = np.linspace(0.0, 1.0, 1000)  # confidence grid for the P/R/F1 curves
    p_curve = np.zeros((len(classes), grid.size))
    r_curve = np.zeros((len(classes), grid.size))
    for ci, (c, n_gt) in enumerate(zip(classes, gt_counts)):
        mine = pred_cls.astype(np.int64) == c
        if not mine.any():
            continue
        tp = np.cumsum(correct[mine] & counted[mine], axis=0)
        fp = np.cumsum(~correct[mine] & counted[mine], axis=0)
        recall = tp / n_gt
        precision = tp / np.maximum(tp + fp, 1)  # 0 before the first counted prediction, as COCOeval
        for k in range(t):
            ap[ci, k] = _interpolated_ap(recall[:, k], precision[:, k])
        # curves vs confidence at IoU 0.5 (np.interp needs increasing x: use -conf)
        r_curve[ci] = np.interp(-grid, -conf[mine], recall[:, 0], left=0.0)
        p_curve[ci] = np.interp(-grid, -conf[mine], precision[:, 0], left=1.0)
    if len(classes) == 0:
        return DetectionMetrics(0.0, 0.0, 0.0, 0.0, 0.0)
    f1 = 2 * p_curve * r_curve / np.maximum(p_curve + r_curve, 1e-16)
    best = int(f1.mean(0).argmax())
    images = {}
    if target_first is not None:
        first_cls = target_cls.astype(np.int64)[np.asarray(target_first, dtype=bool)]
        images = {int(c): int((first_cls == c).sum()) for c in classes}
    return DetectionMetrics(
        precision=float(p_curve[:, best].mean()),
        recall=float(r_curve[:, best].mean()),
        map50=float(ap[:, 0].mean()),
        map50_95=float(ap.mean()),
        best_conf=float(grid[best]),
        per_class_ap50={int(c): float(a) for c, a in zip(classes, ap[:, 0])},
        per_class_ap50_95={int(c): float(a) for c, a in zip(classes, ap.mean(1))},
        num_targets=int(len(target_cls)),
        per_class_precision={int(c): float(p) for c, p in zip(classes, p_curve[:, best])},
        per_class_recall={int(c): float(r) for c, r in zip(classes, r_curve[:, best])},
        per_class_instances={int(c): int(n) for c, n in zip(classes, gt_counts)},
        per_class_images=images,
    )


def first_of_class(gt_cls: np.ndarray) -> np.ndarray:
    """bool [m]: each box of one image that is the first of its class in that image."""
    gt_cls = np.asarray(gt_cls).astype(np.int64).reshape(-1)
    first = np.zeros(gt_cls.shape, dtype=bool)
    first[np.unique(gt_cls, return_index=True)[1]] = True
    return first


class MetricAccumulator:
    """Collects per-image matches; `compute()` gives the DetectionMetrics over everything seen."""

    def __init__(self, iou_thresholds: torch.Tensor = IOU_THRESHOLDS) -> None:
        self.iou_thresholds = iou_thresholds
        self._correct: list[np.ndarray] = []
        self._conf: list[np.ndarray] = []
        self._pred_cls: list[np.ndarray] = []
        self._target_cls: list[np.ndarray] = []
        self._target_first: list[np.ndarray] = []
        self._ignored: list[np.ndarray] = []
        self.num_images = 0

    def update(
        self,
        detections: torch.Tensor,
        gt_boxes: torch.Tensor,
        gt_cls: torch.Tensor,
        crowd_boxes: torch.Tensor | None = None,
        crowd_cls: torch.Tensor | None = None,
    ) -> None:
        """detections (Tensor[n, 6]) rows (x1, y1, x2, y2, conf, cls); gt_boxes [m, 4] xyxy; gt_cls [m];
        crowd regions (COCO `iscrowd: 1`) crowd_boxes [k, 4] xyxy, crowd_cls [k] (see `crowd_ignored`)."""
        detections = detections.detach().float().cpu()
        correct = match_predictions(
            detections[:, :4],
            detections[:, 4],
            detections[:, 5],
            gt_boxes.cpu(),
            gt_cls.cpu(),
            self.iou_thresholds,
        )
        self._correct.append(correct.numpy())
        if crowd_boxes is not None and crowd_cls is not None:
            ignored = crowd_ignored(
                detections[:, :4], detections[:, 5], correct, crowd_boxes, crowd_cls, self.iou_thresholds
            )
        else:
            ignored = torch.zeros_like(correct)
        self._ignored.append(ignored.numpy())
        self._conf.append(detections[:, 4].numpy())
        self._pred_cls.append(detections[:, 5].numpy())
        self._target_cls.append(gt_cls.cpu().numpy())
        self._target_first.append(first_of_class(self._target_cls[-1]))
        self.num_images += 1

    def state(self) -> dict[str, np.ndarray]:
        """The concatenated statistics (for gathering across ranks)."""
        t = self.iou_thresholds.numel()
        return {
            "correct": np.concatenate(self._correct) if self._correct else np.zeros((0, t), bool),
            "conf": np.concatenate(self._conf) if self._conf else np.zeros(0),
            "pred_cls": np.concatenate(self._pred_cls) if self._pred_cls else np.zeros(0),
            "target_cls": np.concatenate(self._target_cls) if self._target_cls else np.zeros(0),
            "target_first": np.concatenate(self._target_first) if self._target_first else np.zeros(0, bool),
            "ignored": np.concatenate(self._ignored) if self._ignored else np.zeros((0, t), bool),
        }

    def compute(self) -> DetectionMetrics:
        return metrics_from_state(self.state(), self.num_images)


def pack_state(state: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """A MetricAccumulator state as two float32 tensors for gathering: predictions [N, T + 2] (per
    threshold 0 false positive, 1 true positive, 2 ignored (crowd); conf; pred cls) and targets [M, 2]
    (target cls, first-of-its-class-in-its-image flag as 0/1). Exact: conf is float32 already, classes and
    flags are small integers."""
    flags = np.asarray(state["correct"], dtype=np.float32)
    if "ignored" in state:
        flags = np.where(state["ignored"], 2.0, flags).astype(np.float32)
    correct = torch.from_numpy(np.ascontiguousarray(flags))
    conf = torch.from_numpy(np.asarray(state["conf"], dtype=np.float32)).view(-1, 1)
    pred_cls = torch.from_numpy(np.asarray(state["pred_cls"], dtype=np.float32)).view(-1, 1)
    target_cls = torch.from_numpy(np.asarray(state["target_cls"], dtype=np.float32)).view(-1, 1)
    first = torch.from_numpy(np.asarray(state["target_first"], dtype=np.float32)).view(-1, 1)
    return torch.cat([correct, conf, pred_cls], 1), torch.cat([target_cls, first], 1)


def unpack_states(predictions: list[torch.Tensor], targets: list[torch.Tensor]) -> dict[str, np.ndarray]:
    """The inverse of `pack_state` over several parts (ranks), concatenated in the given order."""
    rows = torch.cat(predictions).numpy() if predictions else np.zeros((0, IOU_THRESHOLDS.numel() + 2))
    target_rows = torch.cat(targets).numpy().reshape(-1, 2) if targets else np.zeros((0, 2), np.float32)
    return {
        "correct": (rows[:, :-2] > 0.5) & (rows[:, :-2] < 1.5),
        "ignored": rows[:, :-2] > 1.5,
        "conf": rows[:, -2].astype(np.float32),
        "pred_cls": rows[:, -1].astype(np.float32),
        "target_cls": target_rows[:, 0].astype(np.float32),
        "target_first": target_rows[:, 1] > 0.5,
    }


def metrics_from_state(state: dict[str, np.ndarray], num_images: int) -> DetectionMetrics:
    """DetectionMetrics of a (gathered) MetricAccumulator state over `num_images` images."""
    result = ap_per_class(
        state["correct"],
        state["conf"],
        state["pred_cls"],
        state["target_cls"],
        state.get("target_first"),
        state.get("ignored"),
    )
    result.num_images = num_images
    return result
