"""bench/release_reference/pipeline_stats.py (issue 38): its bookkeeping, on our side only (the release
is not installed here)."""

import numpy as np
import pytest

from bench.make_textured_dataset import make_textured_dataset
from bench.release_reference import pipeline_stats as ps
from yolov5_smddp.data import augment
from yolov5_smddp.data.augment import AugmentParams
from yolov5_smddp.data.config import load_data_config
from yolov5_smddp.data.dataset import YoloDataset
from yolov5_smddp.data.labels import build_label_index


def test_filter_fractions_exact():
    log = ps.FilterLog()
    # rows: before xyxy (canvas, scaled), after xyxy (output, clipped), kept
    before = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10], [5, 5, 5, 9], [0, 0, 10, 10]], float)
    after = np.array([[0, 0, 10, 10], [0, 0, 5, 10], [0, 0, 1, 5], [0, 0, 0, 4], [3, 3, 3, 3]], float)
    log.add(np.array([0, 0, 1, 1, 2]), before, after, np.array([True, True, False, False, False]), 1.25)
    samples = [np.array([[0, 0, 0.5, 0.5, 0.25, 0.5], [0, 1, 0.5, 0.5, 0.5, 0.25]], np.float32)]
    stats = ps.sample_stats(samples, log.table(), imgsz=100, nc=3)
    a = stats["all"]
    assert a["entering"] == 5
    assert a["off_canvas"] == pytest.approx(1 / 5)  # the zero-width box
    assert a["out_of_output"] == pytest.approx(1 / 4)  # on the canvas, nothing left in the output
    assert a["clipped"] == pytest.approx(2 / 3)  # half and 5% of their area left
    assert a["clipped_area_kept"] == pytest.approx((0.5 + 0.05) / 2)
    assert a["scale_mean"] == 1.25 and a["scale_mean_dropped"] == 1.25
    assert a["dropped"] == pytest.approx(1 / 3) and a["dropped_clipped"] == pytest.approx(1 / 2)
    assert (
        a["boxes_per_sample"] == 2 and stats[0]["boxes_per_sample"] == 1 and stats[2]["boxes_per_sample"] == 0
    )
    assert a["w_mean"] == pytest.approx(37.5) and a["h_mean"] == pytest.approx(37.5)
    bin_16_32 = ps.WH_EDGES.index(16)  # class 0's one box is 25 px wide
    assert stats[0]["w_hist"][bin_16_32] == 1.0 and sum(stats[0]["w_hist"]) == 1.0


def test_batches_number_the_images():
    samples = [np.ones((k, 6), np.float32) for k in (1, 0, 2, 3)]
    out = ps.batches(samples, 2)
    assert [b[:, 0].tolist() for b in out] == [[0.0], [0.0, 0.0, 1.0, 1.0, 1.0]]
    assert samples[0][0, 0] == 1  # the samples themselves are left alone


def test_our_filter_log_accounts_for_every_final_box(tmp_path, monkeypatch):
    monkeypatch.setattr(augment, "_apply_box_transform", augment._apply_box_transform)  # restored after
    cfg = load_data_config(make_textured_dataset(tmp_path / "d", n_train=12, n_val=0, seed=1))
    index = build_label_index(cfg.train, nc=cfg.nc, root=cfg.root, cache_dir=tmp_path / "c", workers=1)
    log = ps.FilterLog()
    ps.instrument_ours(log)
    hyp = {"mosaic": 1.0, "scale": 0.5, "translate": 0.1, "fliplr": 0.5}
    samples, pixels = ps.draw_samples(
        YoloDataset(index, 128, augment=True, hyp=AugmentParams(**hyp), seed=0), 30, seed=0
    )
    table = log.table()
    assert len(samples) == 30 and pixels.shape == (30, 6)
    assert int(table[:, 5].sum()) == sum(len(s) for s in samples) > 0  # kept by the filter = final boxes
    assert set(table[:, 0].astype(int)) <= {0, 1, 2}
    assert ((table[:, 6] >= 0.5) & (table[:, 6] <= 1.5)).all()  # scratch-low's scale range
    assert (table[:, 5] == 0).any()  # some dropped at this scale range
    assert ((pixels[:, 4] >= 0) & (pixels[:, 4] <= 1)).all() and (pixels[:, 5] > 0).all()
