"""`val` options: the release's spellings (--conf-thres, --iou-thres, --task, --img), --single-cls for a
model trained that way, and output folders made (or refused in one line) before scoring."""

from __future__ import annotations

import json
import re

import pytest
import torch

from yolov5_smddp.cli import build_parser, main
from yolov5_smddp.data.synthetic import make_default_dataset
from yolov5_smddp.models.weights import save_weights
from yolov5_smddp.models.yolo import build_model


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return make_default_dataset(root, n_train=2, n_val=4, imgsz=96, seed=3)


def _weights(folder, nc: int):
    torch.manual_seed(0)
    model = build_model("yolov5n", nc=nc)
    model.names = ["item"] if nc == 1 else ["rectangle", "ellipse", "triangle"]
    return save_weights(folder / f"nc{nc}.pt", model, meta={})


def test_release_spellings_mean_the_same():
    parser = build_parser()
    ours = parser.parse_args(["val", "--weights", "w", "--data", "d", "--conf", "0.2", "--iou", "0.5"])
    release = parser.parse_args(
        [
            "val",
            "--weights",
            "w",
            "--data",
            "d",
            "--conf-thres",
            "0.2",
            "--iou-thres",
            "0.5",
            "--task",
            "test",
        ]
    )
    assert (release.conf, release.iou, release.split) == (ours.conf, ours.iou, "test")
    assert parser.parse_args(["val", "--weights", "w", "--data", "d", "--img-size", "320"]).imgsz == 320
    assert parser.parse_args(["val", "--weights", "w", "--data", "d", "--img", "320"]).imgsz == 320
    for command in (["predict", "--source", "s", "--out", "o"], ["export"]):
        args = parser.parse_args([command[0], "--weights", "w", *command[1:], "--img-size", "320", "256"])
        assert args.imgsz == [320, 256]


def test_single_cls_model_is_scored_on_its_own_data_yaml(tmp_path, dataset, capsys):
    weights = _weights(tmp_path, nc=1)
    argv = ["val", "--weights", str(weights), "--data", str(dataset), "--img", "64", "--batch-size", "4"]
    argv += ["--workers", "1", "--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "has 1 classes but" in err and "(a --single-cls model: add --single-cls)" in err
    metrics = tmp_path / "new" / "deeper" / "m.json"
    out = tmp_path / "new" / "coco"
    assert (
        main([*argv, "--single-cls", "--metrics-json", str(metrics), "--save-json", "--output-dir", str(out)])
        == 0
    )
    printed = capsys.readouterr().out
    summary = json.loads(metrics.read_text())
    assert [(row["class"], row["name"]) for row in summary["per_class"]] == [(0, "item")]
    assert summary["images"] == 4 and summary["targets"] > 0
    assert re.search(r"\bimages=4 ", printed)
    gt = json.loads((out / "ground_truth.json").read_text())
    assert {a["category_id"] for a in gt["annotations"]} == {0}
    assert gt["categories"] == [{"id": 0, "name": "item"}]


def test_an_output_folder_that_cannot_be_made_is_one_line(tmp_path, dataset, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    weights = _weights(tmp_path, nc=3)
    argv = ["val", "--weights", str(weights), "--data", str(dataset), "--img", "64", "--workers", "1"]
    assert main([*argv, "--metrics-json", str(blocker / "m.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --metrics-json: cannot make the folder {blocker} (File exists)"
    assert main([*argv, "--save-json", "--output-dir", str(blocker / "sub")]) == 2
    assert (
        f"error: --output-dir: cannot make the folder {blocker / 'sub'} (Not a directory)"
        in capsys.readouterr().err
    )
