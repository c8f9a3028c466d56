"""Plots: the confusion matrix and the curves on hand-made cases (exact values), the recorder fed as
`evaluate(on_image=...)` feeds it, and the files (they exist and decode; a failure only warns)."""

from __future__ import annotations

import logging

import cv2
import numpy as np
import pytest
import torch

from yolov5_smddp.config.train_config import parse_train_args
from yolov5_smddp.plots import (
    ValidationPlots,
    add_to_tensorboard,
    recording_batches,
    write_labels_plot,
    write_results_plot,
    write_safely,
    write_validation_plots,
)
from yolov5_smddp.plots.confusion import ConfusionMatrix
from yolov5_smddp.plots.curves import GRID, compute_curves
from yolov5_smddp.plots.mosaic import batch_mosaic, class_colour, training_batch_boxes

pytest.importorskip("matplotlib")


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_confusion_matrix_hand_made_image():
    cm = ConfusionMatrix(nc=2)  # conf 0.25, IoU 0.45
    gt_cls = torch.tensor([0, 1, 1])
    gt_boxes = _t([[0, 0, 10, 10], [20, 20, 30, 30], [50, 50, 60, 60]])
    dets = _t(
        [
            [0, 0, 10, 10, 0.9, 0],  # gt 0, right class
            [20, 20, 30, 31, 0.8, 0],  # gt 1 (IoU 100/110), wrong class
            [100, 100, 110, 110, 0.7, 1],  # nothing there: background column
            [0, 0, 10, 10, 0.2, 1],  # under conf 0.25: ignored
        ]
    )
    cm.update(dets, gt_cls, gt_boxes)  # gt 2 is missed: background row
    assert cm.matrix.tolist() == [[1, 1, 0], [0, 0, 1], [0, 1, 0]]
    np.testing.assert_array_equal(cm.normalised(), [[1, 0.5, 0], [0, 0, 1], [0, 0.5, 0]])


def test_confusion_matrix_matches_one_to_one_by_iou_and_handles_empty_sides():
    cm = ConfusionMatrix(nc=1)
    # two detections on one object: the better-overlapping one matches, the other is background
    cm.update(_t([[0, 0, 10, 12, 0.5, 0], [0, 0, 10, 10, 0.4, 0]]), torch.tensor([0]), _t([[0, 0, 10, 10]]))
    assert cm.matrix.tolist() == [[1, 1], [0, 0]]
    cm.update(_t([[0, 0, 5, 5, 0.9, 0]]), torch.zeros(0), torch.zeros(0, 4))  # nothing labelled
    cm.update(torch.zeros(0, 6), torch.tensor([0, 0]), _t([[0, 0, 5, 5], [9, 9, 19, 19]]))  # nothing detected
    assert cm.matrix.tolist() == [[1, 2], [2, 0]]
    low_iou = ConfusionMatrix(nc=1)  # IoU 0.25 <= 0.45: not a match
    low_iou.update(_t([[0, 0, 10, 10, 0.9, 0]]), torch.tensor([0]), _t([[5, 0, 15, 10]]))
    assert low_iou.matrix.tolist() == [[0, 1], [1, 0]]


def test_curves_hand_made_class():
    # class 0: 2 ground truths; detections 0.9 TP, 0.8 FP, 0.6 TP → recall .5 .5 1, precision 1 .5 2/3
    # class 1: 1 ground truth, never detected; class 2: detected, no ground truth (not a row)
    curves = compute_curves(
        np.array([True, False, True, False]),
        np.array([0.6, 0.9, 0.8, 0.7])[[1, 2, 0, 3]],  # given out of order: sorted by confidence inside
        np.array([0, 0, 0, 2]),
        np.array([0, 0, 1]),
    )
    assert curves.classes.tolist() == [0, 1]
    r, p, pr = curves.recall[0], curves.precision[0], curves.pr[0]
    assert (r[0], p[0]) == (1.0, pytest.approx(2 / 3))  # confidence 0: every detection
    assert (r[-1], p[-1]) == (0.0, 1.0)  # confidence 1: none
    k = 850  # confidence 0.8509 lies between the 0.9 and 0.8 detections
    c = GRID[k]
    assert r[k] == 0.5 and p[k] == pytest.approx(1 - 0.5 * (0.9 - c) / 0.1)
    k = 700  # confidence 0.7007, between 0.8 (r .5, p .5) and 0.6 (r 1, p 2/3)
    t = (0.8 - GRID[k]) / 0.2
    assert r[k] == pytest.approx(0.5 + 0.5 * t) and p[k] == pytest.approx(0.5 + (2 / 3 - 0.5) * t)
    assert curves.f1[0, 0] == pytest.approx(0.8)  # 2 * (2/3) * 1 / (2/3 + 1)
    # PR: envelope 1, 2/3, 2/3 → 1 up to recall 0.5, then 2/3 up to recall 1
    assert np.all(pr[GRID <= 0.5] == 1.0) and np.allclose(pr[GRID > 0.5], 2 / 3)
    assert curves.ap50[0] == pytest.approx(0.5 + 0.5 * 2 / 3, abs=1e-3)
    assert not curves.recall[1].any() and not curves.pr[1].any() and curves.ap50[1] == 0


def test_recorder_matches_detections_against_the_split_labels():
    images = ["/d/a.jpg", "/d/b.jpg"]
    shapes = np.array([[100, 200], [50, 50]], np.int32)  # (h, w)
    labels = [np.array([[1, 0.5, 0.5, 0.2, 0.4]], np.float32), np.zeros((0, 5), np.float32)]
    recorder = ValidationPlots(images, shapes, labels, nc=2)
    # a.jpg: the label is x 80..120, y 30..70 in pixels
    recorder.on_image("/d/a.jpg", _t([[80, 30, 120, 70, 0.9, 1], [0, 0, 10, 10, 0.01, 0]]))
    recorder.on_image("/d/b.jpg", _t([[0, 0, 10, 10, 0.5, 0]]))
    recorder.on_image("/elsewhere/c.jpg", _t([[0, 0, 10, 10, 0.5, 0]]))  # not in the split: ignored
    assert recorder.confusion.matrix.tolist() == [[0, 0, 1], [0, 1, 0], [0, 0, 0]]
    curves = recorder.curves()
    assert curves.classes.tolist() == [1] and curves.ap50[0] == pytest.approx(1.0, abs=1e-3)
    assert [path for path, _, _ in recorder.first] == images
    np.testing.assert_allclose(recorder.first[0][1], [[1, 80, 30, 120, 70]])  # gt: class, xyxy
    np.testing.assert_allclose(recorder.first[0][2], [[1, 80, 30, 120, 70, 0.9]], rtol=1e-6)  # conf > 0.25


def test_mosaic_layout_and_boxes():
    images = [
        np.zeros((32, 48, 3), np.uint8),
        np.zeros((20, 40, 3), np.uint8),
        np.zeros((32, 48, 3), np.uint8),
    ]
    boxes = [np.array([[1, 4, 4, 20, 20]]), np.zeros((0, 5)), np.array([[0, 2, 2, 10, 10, 0.75]])]
    mosaic = batch_mosaic(images, boxes, ["a", "b"])
    assert mosaic.shape == (64, 96, 3)  # 2 x 2 tiles of 32 x 48
    assert tuple(mosaic[4, 12]) == class_colour(1)  # top edge of image 0's box
    assert tuple(mosaic[42, 6]) == class_colour(0)  # image 2 (row 1, col 0): bottom edge of its box
    assert (mosaic[32:, 48:] == 255).all()  # the empty fourth tile
    targets = np.array([[0, 2, 0.5, 0.5, 0.5, 0.25], [1, 0, 0.5, 0.5, 1, 1]])
    np.testing.assert_allclose(training_batch_boxes(targets, 0, 40, 80), [[2, 20, 15, 60, 25]])


def test_plot_files_exist_and_decode(tmp_path):
    images, shapes = [], []
    rng = np.random.default_rng(0)
    for i in range(3):
        path = tmp_path / f"im{i}.jpg"
        cv2.imwrite(str(path), rng.integers(0, 255, (60, 80, 3), dtype=np.uint8))
        images.append(str(path))
        shapes.append((60, 80))
    labels = [np.array([[i % 2, 0.5, 0.5, 0.5, 0.5]], np.float32) for i in range(3)]
    recorder = ValidationPlots(images, np.array(shapes), labels, nc=2)
    for i, path in enumerate(images):
        recorder.on_image(path, _t([[20, 15, 60, 45, 0.3 + 0.2 * i, i % 2], [0, 0, 9, 9, 0.4, 1]]))
    out = tmp_path / "out"
    write_validation_plots(out, recorder, ["cat", "dog"])
    rows = [
        {"epoch": 1, "box_loss": 0.1, "obj_loss": 0.2, "cls_loss": 0.3, "mAP50": ""},
        {"epoch": 2, "box_loss": 0.08, "obj_loss": 0.1, "cls_loss": 0.2, "mAP50": 0.4, "lr_weight": 0.01},
    ]
    assert write_results_plot(out, rows)
    assert write_labels_plot(out, labels, ["cat", "dog"])
    expected = [
        "F1_curve.png",
        "PR_curve.png",
        "P_curve.png",
        "R_curve.png",
        "confusion_matrix.png",
        "labels.jpg",
        "results.png",
        "val_batch0_labels.jpg",
        "val_batch0_pred.jpg",
    ]
    assert sorted(p.name for p in out.iterdir()) == expected  # no temporary files left
    for name in expected:
        image = cv2.imread(str(out / name))
        assert image is not None and image.shape[0] > 50 and image.shape[1] > 50, name


def test_a_failing_plot_warns_and_carries_on(caplog):
    def broken():
        raise ValueError("no data")

    with caplog.at_level(logging.WARNING):
        assert write_safely("PR_curve.png", broken) is False
    assert "plot PR_curve.png not written (ValueError: no data)" in caplog.text
    assert write_safely("fine", lambda: None) is True


def test_noplots_option():
    assert parse_train_args(["--noplots"]).noplots is True
    assert parse_train_args([]).noplots is False


def test_training_batches_pass_through_and_the_first_three_are_drawn(tmp_path):
    imgs = torch.zeros(2, 3, 32, 48, dtype=torch.uint8)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.5, 0.5], [1, 0, 0.25, 0.25, 0.2, 0.2]])
    batches = [(imgs, targets, ["a", "b"], None, None) for _ in range(4)]
    seen = list(recording_batches(iter(batches), tmp_path, ["cat", "dog"]))
    assert len(seen) == 4 and all(a is b for a, b in zip(seen, batches))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "train_batch0.jpg",
        "train_batch1.jpg",
        "train_batch2.jpg",
    ]
    mosaic = cv2.imread(str(tmp_path / "train_batch0.jpg"))
    assert mosaic.shape == (32, 96, 3)  # two 32 x 48 tiles side by side


def test_plot_images_go_to_tensorboard(tmp_path):
    class Board:
        def __init__(self):
            self.images = []

        def add_image(self, tag, image, step, dataformats):
            self.images.append((tag, image.shape, step, dataformats))

    cv2.imwrite(str(tmp_path / "results.png"), np.full((60, 90, 3), 200, np.uint8))
    cv2.imwrite(str(tmp_path / "train_batch0.jpg"), np.zeros((40, 40, 3), np.uint8))
    board = Board()
    assert add_to_tensorboard(board, tmp_path, 7) == 2
    assert board.images == [
        ("results.png", (60, 90, 3), 7, "HWC"),
        ("train_batch0.jpg", (40, 40, 3), 7, "HWC"),
    ]
