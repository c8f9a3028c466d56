"""Detections from decoded predictions: confidence filtering and class-aware non-maximum suppression."""

from __future__ import annotations

import torch
from torchvision.ops import batched_nms, nms

from yolov5_smddp.detection.boxes import xywh_to_xyxy


def non_max_suppression(
    pred: torch.Tensor,
    conf_thres: float = 0.25,
    iou_thres: float = 0.45,
    classes: list[int] | None = None,
    multi_label: bool = False,
    agnostic: bool = False,
    max_det: int = 300,
    max_nms: int = 30000,
) -> list[torch.Tensor]:
    """pred [B, N, 5 + nc] (xc, yc, w, h in input pixels, objectness, class probabilities), as the
    model returns in eval mode → per image a Tensor[n, 6] of (x1, y1, x2, y2, score, class), best first.

    Candidates need objectness > conf_thres; their score is objectness * class probability and must
    exceed conf_thres too. `multi_label` keeps every class over the threshold as its own candidate
    (only when nc > 1), otherwise the best class. At most `max_nms` top-scoring candidates enter NMS
    (per class unless `agnostic`); at most `max_det` detections are kept per image.
    """
    if not (0 <= conf_thres <= 1 and 0 <= iou_thres <= 1):
        raise ValueError(f"conf_thres {conf_thres} and iou_thres {iou_thres} must lie in [0, 1]")
    nc = pred.shape[2] - 5
    multi_label = multi_label and nc > 1
    wanted = torch.tensor(classes, device=pred.device) if classes is not None else None
    out = []
    for image_pred in pred:
        x = image_pred[image_pred[:, 4] > conf_thres]  # [n, 5 + nc]
        scores = x[:, 5:] * x[:, 4:5]
        box = xywh_to_xyxy(x[:, :4])
        if multi_label:
            row, cls = (scores > conf_thres).nonzero(as_tuple=True)
            det = torch.cat((box[row], scores[row, cls, None], cls[:, None].to(x.dtype)), 1)
        else:
            best, cls = scores.max(1, keepdim=True)
            det = torch.cat((box, best, cls.to(x.dtype)), 1)[best.view(-1) > conf_thres]
        if wanted is not None:
            det = det[(det[:, 5:6] == wanted).any(1)]
        if len(det) > max_nms:
            det = det[det[:, 4].argsort(descending=True)[:max_nms]]
        if agnostic:
            keep = nms(det[:, :4], det[:, 4], iou_thres)
        else:
            keep = batched_nms(det[:, :4], det[:, 4], det[:, 5].long(), iou_thres)
        out.append(det[keep[:max_det]])
    return out
