"""The YOLOv5 training loss: target assignment to anchors and neighbour cells, CIoU box loss,
objectness with IoU targets and per-level balance, BCE classification.

The assignment is vectorised and has a fixed number of candidates per target (levels × anchors × 5
cells), with a mask for the ones that are not assigned, so that no step reads a data-dependent size back
from the device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from yolov5_smddp.detection.boxes import complete_iou

if TYPE_CHECKING:
    from yolov5_smddp.config.hyp import Hyp

# Objectness weight per output level (P3, P4, P5): small strides see many more negative cells.
OBJ_BALANCE = {3: (4.0, 1.0, 0.4)}
OBJ_BALANCE_OTHER = (4.0, 1.0, 0.25, 0.06, 0.02)  # the first nl of these for 1, 2, 4 or 5 levels (P6, P7)
NEIGHBOUR_OFFSET = 0.5
# The own cell, then the left, upper, right and lower neighbour (subtracted from the target centre).
CELL_OFFSETS = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]) * NEIGHBOUR_OFFSET

HYP_DEFAULTS = {"label_smoothing": 0.0, "anchor_t": 4.0, "obj_pw": 1.0, "cls_pw": 1.0, "fl_gamma": 0.0}
FOCAL_ALPHA = 0.25


def scale_loss_gains(hyp: Mapping[str, float], nl: int, nc: int, imgsz: int) -> dict[str, float]:
    """A copy of `hyp` with the box/cls/obj gains rescaled from the reference setting (3 levels, 80
    classes, 640 px): box *= 3/nl, cls *= nc/80 * 3/nl, obj *= (imgsz/640)^2 * 3/nl."""
    scaled = dict(hyp)
    scaled["box"] = hyp["box"] * 3 / nl
    scaled["cls"] = hyp["cls"] * nc / 80 * 3 / nl
    scaled["obj"] = hyp["obj"] * (imgsz / 640) ** 2 * 3 / nl
    return scaled


@dataclass(frozen=True, kw_only=True)
class LossHyp:
    """What the loss reads of the hyperparameters: the box/obj/cls gains, already scaled to the model
    (`scale_loss_gains`), the anchor-multiple threshold, the focal gamma, the BCE positive weights and
    the label smoothing (the optional ones default to HYP_DEFAULTS)."""

    box: float
    obj: float
    cls: float
    anchor_t: float = HYP_DEFAULTS["anchor_t"]
    fl_gamma: float = HYP_DEFAULTS["fl_gamma"]
    obj_pw: float = HYP_DEFAULTS["obj_pw"]
    cls_pw: float = HYP_DEFAULTS["cls_pw"]
    label_smoothing: float = HYP_DEFAULTS["label_smoothing"]

    @classmethod
    def from_mapping(cls, hyp: Mapping[str, float]) -> LossHyp:
        """From a key: value mapping holding scaled gains (other keys are not the loss's: left out): the
        boundary for a reference file's or a test's mapping; the run builds its LossHyp with `for_model`."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: float(v) for k, v in hyp.items() if k in names})

    @classmethod
    def for_model(cls, hyp: Hyp, *, nl: int, nc: int, imgsz: int, label_smoothing: float) -> LossHyp:
        """The run's hyperparameters with the gains scaled to `nl` levels, `nc` classes and `imgsz` px."""
        gains = scale_loss_gains({"box": hyp.box, "obj": hyp.obj, "cls": hyp.cls}, nl, nc, imgsz)
        return cls(
            **gains,
            anchor_t=hyp.anchor_t,
            fl_gamma=hyp.fl_gamma,
            obj_pw=hyp.obj_pw,
            cls_pw=hyp.cls_pw,
            label_smoothing=label_smoothing,
        )


def _bce(logits: torch.Tensor, target: torch.Tensor, pos_weight: torch.Tensor, gamma: float) -> torch.Tensor:
    """Elementwise BCE-with-logits; with gamma > 0 the focal form (Lin et al. 2017, alpha 0.25)."""
    loss = F.binary_cross_entropy_with_logits(logits, target, pos_weight=pos_weight, reduction="none")
    if gamma > 0:
        prob = logits.sigmoid()
        p_t = target * prob + (1 - target) * (1 - prob)
        alpha_t = target * FOCAL_ALPHA + (1 - target) * (1 - FOCAL_ALPHA)
        loss = loss * alpha_t * (1 - p_t) ** gamma
    return loss


def pad_targets(targets: torch.Tensor, capacity: int) -> torch.Tensor:
    """targets [n, 6] → [capacity, 6]: the rows, then padding rows (image index -1, class 0, box 0) that
    the loss never assigns, so that every batch of a run has one target shape (what a captured step
    needs). n must not exceed capacity."""
    if len(targets) > capacity:
        raise ValueError(f"pad_targets: {len(targets)} targets do not fit a capacity of {capacity}")
    padding = targets.new_zeros((capacity - len(targets), 6))
    padding[:, 0] = -1
    return torch.cat((targets, padding))


class _Layout:
    """Per (grids, batch) constants on the device: grid sizes (nx, ny) as float [L, 2] and long [L, 2],
    the first flat objectness cell of each level long [L], the cells per level and in all."""

    def __init__(self, grids: tuple[tuple[int, int], ...], batch: int, na: int, device: torch.device) -> None:
        self.cells = [batch * na * ny * nx for ny, nx in grids]
        self.total = sum(self.cells)
        starts = [sum(self.cells[:level]) for level in range(len(grids))]
        self.size = torch.tensor([[nx, ny] for ny, nx in grids], dtype=torch.float32, device=device)
        self.size_long = self.size.long()
        self.start = torch.tensor(starts, dtype=torch.int64, device=device)


class YoloLoss:
    """`loss, items = criterion(raw_preds, targets)`.

    raw_preds: list of nl tensors [B, na, ny, nx, 5 + nc] (the model's training-mode output).
    targets: [n, 6] rows (image index, class, xc, yc, w, h), normalised to the network input; rows with
    image index -1 are padding (`pad_targets`) and change nothing.
    loss: [1] = (box * lbox + obj * lobj + cls * lcls) * B; items: detached [3] = (box, obj, cls) parts.
    `hyp`: a LossHyp (already-scaled gains `box`, `obj`, `cls`; anchor_t, fl_gamma, obj_pw, cls_pw,
    label_smoothing), or a key: value mapping of them, converted here (missing optional keys: HYP_DEFAULTS).

    All levels are handled at once (one assignment, one CIoU, one objectness BCE, one class BCE over
    every level's candidates): the operator count of a step does not grow with the levels.
    """

    def __init__(self, model: nn.Module, hyp: LossHyp) -> None:
        detect = model.detect
        if not 1 <= detect.nl <= len(OBJ_BALANCE_OTHER):
            raise ValueError(f"YoloLoss: no objectness balance for {detect.nl} output levels")
        device = detect.anchors.device
        self.nc, self.na, self.nl = detect.nc, detect.na, detect.nl
        self.anchors = detect.anchors.detach().float()  # [nl, na, 2] grid units
        self.balance = OBJ_BALANCE.get(detect.nl, OBJ_BALANCE_OTHER[: detect.nl])
        self._balance = torch.tensor(self.balance, device=device)  # [nl], weighting the per-level means
        self.gains = (hyp.box, hyp.obj, hyp.cls)
        self.anchor_t = hyp.anchor_t
        self.gamma = hyp.fl_gamma
        eps = hyp.label_smoothing
        self.cls_pos, self.cls_neg = 1.0 - 0.5 * eps, 0.5 * eps
        self.obj_pw = torch.tensor([hyp.obj_pw], device=device)
        self.cls_pw = torch.tensor([hyp.cls_pw], device=device)
        self.offsets = CELL_OFFSETS.to(device)
        self._layouts: dict[tuple, _Layout] = {}

    def _layout(self, grids: tuple[tuple[int, int], ...], batch: int, device: torch.device) -> _Layout:
        """Built once per input shape (a host-to-device copy then, none on later steps)."""
        key = (grids, batch, device)
        if key not in self._layouts:
            self._layouts[key] = _Layout(grids, batch, self.na, device)
        return self._layouts[key]

    def __call__(self, preds: list[torch.Tensor], targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device = preds[0].device
        if self.anchors.device != device:  # the model moved after the loss was built
            self.anchors, self.offsets = self.anchors.to(device), self.offsets.to(device)
            self.obj_pw, self.cls_pw = self.obj_pw.to(device), self.cls_pw.to(device)
            self._balance = self._balance.to(device)
        batch, na = preds[0].shape[0], self.na
        layout = self._layout(tuple((p.shape[2], p.shape[3]) for p in preds), batch, device)
        targets = targets.to(device=device, dtype=torch.float32)
        cand = self._candidates(targets, layout)
        valid, b, a, gj, gi = cand["valid"], cand["b"], cand["a"], cand["gj"], cand["gi"]  # [L, m] / [m]
        levels = len(preds)
        count = valid.sum(1).clamp(min=1)  # [L]
        picked = torch.cat([pred[b, a, gj[level], gi[level]] for level, pred in enumerate(preds)]).float()
        pxy = picked[:, :2].sigmoid() * 2 - 0.5
        pwh = (picked[:, 2:4].sigmoid() * 2) ** 2 * cand["anchor_wh"].reshape(-1, 2)
        # our CIoU, not torchvision's: see boxes.complete_iou (NaN-free for collapsed boxes)
        ciou = complete_iou(torch.cat((pxy, pwh), 1), cand["tbox"].reshape(-1, 4)).view(levels, -1)
        lbox = (torch.where(valid, 1 - ciou, 0.0).sum(1) / count).sum().reshape(1)

        # objectness target: the detached CIoU of the assigned cells (clamped at 0), 0 elsewhere; every
        # level's cells in one flat vector, unassigned candidates write into one spare slot past the end
        nx, ny = layout.size_long[:, 0:1], layout.size_long[:, 1:2]
        cell = ((b * na + a) * ny + gj) * nx + gi + layout.start[:, None]
        slot = torch.where(valid, cell, layout.total)
        tobj = torch.zeros(layout.total + 1, device=device)
        tobj.index_put_((slot.reshape(-1),), ciou.detach().clamp(min=0).reshape(-1))
        obj_logits = torch.cat([pred[..., 4].float().reshape(-1) for pred in preds])
        obj_bce = _bce(obj_logits, tobj[: layout.total], self.obj_pw, self.gamma)
        level_means = torch.stack([part.mean() for part in obj_bce.split(layout.cells)])
        lobj = (level_means * self._balance[:levels]).sum().reshape(1)

        if self.nc > 1:
            tcls = torch.full_like(picked[:, 5:], self.cls_neg)
            tcls[torch.arange(len(tcls), device=device), cand["cls"].repeat(levels)] = self.cls_pos
            per_cand = _bce(picked[:, 5:], tcls, self.cls_pw, self.gamma).sum(1).view(levels, -1)
            lcls = (torch.where(valid, per_cand, 0.0).sum(1) / (count * self.nc)).sum().reshape(1)
        else:
            lcls = torch.zeros(1, device=device)

        lbox, lobj, lcls = lbox * self.gains[0], lobj * self.gains[1], lcls * self.gains[2]
        return (lbox + lobj + lcls) * batch, torch.cat((lbox, lobj, lcls)).detach()

    def _candidates(self, targets: torch.Tensor, layout: _Layout) -> dict[str, torch.Tensor]:
        """Every (level, target, anchor, cell) candidate, per level ordered cell offset → anchor → target
        (m = 5 * na * n per level): image index b [m], anchor a [m], class [m], and per level [L, m]
        the cell gj/gi (clamped), the target box tbox [L, m, 4] (x, y relative to the cell, w, h in grid
        units), the anchor's shape anchor_wh [L, m, 2] and `valid` (a real target, the anchor's shape
        ratio within anchor_t and, for a neighbour, the centre in that half of its cell)."""
        n, na, levels = len(targets), self.na, len(layout.cells)
        device = targets.device
        anchors = self.anchors[:levels]  # [L, na, 2]
        size = layout.size[:, None]  # [L, 1, 2] (nx, ny)
        gxy = targets[None, :, 2:4] * size  # [L, n, 2] grid units
        gwh = targets[None, :, 4:6] * size
        ratio = gwh[:, None] / anchors[:, :, None]  # [L, na, n, 2]
        shape_ok = torch.max(ratio, 1 / ratio).amax(3) < self.anchor_t  # [L, na, n]
        frac_low = (gxy % 1 < NEIGHBOUR_OFFSET) & (gxy > 1)  # left / up
        gxy_inv = size - gxy
        frac_high = (gxy_inv % 1 < NEIGHBOUR_OFFSET) & (gxy_inv > 1)  # right / down
        real = (targets[:, 0] >= 0)[None].expand(levels, n)  # padding rows are never assigned
        cell_ok = (
            torch.stack((real, frac_low[..., 0], frac_low[..., 1], frac_high[..., 0], frac_high[..., 1]), 1)
            & real[:, None]
        )  # [L, 5, n]
        valid = (cell_ok[:, :, None, :] & shape_ok[:, None]).reshape(levels, -1)  # [L, 5 * na * n]

        target_idx = torch.arange(n, device=device).repeat(5 * na)
        anchor_idx = torch.arange(na, device=device)[:, None].expand(na, n).reshape(-1).repeat(5)
        offsets = self.offsets[:, None, :].expand(5, na * n, 2).reshape(-1, 2)  # [m, 2]
        cxy = gxy[:, target_idx]  # [L, m, 2]
        gij = torch.minimum((cxy - offsets).long().clamp(min=0), layout.size_long[:, None] - 1)
        anchor_wh = anchors[:, anchor_idx]  # [L, m, 2]
        # unassigned candidates get the anchor's own shape so that their (masked) CIoU stays finite
        twh = torch.where(valid[..., None], gwh[:, target_idx], anchor_wh)
        tbox = torch.cat((cxy - gij, twh), 2)
        rows = targets[target_idx]
        return {
            "valid": valid,
            "b": rows[:, 0].long().clamp(min=0),
            "a": anchor_idx,
            "gj": gij[..., 1],
            "gi": gij[..., 0],
            "cls": rows[:, 1].long(),
            "tbox": tbox,
            "anchor_wh": anchor_wh,
        }
