import numpy as np
import pytest
import torch

from yolov5_smddp.metrics import MetricAccumulator, ap_per_class, fitness, match_predictions


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
