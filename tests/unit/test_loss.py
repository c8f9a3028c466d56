"""The training loss: equality with the release's numbers on the fixture, edge cases, gradients."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from yolov5_smddp.detection.boxes import complete_iou, xywh_to_xyxy
from yolov5_smddp.detection.loss import LossHyp, YoloLoss, _Layout, pad_targets, scale_loss_gains
from yolov5_smddp.models.yolo import build_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HYP = {"box": 0.05, "obj": 1.0, "cls": 0.5, "anchor_t": 4.0}


@pytest.fixture(scope="module")
def reference() -> dict:
    return torch.load(FIXTURES / "yolov5n_nc80_reference.pt", weights_only=True)


@pytest.fixture(scope="module")
def model_n3():
    torch.manual_seed(0)
    return build_model("yolov5n", nc=3).train()


def _raw(model, batch=2, h=64, w=96, seed=0):
    torch.manual_seed(seed)
    return model(torch.rand(batch, 3, h, w))


def test_loss_matches_reference(reference):
    model = build_model("yolov5n")
    criterion = YoloLoss(model, LossHyp.from_mapping(reference["hyp"]))
    loss, items = criterion([r.clone() for r in reference["train_raw"]], reference["targets"])
    assert loss.shape == (1,) and items.shape == (3,)
    ref_total, ref_items = reference["loss_total"], reference["loss_items_box_obj_cls"]
    assert ((loss - ref_total).abs() / ref_total.abs()).item() < 1e-5
    assert ((items - ref_items).abs().max() / ref_items.abs().max()).item() < 1e-5
    assert (items - ref_items).abs().div(ref_items.abs()).max().item() < 1e-5


def test_complete_iou_agrees_with_torchvision_on_regular_boxes():
    from torchvision.ops import complete_box_iou_loss

    torch.manual_seed(0)
    pred = torch.cat((torch.rand(200, 2) * 4, torch.rand(200, 2) * 3 + 0.05), 1)
    target = torch.cat((torch.rand(200, 2) * 4, torch.rand(200, 2) * 3 + 0.05), 1)
    ours = complete_iou(pred, target)
    theirs = 1 - complete_box_iou_loss(xywh_to_xyxy(pred), xywh_to_xyxy(target), reduction="none")
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    same = complete_iou(target, target)
    torch.testing.assert_close(same, torch.ones(200), rtol=0, atol=1e-4)  # eps / area for the smallest
    collapsed = complete_iou(torch.tensor([[1.0, 1.0, 0.0, 0.0]]), torch.tensor([[1.0, 1.0, 2.0, 2.0]]))
    assert torch.isfinite(collapsed).all() and collapsed.item() < 0


def test_scale_loss_gains_exact():
    hyp = {"box": 0.05, "obj": 1.0, "cls": 0.5, "lr0": 0.01}
    scaled = scale_loss_gains(hyp, nl=3, nc=80, imgsz=224)
    assert scaled == pytest.approx({"box": 0.05, "obj": (224 / 640) ** 2, "cls": 0.5, "lr0": 0.01})
    scaled = scale_loss_gains(hyp, nl=4, nc=20, imgsz=1280)
    assert scaled["box"] == pytest.approx(0.0375)
    assert scaled["cls"] == pytest.approx(0.5 * 20 / 80 * 0.75)
    assert scaled["obj"] == pytest.approx(4 * 0.75)
    assert hyp["obj"] == 1.0  # the input is not modified


def test_no_targets_gives_zero_box_and_class_loss(model_n3):
    raw = _raw(model_n3)
    loss, items = YoloLoss(model_n3, LossHyp.from_mapping(HYP))(raw, torch.zeros(0, 6))
    assert items[0].item() == 0.0 and items[2].item() == 0.0
    assert math.isfinite(items[1].item()) and items[1].item() > 0
    assert loss.item() == pytest.approx(items.sum().item() * 2)
    loss.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model_n3.parameters())
    model_n3.zero_grad()


def test_edge_targets_give_finite_loss_and_gradients(model_n3):
    raw = _raw(model_n3)
    targets = torch.tensor(
        [
            [0, 0, 0.0, 0.0, 0.1, 0.1],  # centre on the top-left corner
            [0, 1, 1.0, 1.0, 0.2, 0.3],  # centre on the bottom-right corner
            [1, 2, 0.5, 0.5, 1.0, 1.0],  # the whole image
            [1, 0, 0.3, 0.7, 1e-4, 1e-4],  # far below every anchor: matched nowhere
            [1, 2, 0.99, 0.01, 0.05, 0.02],
        ]
    )
    loss, items = YoloLoss(model_n3, LossHyp.from_mapping(HYP))(raw, targets)
    assert torch.isfinite(loss).all() and (items > 0).all()
    loss.backward()
    grads = [p.grad for p in model_n3.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    model_n3.zero_grad()


def test_unmatched_target_contributes_nothing(model_n3):
    raw = [r.detach() for r in _raw(model_n3)]
    criterion = YoloLoss(model_n3, LossHyp.from_mapping(HYP))
    base = torch.tensor([[0, 1, 0.4, 0.6, 0.2, 0.25]])
    tiny = torch.tensor([[1, 0, 0.3, 0.7, 1e-4, 1e-4]])
    _, with_tiny = criterion(raw, torch.cat((base, tiny)))
    _, without = criterion(raw, base)
    torch.testing.assert_close(with_tiny, without, rtol=1e-6, atol=0)


def test_collapsed_predicted_boxes_stay_finite(model_n3):
    raw = [r.detach().clone() for r in _raw(model_n3)]
    for r in raw:
        r[..., 2:4] = -200.0  # sigmoid underflows to 0: zero-size predicted boxes
        r.requires_grad_(True)
    loss, items = YoloLoss(model_n3, LossHyp.from_mapping(HYP))(
        raw, torch.tensor([[0, 1, 0.5, 0.5, 0.2, 0.2]])
    )
    loss.backward()
    assert torch.isfinite(items).all() and items[0] > 0
    assert all(torch.isfinite(r.grad).all() for r in raw)


def test_single_class_has_no_class_loss():
    model = build_model("yolov5n", nc=1).train()
    raw = _raw(model)
    loss, items = YoloLoss(model, LossHyp.from_mapping(HYP))(raw, torch.tensor([[0, 0, 0.5, 0.5, 0.3, 0.3]]))
    assert items[2].item() == 0.0 and items[0].item() > 0
    loss.backward()
    assert torch.isfinite(model.detect.m[0].weight.grad).all()


def test_label_smoothing_and_focal_change_only_what_they_should(model_n3):
    raw = [r.detach() for r in _raw(model_n3)]
    targets = torch.tensor([[0, 1, 0.4, 0.6, 0.2, 0.25], [1, 2, 0.7, 0.3, 0.1, 0.4]])
    _, plain = YoloLoss(model_n3, LossHyp.from_mapping(HYP))(raw, targets)
    _, smooth = YoloLoss(model_n3, LossHyp.from_mapping({**HYP, "label_smoothing": 0.1}))(raw, targets)
    assert smooth[0] == plain[0] and smooth[1] == plain[1] and smooth[2] != plain[2]
    _, focal = YoloLoss(model_n3, LossHyp.from_mapping({**HYP, "fl_gamma": 1.5}))(raw, targets)
    assert focal[0] == plain[0] and (focal[1:] < plain[1:]).all()


def test_assignment_uses_neighbour_cells(model_n3):
    """A target in the lower-left quarter of a cell is assigned to its own cell, the left and the lower
    neighbour, for every anchor whose shape ratio is within anchor_t."""
    criterion = YoloLoss(model_n3, LossHyp.from_mapping(HYP))
    # level 0 of a 64×96 input is an 8×12 grid; centre at grid (5.3, 2.8), size 1.2×1.6 cells
    target = torch.tensor([[0, 1, 5.3 / 12, 2.8 / 8, 1.2 / 12, 1.6 / 8]])
    cand = _level_candidates(criterion, target, ((8, 12), (4, 6), (2, 3)), 0)
    picked = zip(cand["valid"].tolist(), cand["a"].tolist(), cand["gj"].tolist(), cand["gi"].tolist())
    cells = {(a, j, i) for v, a, j, i in picked if v}
    anchors = criterion.anchors[0]  # (1.25, 1.625), (2, 3.75), (4.125, 2.875) cells
    ratio = torch.tensor([1.2, 1.6]) / anchors
    matched = [a for a in range(3) if torch.max(ratio[a], 1 / ratio[a]).max() < 4]
    assert matched == [0, 1, 2]
    assert cells == {(a, j, i) for a in matched for j, i in ((2, 5), (2, 4), (3, 5))}


def _level_candidates(criterion, targets, grids, level):
    """The candidates of one level: (valid, a, gj, gi) lists, in the loss's order."""
    cand = criterion._candidates(targets, _Layout(grids, 1, criterion.na, targets.device))
    return {"valid": cand["valid"][level], "a": cand["a"], "gj": cand["gj"][level], "gi": cand["gi"][level]}


def _assignment_by_rules(targets: torch.Tensor, anchors: torch.Tensor, ny: int, nx: int) -> list[tuple]:
    """The assignment rules written out one target at a time: (target, anchor, gj, gi) per candidate."""
    out = []
    for t, (_, _, x, y, w, h) in enumerate(targets.tolist()):
        gx, gy, gw, gh = x * nx, y * ny, w * nx, h * ny
        cells = [(0.0, 0.0)]
        if gx % 1 < 0.5 and gx > 1:
            cells.append((0.5, 0.0))
        if gy % 1 < 0.5 and gy > 1:
            cells.append((0.0, 0.5))
        if (nx - gx) % 1 < 0.5 and nx - gx > 1:
            cells.append((-0.5, 0.0))
        if (ny - gy) % 1 < 0.5 and ny - gy > 1:
            cells.append((0.0, -0.5))
        for a, (aw, ah) in enumerate(anchors.tolist()):
            if max(gw / aw, aw / gw, gh / ah, ah / gh) >= 4.0:
                continue
            for ox, oy in cells:
                gi = min(max(int(gx - ox), 0), nx - 1)
                gj = min(max(int(gy - oy), 0), ny - 1)
                out.append((t, a, gj, gi))
    return sorted(out)


def test_vectorised_assignment_equals_the_rules_on_random_targets(model_n3):
    criterion = YoloLoss(model_n3, LossHyp.from_mapping(HYP))
    torch.manual_seed(1)
    n = 60
    xy = torch.rand(n, 2)
    xy[:5] = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.5, 0.5], [0.999, 0.001], [0.0625, 0.9375]])
    targets = torch.cat(
        (torch.zeros(n, 1), torch.randint(0, 3, (n, 1)).float(), xy, torch.rand(n, 2) * 0.6 + 0.01), 1
    )
    grids = ((8, 12), (4, 6), (2, 3))
    for level, (ny, nx) in enumerate(grids):
        cand = _level_candidates(criterion, targets, grids, level)
        got = sorted(
            (t, a, j, i)
            for t, a, j, i, v in zip(
                (torch.arange(len(cand["valid"])) % n).tolist(),
                cand["a"].tolist(),
                cand["gj"].tolist(),
                cand["gi"].tolist(),
                cand["valid"].tolist(),
            )
            if v
        )
        assert got == _assignment_by_rules(targets, criterion.anchors[level], ny, nx)


def _reference_loss(model, preds, targets, gains):
    """The loss written out level by level and candidate by candidate (no vectorisation, no padding),
    from `_assignment_by_rules`: the arithmetic the one-pass loss must reproduce. Needs targets that share
    no (anchor, cell) within a level (then the objectness target of a cell has one writer)."""
    lbox, lobj, lcls = torch.zeros(1), torch.zeros(1), torch.zeros(1)
    anchors = model.detect.anchors.float()
    for level, pred in enumerate(preds):
        batch, _, ny, nx, _ = pred.shape
        tobj = torch.zeros(pred.shape[:4])
        cands = _assignment_by_rules(targets, anchors[level], ny, nx)
        if cands:
            t, a, gj, gi = (list(col) for col in zip(*cands))
            rows = targets[t]
            b = rows[:, 0].long()
            picked = pred[b, a, gj, gi].float()
            pxy = picked[:, :2].sigmoid() * 2 - 0.5
            pwh = (picked[:, 2:4].sigmoid() * 2) ** 2 * anchors[level][a]
            gxy = rows[:, 2:4] * torch.tensor([nx, ny])
            tbox = torch.cat((gxy - torch.tensor([gi, gj]).T, rows[:, 4:6] * torch.tensor([nx, ny])), 1)
            ciou = complete_iou(torch.cat((pxy, pwh), 1), tbox)
            lbox = lbox + (1 - ciou).mean()
            tobj[b, a, gj, gi] = ciou.detach().clamp(min=0)
            tcls = torch.zeros_like(picked[:, 5:])
            tcls[range(len(t)), rows[:, 1].long()] = 1.0
            lcls = lcls + torch.nn.functional.binary_cross_entropy_with_logits(picked[:, 5:], tcls)
        obj = torch.nn.functional.binary_cross_entropy_with_logits(pred[..., 4].float(), tobj)
        lobj = lobj + obj * (4.0, 1.0, 0.4)[level]
    return (lbox * gains["box"] + lobj * gains["obj"] + lcls * gains["cls"]) * batch


# far apart: no two targets share an (anchor, cell) on any level
SPREAD_TARGETS = torch.tensor(
    [
        [0, 1, 0.20, 0.30, 0.20, 0.25],
        [0, 2, 0.70, 0.65, 0.35, 0.30],
        [1, 0, 0.45, 0.80, 0.10, 0.15],
        [1, 1, 0.85, 0.15, 0.50, 0.40],
    ]
)


def _loss_and_grads(model, loss_fn):
    model.zero_grad(set_to_none=True)
    loss = loss_fn(_raw(model, seed=3))
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_one_pass_loss_and_padding_equal_the_level_by_level_reference(model_n3):
    """Same loss and gradients as the written-out loss, with and without padding rows (a captured step
    pads the targets to one shape); padded and unpadded differ by float rounding at most (the sums over
    candidates have other lengths)."""
    criterion = YoloLoss(model_n3, LossHyp.from_mapping(HYP))
    reference = _loss_and_grads(model_n3, lambda raw: _reference_loss(model_n3, raw, SPREAD_TARGETS, HYP))
    plain = _loss_and_grads(model_n3, lambda raw: criterion(raw, SPREAD_TARGETS)[0])
    padded = _loss_and_grads(model_n3, lambda raw: criterion(raw, pad_targets(SPREAD_TARGETS, 37))[0])
    model_n3.zero_grad(set_to_none=True)
    assert reference[0].item() > 0
    torch.testing.assert_close(plain[0], reference[0], rtol=1e-6, atol=0)
    torch.testing.assert_close(padded[0], plain[0], rtol=1e-6, atol=0)  # sums of other lengths: rounding only
    for got in (plain[1], padded[1]):
        for g, want in zip(got, reference[1]):  # summation order differs: compare per tensor, by norm
            assert (g - want).norm() <= 1e-5 * want.norm() + 1e-9, (g - want).norm() / want.norm()


def test_pad_targets_rows_and_capacity():
    padded = pad_targets(SPREAD_TARGETS, 6)
    assert padded.shape == (6, 6) and torch.equal(padded[:4], SPREAD_TARGETS)
    assert padded[4:].tolist() == [[-1, 0, 0, 0, 0, 0]] * 2
    with pytest.raises(ValueError, match="4 targets do not fit a capacity of 3"):
        pad_targets(SPREAD_TARGETS, 3)


def test_rows_marked_as_padding_are_never_assigned(model_n3):
    """Image index -1 marks padding: even with a real box such a row changes nothing."""
    raw = [r.detach() for r in _raw(model_n3)]
    criterion = YoloLoss(model_n3, LossHyp.from_mapping(HYP))
    marked = torch.cat((SPREAD_TARGETS, torch.tensor([[-1, 1, 0.5, 0.5, 0.3, 0.3]])))
    loss, items = criterion(raw, marked)
    want_loss, want_items = criterion(raw, SPREAD_TARGETS)
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=0)  # sums of other lengths: rounding only
    torch.testing.assert_close(items, want_items, rtol=1e-6, atol=0)
