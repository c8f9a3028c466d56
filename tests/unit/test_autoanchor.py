"""AutoAnchor: the release's best-possible-recall metric, anchor fitting on long thin boxes, determinism
under the seed, the anchors in the model (buffer, config, saved weights) and the same anchors on every rank."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from yolov5_smddp.models.autoanchor import (
    AnchorCheck,
    anchor_metrics,
    apply_anchors,
    autoanchor,
    check_anchors,
    fit_anchors,
    label_sizes,
    model_anchors_px,
)
from yolov5_smddp.models.weights import load_model, save_weights
from yolov5_smddp.models.yolo import build_model, load_model_config


def _labels(rng: np.random.Generator, n_images: int, w: tuple[float, float], h: tuple[float, float]):
    out = []
    for _ in range(n_images):
        k = int(rng.integers(1, 4))
        out.append(
            np.stack(
                [np.zeros(k), np.full(k, 0.5), np.full(k, 0.5), rng.uniform(*w, k), rng.uniform(*h, k)], 1
            ).astype(np.float32)
        )
    return out


@pytest.fixture(scope="module")
def thin():
    """Long thin boxes (a quarter to most of the width, 1-3% of the height) on 640x480 images."""
    rng = np.random.default_rng(3)
    return np.tile([[480, 640]], (150, 1)), _labels(rng, 150, (0.25, 0.9), (0.01, 0.03))


def test_label_sizes_scale_the_long_side_to_imgsz():
    shapes = np.array([[480, 640], [1000, 500]])  # (h, w)
    labels = [np.array([[0, 0.5, 0.5, 0.5, 0.25]], np.float32), np.zeros((0, 5), np.float32)]
    np.testing.assert_allclose(label_sizes(shapes, labels, 320), [[160.0, 60.0]])
    labels[1] = np.array([[1, 0.5, 0.5, 0.2, 0.1]], np.float32)
    np.testing.assert_allclose(label_sizes(shapes, labels, 320, zoom=[1.0, 0.5]), [[160, 60], [16, 16]])


def test_metrics_count_a_box_when_an_anchor_is_within_anchor_t_in_both_sides():
    anchors = np.array([[10.0, 10.0]])
    wh = np.array([[10, 10], [39, 10], [40, 10], [10, 2.6]], np.float32)  # ratios 1, 3.9, 4 (not < 4), 3.85
    bpr, aat = anchor_metrics(anchors, wh, 4.0)
    assert bpr == pytest.approx(0.75) and aat == pytest.approx(0.75)
    assert anchor_metrics(np.array([[10.0, 10.0], [40.0, 10.0]]), wh, 4.0) == pytest.approx((1.0, 1.25))


def test_long_thin_boxes_get_new_anchors_that_fit(thin):
    shapes, labels = thin
    model = build_model("yolov5n", nc=1)
    result = check_anchors(model, shapes, labels, 320, 4.0, seed=0)
    assert result.boxes == sum(len(lab) for lab in labels)
    assert result.bpr_before < 0.98 and result.changed and result.bpr_after > result.bpr_before
    assert result.bpr_after > 0.98
    areas = result.anchors_px.prod(1)
    assert result.anchors_px.shape == (9, 2) and np.all(np.diff(areas) >= 0)  # smallest first
    assert np.all(result.anchors_px[:, 0] > 3 * result.anchors_px[:, 1])  # wide and flat, like the boxes
    line = result.line()
    assert (
        line.startswith(f"autoanchor: {result.bpr_before:.4f} best possible recall") and "new anchors" in line
    )
    print(line)


def test_the_fit_is_deterministic_under_the_seed(thin):
    shapes, labels = thin
    model = build_model("yolov5n", nc=1)
    first, again = (check_anchors(model, shapes, labels, 320, 4.0, seed=7) for _ in range(2))
    np.testing.assert_array_equal(first.anchors_px, again.anchors_px)
    assert first.bpr_after == again.bpr_after
    other = check_anchors(model, shapes, labels, 320, 4.0, seed=8)
    assert not np.array_equal(first.anchors_px, other.anchors_px)


def test_anchors_that_fit_are_kept():
    rng = np.random.default_rng(0)
    anchors = np.array(load_model_config("yolov5n")["anchors"], np.float64).reshape(-1, 2)
    picks = anchors[rng.integers(0, 9, 400)] * rng.uniform(0.8, 1.25, (400, 2))
    labels = [np.array([[0, 0.5, 0.5, w / 640, h / 640]], np.float32) for w, h in picks]
    model = build_model("yolov5n", nc=1)
    result = check_anchors(model, np.tile([[640, 640]], (400, 1)), labels, 640, 4.0, seed=0)
    assert result.bpr_before >= 0.98 and not result.changed
    np.testing.assert_allclose(result.anchors_px, anchors, rtol=1e-5)
    assert result.line().endswith("(>= 0.98: anchors kept)")


def test_too_few_distinct_boxes_fall_back_to_random_anchors_and_evolve():
    wh = np.array([[30.0, 4.0]] * 20, np.float32)
    anchors = fit_anchors(wh, 9, 320, 4.0, np.random.default_rng(0), generations=300)
    assert anchors.shape == (9, 2) and np.all(anchors >= 2.0)
    assert anchor_metrics(anchors, wh, 4.0)[0] == 1.0


def test_applied_anchors_go_smallest_to_the_finest_stride_and_are_saved(tmp_path, thin):
    shapes, labels = thin
    model = build_model("yolov5n", nc=1)
    result = check_anchors(model, shapes, labels, 320, 4.0, seed=0)
    apply_anchors(model, result.anchors_px[::-1].copy())  # given largest first: the levels are flipped back
    np.testing.assert_allclose(
        model_anchors_px(model), result.anchors_px[::-1].reshape(3, 3, 2)[::-1].reshape(9, 2)
    )
    assert model.cfg["anchors"][0] == [round(float(v), 2) for v in model_anchors_px(model)[:3].flatten()]
    path = save_weights(tmp_path / "best.pt", model, meta={})
    reloaded = load_model(path)
    torch.testing.assert_close(reloaded.detect.anchors, model.detect.anchors)
    torch.testing.assert_close(
        build_model(reloaded.cfg).detect.anchors, model.detect.anchors, atol=1e-3, rtol=0
    )


def test_every_rank_takes_rank_0s_anchors(thin):
    shapes, labels = thin
    shared: list[AnchorCheck] = []

    def broadcast(obj):  # what trainer.share_anchor_check does: rank 0's check on every rank
        if obj is not None:
            shared.append(obj)
        return shared[0]

    rank0, rank1 = build_model("yolov5n", nc=1), build_model("yolov5n", nc=1)
    common = {"imgsz": 320, "anchor_t": 4.0, "seed": 0, "share": broadcast}
    autoanchor(rank0, shapes, labels, main=True, **common)
    autoanchor(rank1, shapes[:0], [], main=False, **common)  # rank 1 computes nothing
    assert (
        torch.equal(rank0.detect.anchors, rank1.detect.anchors)
        and rank0.cfg["anchors"] == rank1.cfg["anchors"]
    )
    assert not torch.equal(rank0.detect.anchors, build_model("yolov5n", nc=1).detect.anchors)
