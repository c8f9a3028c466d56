"""The YOLOv5 training loss: target assignment to anchors and neighbour cells, CIoU box loss,
objectness with IoU targets and per-level balance, BCE classification.

The assignment is vectorised and has a fixed number of candidates per target (levels × anchors × 5
cells), with a mask for the ones that are not assigned, so that no step reads a data-dependent size back
from the device.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from yolov5_smddp.boxes import complete_iou

# Objectness weight per output level (P3, P4, P5): small strides see many more negative cells.
OBJ_BALANCE = {3: (4.0, 1.0, 0.4)}
OBJ_BALANCE_OTHER = (4.0, 1.0, 0.25, 0.06, 0.02)  # the first nl of these for 1, 2, 4 or 5 levels (P6, P7)
NEIGHBOUR_OFFSET = 0.5
# The own cell, then the left, upper, right and lower neighbour (subtracted from the target centre).
CELL_OFFSETS = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]) * NEIGHBOUR_OFFSET

HYP_DEFAULTS = {"label_smoothing": 0.0, "anchor_t": 4.0, "obj_pw": 1.0, "cls_pw": 1.0, "fl_gamma": 0.0}
FOCAL_ALPHA = 0.25


def scale_loss_gains(hyp: dict, nl: int, nc: int, imgsz: int) -> dict:
    """A copy of `hyp` with the box/cls/obj gains rescaled from the reference setting (3 levels, 80
    classes, 640 px): box *= 3/nl, cls *= nc/80 * 3/nl, obj *= (imgsz/640)^2 * 3/nl."""
    scaled = dict(hyp)
    scaled["box"] = hyp["box"] * 3 / nl
    scaled["cls"] = hyp["cls"] * nc / 80 * 3 / nl
    scaled["obj"] = hyp["obj"] * (imgsz / 640) ** 2 * 3 / nl
    return scaled


def _bce(logits: torch.Tensor, target: torch.Tensor, pos_weight: torch.Tensor, gamma: float) -> torch.Tensor:
    """Elementwise BCE-with-logits; with gamma > 0 the focal form (Lin et al. 2017, alpha 0.25)."""
    loss = F.binary_cross_entropy_with_logits(logits, target, pos_weight=pos_weight, reduction="none")
    if gamma > 0:
        prob = logits.sigmoid()
        p_t = target * prob + (1 - target) * (1 - prob)
        alpha_t = target * FOCAL_ALPHA + (1 - target) * (1 - FOCAL_ALPHA)
        loss = loss * alpha_t * (1 - p_t) ** gamma
    return loss


class YoloLoss:
    """`loss, items = criterion(raw_preds, targets)`.

    raw_preds: list of nl tensors [B, na, ny, nx, 5 + nc] (the model's training-mode output).
    targets: [n, 6] rows (image index, class, xc, yc, w, h), normalised to the network input.
    loss: [1] = (box * lbox + obj * lobj + cls * lcls) * B; items: detached [3] = (box, obj, cls) parts.
    `hyp` holds already-scaled gains `box`, `obj`, `cls` and optionally label_smoothing, anchor_t, obj_pw,
    cls_pw, fl_gamma (see HYP_DEFAULTS).
    """

    def __init__(self, model: nn.Module, hyp: dict) -> None:
        detect = model.detect
        hyp = {**HYP_DEFAULTS, **hyp}
        if not 1 <= detect.nl <= len(OBJ_BALANCE_OTHER):
            raise ValueError(f"YoloLoss: no objectness balance for {detect.nl} output levels")
        device = detect.anchors.device
        self.nc, self.na, self.nl = detect.nc, detect.na, detect.nl
        self.anchors = detect.anchors.detach().float()  # [nl, na, 2] grid units
        self.balance = OBJ_BALANCE.get(detect.nl, OBJ_BALANCE_OTHER[: detect.nl])
        self.gains = (float(hyp["box"]), float(hyp["obj"]), float(hyp["cls"]))
        self.anchor_t = float(hyp["anchor_t"])
        self.gamma = float(hyp["fl_gamma"])
        eps = float(hyp["label_smoothing"])
        self.cls_pos, self.cls_neg = 1.0 - 0.5 * eps, 0.5 * eps
        self.obj_pw = torch.tensor([float(hyp["obj_pw"])], device=device)
        self.cls_pw = torch.tensor([float(hyp["cls_pw"])], device=device)
        self.offsets = CELL_OFFSETS.to(device)

    def __call__(self, preds: list[torch.Tensor], targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device = preds[0].device
        if self.anchors.device != device:  # the model moved after the loss was built
            self.anchors, self.offsets = self.anchors.to(device), self.offsets.to(device)
            self.obj_pw, self.cls_pw = self.obj_pw.to(device), self.cls_pw.to(device)
        batch = preds[0].shape[0]
        targets = targets.to(device=device, dtype=torch.float32)
        lbox = torch.zeros(1, device=device)
        lobj = torch.zeros(1, device=device)
        lcls = torch.zeros(1, device=device)
        for level, pred in enumerate(preds):
            _, na, ny, nx, _ = pred.shape
            cand = self._candidates(targets, level, ny, nx)
            valid, b, a, gj, gi = cand["valid"], cand["b"], cand["a"], cand["gj"], cand["gi"]
            count = valid.sum().clamp(min=1)
            picked = pred[b, a, gj, gi].float()  # [m, 5 + nc]
            pxy = picked[:, :2].sigmoid() * 2 - 0.5
            pwh = (picked[:, 2:4].sigmoid() * 2) ** 2 * self.anchors[level][a]
            # our CIoU, not torchvision's: see boxes.complete_iou (NaN-free for collapsed boxes)
            ciou = complete_iou(torch.cat((pxy, pwh), 1), cand["tbox"])
            lbox = lbox + torch.where(valid, 1 - ciou, 0.0).sum() / count

            # objectness target: the detached CIoU of the assigned cells (clamped at 0), 0 elsewhere;
            # unassigned candidates write into one spare slot past the end
            cells = batch * na * ny * nx
            slot = torch.where(valid, ((b * na + a) * ny + gj) * nx + gi, cells)
            tobj = torch.zeros(cells + 1, device=device)
            tobj.index_put_((slot,), ciou.detach().clamp(min=0))
            obj_logits = pred[..., 4].float().reshape(-1)
            lobj = lobj + _bce(obj_logits, tobj[:cells], self.obj_pw, self.gamma).mean() * self.balance[level]

            if self.nc > 1:
                tcls = torch.full_like(picked[:, 5:], self.cls_neg)
                tcls[torch.arange(len(tcls), device=device), cand["cls"]] = self.cls_pos
                per_cand = _bce(picked[:, 5:], tcls, self.cls_pw, self.gamma).sum(1)
                lcls = lcls + torch.where(valid, per_cand, 0.0).sum() / (count * self.nc)

        lbox, lobj, lcls = lbox * self.gains[0], lobj * self.gains[1], lcls * self.gains[2]
        return (lbox + lobj + lcls) * batch, torch.cat((lbox, lobj, lcls)).detach()

    def _candidates(self, targets: torch.Tensor, level: int, ny: int, nx: int) -> dict[str, torch.Tensor]:
        """Every (target, anchor, cell) candidate of one level, ordered cell offset → anchor → target,
        each [m = 5 * na * n]: image index b, anchor a, cell gj/gi (clamped), class, target box tbox
        [m, 4] (x, y relative to the cell, w, h in grid units) and `valid` (the anchor's shape ratio
        is within anchor_t and, for a neighbour, the centre lies in that half of its cell)."""
        n, na = len(targets), self.na
        device = targets.device
        anchors = self.anchors[level]  # [na, 2]
        # grid sizes enter as Python numbers: a tensor made from them would be a host-to-device copy
        gxy = torch.stack((targets[:, 2] * nx, targets[:, 3] * ny), 1)  # [n, 2] grid units
        gwh = torch.stack((targets[:, 4] * nx, targets[:, 5] * ny), 1)
        ratio = gwh[None] / anchors[:, None]  # [na, n, 2]
        shape_ok = torch.max(ratio, 1 / ratio).amax(2) < self.anchor_t  # [na, n]
        frac_low = (gxy % 1 < NEIGHBOUR_OFFSET) & (gxy > 1)  # left / up
        gxy_inv = torch.stack((nx - gxy[:, 0], ny - gxy[:, 1]), 1)
        frac_high = (gxy_inv % 1 < NEIGHBOUR_OFFSET) & (gxy_inv > 1)  # right / down
        own = torch.ones(n, dtype=torch.bool, device=device)
        cell_ok = torch.stack(
            (own, frac_low[:, 0], frac_low[:, 1], frac_high[:, 0], frac_high[:, 1])
        )  # [5, n]
        valid = (cell_ok[:, None, :] & shape_ok[None]).reshape(-1)  # [5 * na * n]

        target_idx = torch.arange(n, device=device).repeat(5 * na)
        anchor_idx = torch.arange(na, device=device)[:, None].expand(na, n).reshape(-1).repeat(5)
        offsets = self.offsets[:, None, :].expand(5, na * n, 2).reshape(-1, 2)  # [m, 2]
        cxy = gxy[target_idx]
        gij = (cxy - offsets).long()
        gi = gij[:, 0].clamp(0, nx - 1)
        gj = gij[:, 1].clamp(0, ny - 1)
        # unassigned candidates get the anchor's own shape so that their (masked) CIoU stays finite
        twh = torch.where(valid[:, None], gwh[target_idx], anchors[anchor_idx])
        tbox = torch.cat((cxy - torch.stack((gi, gj), 1), twh), 1)
        return {
            "valid": valid,
            "b": targets[target_idx, 0].long(),
            "a": anchor_idx,
            "gj": gj,
            "gi": gi,
            "cls": targets[target_idx, 1].long(),
            "tbox": tbox,
        }
