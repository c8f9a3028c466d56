"""`info` (parameters, GFLOPs) and `predict` (JSON in original-image pixels, annotated images, errors)."""

from __future__ import annotations

import json
import re

import cv2
import numpy as np
import pytest
import torch

from yolov5_smddp.cli import main
from yolov5_smddp.commands.predict import to_original_pixels
from yolov5_smddp.data.letterbox import letterbox
from yolov5_smddp.inference.predict_output import detection_records
from yolov5_smddp.inference.predict_sources import output_stems
from yolov5_smddp.models.flops import model_report
from yolov5_smddp.models.weights import save_weights
from yolov5_smddp.models.yolo import build_model


def test_info_yolov5s_parameters_and_gflops(capsys):
    assert main(["info", "--cfg", "yolov5s.yaml"]) == 0
    out = capsys.readouterr().out
    assert "7,235,389 parameters" in out
    gflops = float(re.search(r"([\d.]+) GFLOPs at 640x640", out).group(1))
    assert abs(gflops - 16.5) / 16.5 < 0.02
    assert "unfused" in out
    assert re.search(r"^\s+24\s+\[17, 20, 23\]\s+1\s+229,245\s+Detect", out, re.M)


def test_report_rows_add_up_and_scale_with_image_size():
    with torch.device("meta"):
        model = build_model("yolov5n", nc=3)
    report = model_report(model, 320)
    assert sum(row.params for row in report.layers) == report.parameters
    assert report.layers[2].repeats == 1 and report.layers[2].block == "C3"
    assert model_report(model, (320, 640)).gflops == pytest.approx(2 * report.gflops, rel=1e-3)


def test_info_rejects_bad_image_size(capsys):
    assert main(["info", "--cfg", "yolov5n", "--imgsz", "100"]) == 2
    assert "imgsz 100" in capsys.readouterr().err


def test_letterbox_boxes_map_back_to_original_pixels():
    original = np.zeros((60, 100, 3), np.uint8)  # h 60, w 100
    original[12:42, 20:71] = 255  # a white box x 20..71, y 12..42 (xyxy, exclusive ends)
    padded, ratio, pad = letterbox(original, 64, auto=False)
    assert padded.shape[:2] == (64, 64) and pad == (0.0, 13.0)
    ys, xs = np.nonzero(padded[..., 0] > 127)
    found = torch.tensor([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], dtype=torch.float32)
    mapped = to_original_pixels(found, (64, 64), (60, 100), ratio, pad)
    torch.testing.assert_close(mapped, torch.tensor([[20.0, 12.0, 71.0, 42.0]]), atol=2.0, rtol=0)
    # exact values: gain 0.64 in x, 38/60 in y, 13 px padding at the top
    exact = to_original_pixels(torch.tensor([[0.0, 13.0, 64.0, 51.0]]), (64, 64), (60, 100), ratio, pad)
    torch.testing.assert_close(exact, torch.tensor([[0.0, 0.0, 100.0, 60.0]]))
    clipped = to_original_pixels(torch.tensor([[-5.0, 0.0, 70.0, 64.0]]), (64, 64), (60, 100), ratio, pad)
    assert clipped.tolist() == [[0.0, 0.0, 100.0, 60.0]]


def test_detection_records_and_output_names(tmp_path):
    det = torch.tensor([[1.234, 2.0, 30.0, 40.0, 0.912345, 1.0]])
    assert detection_records(det, ["a", "b"]) == [
        {"box_xyxy": [1.23, 2.0, 30.0, 40.0], "class_id": 1, "class_name": "b", "score": 0.91234}
    ]
    assert output_stems([tmp_path / "x.jpg", tmp_path / "x.png", tmp_path / "y.jpg"]) == [
        "x_jpg",
        "x_png",
        "y",
    ]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    torch.manual_seed(0)
    model = build_model("yolov5n", nc=3)
    model.names = ["cat", "dog", "bird"]
    return save_weights(tmp_path_factory.mktemp("w") / "tiny.pt", model, meta={})


def test_predict_writes_json_in_original_pixels(tmp_path, weights):
    source = tmp_path / "images"
    source.mkdir()
    rng = np.random.default_rng(0)
    cv2.imwrite(str(source / "wide.png"), rng.integers(0, 255, (90, 150, 3), dtype=np.uint8))
    cv2.imwrite(str(source / "tall.jpg"), rng.integers(0, 255, (130, 70, 3), dtype=np.uint8))
    (source / "notes.txt").write_text("not an image")
    out = tmp_path / "out"
    rc = main(
        [
            "predict",
            "--weights",
            str(weights),
            "--source",
            str(source),
            "--out",
            str(out),
            "--imgsz",
            "64",
            "--conf",
            "0.0005",
        ]
    )
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == ["tall.jpg", "tall.json", "wide.jpg", "wide.json"]
    assert sorted(p.name for p in source.iterdir()) == ["notes.txt", "tall.jpg", "wide.png"]
    for stem, (h, w) in (("wide", (90, 150)), ("tall", (130, 70))):
        result = json.loads((out / f"{stem}.json").read_text())
        assert (result["height"], result["width"]) == (h, w)
        assert result["detections"], "a low threshold on a random model gives detections"
        for d in result["detections"]:
            x1, y1, x2, y2 = d["box_xyxy"]
            assert 0 <= x1 <= x2 <= w and 0 <= y1 <= y2 <= h
            assert d["class_name"] == ["cat", "dog", "bird"][d["class_id"]] and 0.0005 < d["score"] <= 1
        assert cv2.imread(str(out / f"{stem}.jpg")).shape == (h, w, 3)


def test_predict_errors_are_clear(tmp_path, weights, capsys):
    out = tmp_path / "out"
    assert (
        main(
            ["predict", "--weights", str(weights), "--source", str(tmp_path / "nope.jpg"), "--out", str(out)]
        )
        == 2
    )
    assert "nope.jpg does not exist" in capsys.readouterr().err
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 definitely not a jpeg")
    assert (
        main(
            [
                "predict",
                "--weights",
                str(weights),
                "--source",
                str(broken),
                "--out",
                str(out),
                "--imgsz",
                "64",
            ]
        )
        == 2
    )
    assert f"no image could be used (first: {broken}: corrupt JPEG (truncated" in capsys.readouterr().err
    bare = tmp_path / "bare.pt"
    torch.save({"model.0.conv.weight": torch.zeros(1)}, bare)
    cv2.imwrite(str(tmp_path / "ok.png"), np.zeros((32, 32, 3), np.uint8))
    assert (
        main(["predict", "--weights", str(bare), "--source", str(tmp_path / "ok.png"), "--out", str(out)])
        == 2
    )
    assert "bare.pt: holds only a state dict" in capsys.readouterr().err
    assert (
        main(["predict", "--weights", str(weights), "--source", str(tmp_path), "--out", str(tmp_path)]) == 2
    )
    assert "is the source folder" in capsys.readouterr().err
    inside = ["--out", str(tmp_path / "preds")]
    assert main(["predict", "--weights", str(weights), "--source", str(tmp_path), *inside]) == 2
    assert "is inside the source folder" in capsys.readouterr().err
    assert not (tmp_path / "preds").exists()
