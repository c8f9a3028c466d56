"""Validation on a COCO JSON is pycocotools' number: crowd regions ignore the detections they cover, and
`val --save-json` writes results in the JSON's own ids, so COCOeval runs on them unchanged and agrees
with the mAP50-95 / mAP50 we print (|diff| <= 0.002) on cases with non-contiguous ids and crowds."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from cocotree import ColourOracle, write_coco_dataset
from datatree import watch

from yolov5_smddp.data import coco
from yolov5_smddp.detection.metrics import (
    MetricAccumulator,
    crowd_ignored,
    match_predictions,
    metrics_from_state,
    pack_state,
    unpack_states,
)

pytest.importorskip("pycocotools")
from pycocotools.coco import COCO  # noqa: E402
from pycocotools.cocoeval import COCOeval  # noqa: E402

CATEGORY_IDS = [2, 5, 11, 40]  # class index k is category CATEGORY_IDS[k]


def _cocoeval_maps(gt: COCO, dt: list[dict], max_det: int, img_ids=None) -> tuple[float, float]:
    """(mAP50-95, mAP50) at area 'all' and the largest maxDets, averaged over classes with ground
    truth (the classes COCOeval marks -1 are left out), as COCOeval's precision array gives them."""
    ev = COCOeval(gt, gt.loadRes(dt), "bbox")
    ev.params.maxDets = [1, 10, max_det]
    if img_ids is not None:
        ev.params.imgIds = img_ids
    ev.evaluate()
    ev.accumulate()
    precision = ev.eval["precision"][:, :, :, 0, -1]
    ap_tk = np.where(precision > -1, precision, np.nan).mean(1)
    valid = ~np.isnan(ap_tk[0])
    return float(ap_tk[:, valid].mean()), float(ap_tk[0, valid].mean())


def test_a_detection_inside_a_crowd_region_is_ignored_only_where_no_box_is_left():
    crowd = torch.tensor([[0.0, 0.0, 100.0, 100.0]])
    pred = torch.tensor([[10.0, 10.0, 30.0, 30.0], [90.0, 90.0, 130.0, 130.0], [10.0, 10.0, 30.0, 30.0]])
    correct = torch.tensor([[False] * 10, [False] * 10, [True] * 5 + [False] * 5])
    ignored = crowd_ignored(pred, torch.tensor([0.0, 0.0, 0.0]), correct, crowd, torch.tensor([0.0]))
    assert ignored[0].all()  # wholly inside: intersection / detection area = 1
    assert not ignored[1].any()  # a quarter inside
    assert ignored[2].tolist() == [False] * 5 + [True] * 5  # a true positive first, the crowd after
    other_class = crowd_ignored(pred, torch.tensor([1.0, 1.0, 1.0]), correct, crowd, torch.tensor([0.0]))
    assert not other_class.any()


def _crowd_problem(seed: int, n_images: int = 30, nc: int = 4):
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(n_images):
        m = rng.integers(0, 7)
        xy = rng.uniform(0, 400, (m, 2))
        gt = np.concatenate([xy, xy + rng.uniform(10, 120, (m, 2))], 1)
        gt_cls = rng.integers(0, nc, m)
        k = rng.integers(0, 3)
        cxy = rng.uniform(0, 300, (k, 2))
        crowd = np.concatenate([cxy, cxy + rng.uniform(80, 200, (k, 2))], 1)
        crowd_cls = rng.integers(0, nc, k)
        preds = []
        for box, c in zip(gt, gt_cls):
            for _ in range(rng.integers(0, 3)):
                jitter = rng.normal(0, 0.08, 4) * np.r_[box[2:] - box[:2], box[2:] - box[:2]]
                preds.append(
                    [*(box + jitter), rng.random(), c if rng.random() < 0.85 else rng.integers(0, nc)]
                )
        for box, c in zip(crowd, crowd_cls):  # detections of people in the crowd, some of another class
            for _ in range(rng.integers(1, 6)):
                xy = rng.uniform(box[:2], box[2:] - 10)
                wh = rng.uniform(5, 60, 2)
                preds.append(
                    [*xy, *(xy + wh), rng.random(), c if rng.random() < 0.8 else rng.integers(0, nc)]
                )
        for _ in range(rng.integers(0, 5)):
            xy = rng.uniform(0, 400, 2)
            preds.append([*xy, *(xy + rng.uniform(10, 120, 2)), rng.random() * 0.7, rng.integers(0, nc)])
        images.append((gt, gt_cls, crowd, crowd_cls, np.array(preds, dtype=np.float64).reshape(-1, 6)))
    return images


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_map_with_crowds_and_non_contiguous_ids_equals_cocoeval(seed):
    images = _crowd_problem(seed)
    acc = MetricAccumulator()
    gt_json = {"images": [], "annotations": [], "categories": [{"id": c} for c in CATEGORY_IDS]}
    dt_json = []
    for i, (gt, gt_cls, crowd, crowd_cls, preds) in enumerate(images):
        t = torch.from_numpy
        acc.update(t(preds), t(gt), t(gt_cls).float(), t(crowd), t(crowd_cls).float())
        image_id = 7 * i + 3
        gt_json["images"].append({"id": image_id})
        for boxes, classes, iscrowd in ((gt, gt_cls, 0), (crowd, crowd_cls, 1)):
            for box, c in zip(boxes, classes):
                w, h = box[2] - box[0], box[3] - box[1]
                gt_json["annotations"].append(
                    {
                        "id": len(gt_json["annotations"]) + 1,
                        "image_id": image_id,
                        "category_id": CATEGORY_IDS[int(c)],
                        "bbox": [box[0], box[1], w, h],
                        "area": w * h,
                        "iscrowd": iscrowd,
                    }
                )
        for x1, y1, x2, y2, score, c in preds:
            dt_json.append(
                {
                    "image_id": image_id,
                    "category_id": CATEGORY_IDS[int(c)],
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "score": score,
                }
            )
    coco_gt = COCO()
    coco_gt.dataset = gt_json
    coco_gt.createIndex()
    coco_map, coco_map50 = _cocoeval_maps(coco_gt, dt_json, 1000)
    ours = acc.compute()
    print(f"seed {seed}: ours {ours.map50_95:.6f} {ours.map50:.6f}; COCOeval {coco_map:.6f} {coco_map50:.6f}")
    assert ours.map50 == pytest.approx(coco_map50, abs=0.002)
    assert ours.map50_95 == pytest.approx(coco_map, abs=0.002)
    # the crowds matter here: scored without them, the numbers are clearly lower
    plain = MetricAccumulator()
    for gt, gt_cls, _crowd, _ccls, preds in images:
        plain.update(torch.from_numpy(preds), torch.from_numpy(gt), torch.from_numpy(gt_cls).float())
    assert plain.compute().map50_95 < coco_map - 0.01
    # and the gathered form (ranks) carries the ignored flags exactly
    gathered = metrics_from_state(unpack_states(*[[part] for part in pack_state(acc.state())]), 30)
    assert (gathered.map50, gathered.map50_95) == (ours.map50, ours.map50_95)


def test_match_predictions_is_unchanged_by_crowds():
    gt = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    pred = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    assert match_predictions(pred, torch.tensor([0.9]), torch.tensor([0.0]), gt, torch.tensor([0.0])).all()


@pytest.fixture
def oracle(monkeypatch):
    import yolov5_smddp.models.weights as weights

    monkeypatch.setattr(weights, "load_model", lambda *_a, **_k: ColourOracle())
    coco._MEMO.clear()
    yield
    coco._MEMO.clear()


@pytest.mark.parametrize(("seed", "form"), [(0, "json"), (1, "json"), (2, "yaml")])
def test_val_on_a_coco_json_prints_cocoevals_map(tmp_path, oracle, seed, form):
    """`--data` the JSON itself, or a data.yaml whose `val` is the JSON with its images elsewhere."""
    from yolov5_smddp.cli import main

    root = tmp_path / "data"
    if form == "json":
        json_path = write_coco_dataset(root, n_images=24, seed=seed, crowd_every=3, backgrounds=2)
        data = json_path
    else:
        json_path = write_coco_dataset(
            root, n_images=24, seed=seed, crowd_every=3, backgrounds=2, image_folder="val2017",
            json_name="annotations/instances_val.json", relative_to_json=False,
        )  # fmt: skip
        data = root / "data.yaml"
        data.write_text(
            "val: annotations/instances_val.json\nval_images: val2017\ntrain: annotations/instances_val.json\ntrain_images: val2017\n"
        )
    watch(root)
    out = tmp_path / "val"
    summary = tmp_path / "metrics.json"
    argv = ["val", "--weights", "unused.pt", "--data", str(data), "--imgsz", "128", "--batch-size", "4"]
    argv += ["--workers", "1", "--cache-dir", str(tmp_path / "cache"), "--device", "cpu"]
    argv += ["--save-json", "--output-dir", str(out), "--metrics-json", str(summary)]
    assert main(argv) == 0
    ours = json.loads(summary.read_text())
    predictions = json.loads((out / "predictions.json").read_text())
    raw = json.loads(json_path.read_text())
    assert {p["image_id"] for p in predictions} <= {img["id"] for img in raw["images"]}
    assert {p["category_id"] for p in predictions} == {3, 7, 90}
    # COCOeval on the user's own JSON and our predictions.json, unchanged
    coco_map, coco_map50 = _cocoeval_maps(COCO(str(json_path)), predictions, 300)
    print(f"seed {seed}: ours mAP50-95 {ours['mAP50-95']:.6f} mAP50 {ours['mAP50']:.6f}; "
          f"COCOeval {coco_map:.6f} {coco_map50:.6f}")  # fmt: skip
    assert coco_map50 > 0.5  # the oracle finds most boxes: the comparison is not between zeros
    assert ours["mAP50-95"] == pytest.approx(coco_map, abs=0.002)
    assert ours["mAP50"] == pytest.approx(coco_map50, abs=0.002)
