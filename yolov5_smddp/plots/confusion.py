"""The detection confusion matrix (pure): rows = predicted class, columns = true class, plus a background
row (missed objects) and column (detections of nothing), at conf 0.25 / IoU 0.45 as the release's plot."""

from __future__ import annotations

import numpy as np
import torch
from torchvision.ops import box_iou


class ConfusionMatrix:
    """Counts over images; `matrix[pred, true]` int64 [nc + 1, nc + 1], index nc = background."""

    def __init__(self, nc: int, conf: float = 0.25, iou: float = 0.45) -> None:
        self.nc, self.conf, self.iou = nc, conf, iou
        self.matrix = np.zeros((nc + 1, nc + 1), dtype=np.int64)

    def update(self, detections: torch.Tensor, gt_cls: torch.Tensor, gt_boxes: torch.Tensor) -> None:
        """One image: detections [n, 6] (x1, y1, x2, y2, score, class), ground truth classes [m] and boxes
        [m, 4] xyxy in the same pixels. Detections at or below `conf` are ignored. Each ground truth and
        each detection is matched at most once, pairs with IoU > `iou` taken in descending IoU; a matched
        pair counts at [detected class, true class] (off the diagonal when the classes differ)."""
        background = self.nc
        detections = detections[detections[:, 4] > self.conf].float().cpu()
        gt_cls = gt_cls.long().cpu().numpy()
        det_cls = detections[:, 5].long().numpy()
        if len(gt_cls) == 0:
            np.add.at(self.matrix, (det_cls, background), 1)
            return
        if len(det_cls) == 0:
            np.add.at(self.matrix, (background, gt_cls), 1)
            return
        iou = box_iou(gt_boxes.float().cpu(), detections[:, :4]).numpy()  # [m, n]
        gi, di = np.nonzero(iou > self.iou)
        order = np.argsort(-iou[gi, di], kind="stable")
        gt_done, det_done = np.zeros(len(gt_cls), bool), np.zeros(len(det_cls), bool)
        for g, d in zip(gi[order], di[order]):
            if gt_done[g] or det_done[d]:
                continue
            gt_done[g] = det_done[d] = True
            self.matrix[det_cls[d], gt_cls[g]] += 1
        np.add.at(self.matrix, (background, gt_cls[~gt_done]), 1)
        np.add.at(self.matrix, (det_cls[~det_done], background), 1)

    def normalised(self) -> np.ndarray:
        """Each column (true class) divided by its total: float [nc + 1, nc + 1]; empty columns stay 0."""
        totals = self.matrix.sum(0, keepdims=True)
        return self.matrix / np.maximum(totals, 1)
