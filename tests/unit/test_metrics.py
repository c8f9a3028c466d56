import numpy as np
import pytest
import torch

from yolov5_smddp.detection.metrics import (
    MetricAccumulator,
    ap_per_class,
    first_of_class,
    fitness,
    match_predictions,
    results_table,
)


def test_fitness_weights():
    assert fitness(0.5, 0.3) == pytest.approx(0.05 + 0.27)


def test_match_is_one_to_one_and_class_aware():
    gt = torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30]])
    gt_cls = torch.tensor([0.0, 1.0])
    pred = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 9], [20, 20, 30, 30]])
    pred_cls = torch.tensor([0.0, 0.0, 0.0])  # the third has the wrong class
    correct = match_predictions(pred, torch.tensor([0.9, 0.8, 0.7]), pred_cls, gt, gt_cls)
    assert correct.shape == (3, 10)
    assert correct[0].all()  # exact box: TP at every threshold
    assert not correct[1].any()  # duplicate of an already matched ground truth
    assert not correct[2].any()  # right place, wrong class


def test_match_confident_prediction_takes_its_best_overlap():
    gt = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 7]])
    pred = torch.tensor([[0.0, 0, 10, 6], [0, 0, 10, 9.5]])  # the more confident one overlaps both
    correct = match_predictions(pred, torch.tensor([0.5, 0.9]), torch.zeros(2), gt, torch.zeros(2))
    # pred 1 (conf 0.9) takes gt 0 (IoU 0.95); pred 0 then gets gt 1 (IoU 6/7 = 0.857)
    assert correct[1].all()
    assert correct[0].tolist() == [True] * 8 + [False] * 2


def test_duplicate_with_higher_iou_but_lower_confidence_is_the_false_positive():
    gt = torch.tensor([[0.0, 0, 10, 10]])
    pred = torch.tensor([[0.0, 0, 10, 8], [0, 0, 10, 9.9]])
    correct = match_predictions(pred, torch.tensor([0.9, 0.1]), torch.zeros(2), gt, torch.zeros(1))
    assert correct[0, 0] and not correct[1, 0]


def test_perfect_predictions_score_one():
    acc = MetricAccumulator()
    gt = torch.tensor([[0.0, 0, 10, 10], [20, 20, 40, 40]])
    dets = torch.cat([gt, torch.tensor([[0.9, 0.0], [0.8, 1.0]])], 1)
    acc.update(dets, gt, torch.tensor([0.0, 1.0]))
    m = acc.compute()
    assert m.map50 == pytest.approx(1.0) and m.map50_95 == pytest.approx(1.0)
    assert m.precision == pytest.approx(1.0) and m.recall == pytest.approx(1.0)


def test_class_without_detections_scores_zero_and_no_gt_class_is_ignored():
    correct = np.ones((2, 10), bool)
    m = ap_per_class(correct, np.array([0.9, 0.8]), np.array([0, 2]), np.array([0, 1]))
    # class 0 perfect, class 1 never detected, class 2 has no ground truth (ignored)
    assert m.map50 == pytest.approx(0.5)
    assert set(m.per_class_ap50) == {0, 1}


def _hand_problem() -> MetricAccumulator:
    """Three images, worked out by hand below. Class 0: 2 boxes in 2 images, detected at conf 0.9 (TP),
    0.6 (FP) and 0.3 (TP); class 1: 1 box, detected at 0.8 (TP); class 2: 3 boxes, 2 of them in one image,
    never detected; class 3: a false positive only (no ground truth: no row)."""
    acc = MetricAccumulator()
    box = torch.tensor([[0.0, 0, 10, 10]])
    far = torch.tensor([[50.0, 50, 60, 60]])
    acc.update(  # image 0: a class-0 box found (0.9), a class-1 box found (0.8), a class-0 FP (0.6)
        torch.tensor([[0.0, 0, 10, 10, 0.9, 0], [50, 50, 60, 60, 0.8, 1], [80, 80, 90, 90, 0.6, 0]]),
        torch.cat([box, far]),
        torch.tensor([0.0, 1.0]),
    )
    acc.update(  # image 1: a class-0 box found late (0.3), two class-2 boxes missed, a class-3 FP
        torch.tensor([[0.0, 0, 10, 10, 0.3, 0], [30, 30, 40, 40, 0.5, 3]]),
        torch.cat([box, far, far + 10]),
        torch.tensor([0.0, 2.0, 2.0]),
    )
    acc.update(torch.zeros(0, 6), far, torch.tensor([2.0]))  # image 2: one class-2 box, missed
    return acc


def test_per_class_values_worked_out_by_hand():
    m = _hand_problem().compute()
    # Curves at IoU 0.5 against the confidence grid (interpolated between detections, P = 1 and R = 0
    # above the first one). Class 0: R 0.5 down to conf 0.6, rising to 1 at 0.3; P 1 -> 1/2 -> 2/3, so
    # its F1 peaks (0.8: P 2/3, R 1) at every confidence <= 0.3. Class 1: F1 1 below 0.8. Class 2: 0.
    # The mean F1 peaks first at the grid's confidence 0, where every class is read.
    assert m.best_conf == 0.0
    assert m.per_class_precision == pytest.approx({0: 2 / 3, 1: 1.0, 2: 0.0})
    assert m.per_class_recall == pytest.approx({0: 1.0, 1: 1.0, 2: 0.0})
    assert m.precision == pytest.approx((2 / 3 + 1 + 0) / 3) and m.recall == pytest.approx(2 / 3)
    assert m.per_class_instances == {0: 2, 1: 1, 2: 3}
    assert m.per_class_images == {0: 2, 1: 1, 2: 2}  # class 2: 3 boxes in 2 images
    # AP (COCO's 101 points): class 0 precision envelope 1 up to R 0.5, then 2/3 -> (51 + 50 * 2/3) / 101
    assert m.per_class_ap50 == pytest.approx({0: (51 + 50 * 2 / 3) / 101, 1: 1.0, 2: 0.0})
    assert m.num_images == 3 and m.num_targets == 6
    rows = m.per_class(["person", "car", "dog", "cat"])
    assert [r["name"] for r in rows] == ["person", "car", "dog"]
    assert rows[2] == {
        "class": 2,
        "name": "dog",
        "images": 2,
        "instances": 3,
        "precision": 0.0,
        "recall": 0.0,
        "mAP50": 0.0,
        "mAP50-95": 0.0,
    }


def test_results_table_lines():
    m = _hand_problem().compute()
    lines = results_table(m, ["person", "car", "dog", "cat"]).splitlines()
    assert lines[0].split() == ["Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95"]
    assert lines[1].split()[:3] == ["all", "3", "6"]
    assert [line.split()[:3] for line in lines[2:]] == [
        ["person", "2", "2"],
        ["car", "1", "1"],
        ["dog", "2", "3"],
    ]
    assert lines[2].split()[3:6] == ["0.667", "1", f"{(51 + 50 * 2 / 3) / 101:.3g}"]
    assert len({len(line) for line in lines}) == 1  # aligned columns
    assert len(results_table(m, ["person", "car", "dog", "cat"], per_class=False).splitlines()) == 2


def test_first_of_class_marks_one_box_per_class_and_image():
    assert first_of_class(np.array([2, 0, 2, 2, 0, 5])).tolist() == [True, True, False, False, False, True]
    assert first_of_class(np.zeros(0)).tolist() == []


def _random_problem(seed: int, n_images: int = 30, nc: int = 4):
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(n_images):
        m = rng.integers(0, 8)
        xy = rng.uniform(0, 400, (m, 2))
        wh = rng.uniform(10, 120, (m, 2))
        gt = np.concatenate([xy, xy + wh], 1)
        gt_cls = rng.integers(0, nc, m)
        preds = []
        for box, c in zip(gt, gt_cls):  # jittered hits, sometimes duplicated, sometimes the wrong class
            for _ in range(rng.integers(0, 3)):
                jitter = rng.normal(0, 0.08, 4) * np.r_[box[2:] - box[:2], box[2:] - box[:2]]
                cls = c if rng.random() < 0.85 else rng.integers(0, nc)
                preds.append([*(box + jitter), rng.random(), cls])
        for _ in range(rng.integers(0, 6)):  # false positives anywhere
            xy = rng.uniform(0, 400, 2)
            preds.append([*xy, *(xy + rng.uniform(10, 120, 2)), rng.random() * 0.7, rng.integers(0, nc)])
        images.append((gt, gt_cls, np.array(preds, dtype=np.float64).reshape(-1, 6)))
    return images


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_map_equals_pycocotools(seed):
    pycocotools = pytest.importorskip("pycocotools")
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    del pycocotools
    images = _random_problem(seed)
    acc = MetricAccumulator()
    gt_json = {"images": [], "annotations": [], "categories": [{"id": c} for c in range(4)]}
    dt_json = []
    for i, (gt, gt_cls, preds) in enumerate(images):
        acc.update(torch.from_numpy(preds), torch.from_numpy(gt), torch.from_numpy(gt_cls).float())
        gt_json["images"].append({"id": i})
        for box, c in zip(gt, gt_cls):
            w, h = box[2] - box[0], box[3] - box[1]
            gt_json["annotations"].append(
                {
                    "id": len(gt_json["annotations"]) + 1,
                    "image_id": i,
                    "category_id": int(c),
                    "bbox": [box[0], box[1], w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
        for x1, y1, x2, y2, score, c in preds:
            dt_json.append(
                {"image_id": i, "category_id": int(c), "bbox": [x1, y1, x2 - x1, y2 - y1], "score": score}
            )
    assert len(dt_json) > 100
    coco_gt = COCO()
    coco_gt.dataset = gt_json
    coco_gt.createIndex()
    coco_dt = coco_gt.loadRes(dt_json)
    ev = COCOeval(coco_gt, coco_dt, "bbox")
    ev.params.maxDets = [1, 10, 1000]  # no per-image cap (ours has none below NMS's max_det)
    ev.evaluate()
    ev.accumulate()
    precision = ev.eval["precision"][:, :, :, 0, -1]  # [T, R, K] at area "all", the largest maxDets
    ap_tk = np.where(precision > -1, precision, np.nan).mean(1)  # [T, K]; -1 = class without ground truth
    valid = ~np.isnan(ap_tk[0])
    coco_map50, coco_map = ap_tk[0, valid].mean(), ap_tk[:, valid].mean()
    ours = acc.compute()
    assert ours.map50 == pytest.approx(coco_map50, abs=0.002)
    assert ours.map50_95 == pytest.approx(coco_map, abs=0.002)
    # per class: AP50 and AP50-95 per category, and the instance / image counts of the ground truth
    coco_classes = [int(c) for c in np.flatnonzero(valid)]
    assert sorted(ours.per_class_ap50) == coco_classes
    for k in coco_classes:
        assert ours.per_class_ap50[k] == pytest.approx(ap_tk[0, k], abs=0.002), k
        assert ours.per_class_ap50_95[k] == pytest.approx(ap_tk[:, k].mean(), abs=0.002), k
        annotations = [a for a in gt_json["annotations"] if a["category_id"] == k]
        assert ours.per_class_instances[k] == len(annotations)
        assert ours.per_class_images[k] == len({a["image_id"] for a in annotations})
