"""Non-maximum suppression with the release's semantics, on hand-made predictions."""

from __future__ import annotations

import pytest
import torch

from yolov5_smddp.detection.postprocess import non_max_suppression


def _pred(rows: list[list[float]], nc: int) -> torch.Tensor:
    """rows: (xc, yc, w, h, obj, cls probs...) → [1, n, 5 + nc]."""
    out = torch.tensor(rows, dtype=torch.float32)
    assert out.shape[1] == 5 + nc
    return out[None]


def test_score_is_objectness_times_class_and_boxes_become_xyxy():
    pred = _pred([[50, 40, 20, 10, 0.9, 0.1, 0.8]], nc=2)
    (det,) = non_max_suppression(pred, conf_thres=0.25)
    torch.testing.assert_close(det, torch.tensor([[40.0, 35.0, 60.0, 45.0, 0.72, 1.0]]))


def test_objectness_threshold_applies_first():
    # With class probabilities <= 1 the score obj * cls never exceeds obj, so the objectness gate is only
    # seen apart from the score threshold on a row whose class value exceeds 1 (raw scores from another
    # head): obj 0.2 with cls 1.5 scores 0.3 > 0.25, yet its objectness is under the threshold: dropped.
    pred = _pred(
        [
            [50, 40, 20, 10, 0.2, 1.5],  # objectness 0.2 < 0.25: dropped before scoring
            [10, 10, 4, 4, 0.5, 0.4],  # objectness passes, score 0.2 < 0.25: dropped by the score
            [150, 150, 20, 20, 0.3, 0.9],  # objectness 0.3, score 0.27: kept
        ],
        nc=1,
    )
    (det,) = non_max_suppression(pred, conf_thres=0.25)
    torch.testing.assert_close(det, torch.tensor([[140.0, 140.0, 160.0, 160.0, 0.27, 0.0]]))


def test_overlapping_boxes_of_one_class_are_suppressed_other_classes_kept():
    pred = _pred(
        [
            [50, 50, 20, 20, 0.9, 0.9, 0.1],  # class 0, score 0.81
            [52, 50, 20, 20, 0.8, 0.9, 0.1],  # class 0, IoU ≈ 0.82 with the first: suppressed
            [51, 50, 20, 20, 0.7, 0.1, 0.9],  # class 1, same place: kept (class-aware)
            [150, 150, 20, 20, 0.6, 0.9, 0.1],  # class 0 elsewhere: kept
        ],
        nc=2,
    )
    (det,) = non_max_suppression(pred, conf_thres=0.25, iou_thres=0.45)
    assert det[:, 4].tolist() == pytest.approx([0.81, 0.63, 0.54])
    assert det[:, 5].tolist() == [0.0, 1.0, 0.0]
    (agnostic,) = non_max_suppression(pred, conf_thres=0.25, iou_thres=0.45, agnostic=True)
    assert agnostic[:, 4].tolist() == pytest.approx([0.81, 0.54])


def test_multi_label_keeps_every_class_over_threshold():
    pred = _pred([[50, 50, 20, 20, 0.9, 0.6, 0.5, 0.1]], nc=3)
    (single,) = non_max_suppression(pred, conf_thres=0.25)
    (multi,) = non_max_suppression(pred, conf_thres=0.25, multi_label=True)
    assert single[:, 5].tolist() == [0.0]
    assert multi[:, 5].tolist() == [0.0, 1.0]
    assert multi[:, 4].tolist() == pytest.approx([0.54, 0.45])


def test_class_filter_max_det_and_max_nms():
    rows = [[20.0 * i + 10, 10, 8, 8, 0.9 - 0.01 * i, 0.2, 0.8] for i in range(10)]
    pred = _pred(rows, nc=2)
    assert len(non_max_suppression(pred, classes=[0])[0]) == 0
    assert len(non_max_suppression(pred, classes=[1])[0]) == 10
    top3 = non_max_suppression(pred, max_det=3)[0]
    assert top3[:, 0].tolist() == pytest.approx([6.0, 26.0, 46.0])
    capped = non_max_suppression(pred, max_nms=4)[0]
    assert len(capped) == 4 and capped[:, 4].min().item() == pytest.approx(0.87 * 0.8)


def test_batch_of_images_and_empty_image():
    pred = torch.zeros(3, 5, 7)
    pred[1, 0] = torch.tensor([30, 30, 10, 10, 0.9, 0.1, 0.95])
    out = non_max_suppression(pred)
    assert [len(d) for d in out] == [0, 1, 0]
    assert all(d.shape[1] == 6 for d in out)


def test_bad_thresholds_are_refused():
    with pytest.raises(ValueError, match="conf_thres"):
        non_max_suppression(torch.zeros(1, 1, 6), conf_thres=1.5)
