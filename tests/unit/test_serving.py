"""The model folder that deploys: best.torchscript (+ best.onnx) and code/inference.py, which runs in a
fresh process where yolov5_smddp cannot be imported and answers as `yolov5-smddp predict` does."""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import logging

import cv2
import numpy as np
import pytest
import torch
from detections import assert_same_detections, run_handler, scene_image

from yolov5_smddp import export
from yolov5_smddp.cli import main
from yolov5_smddp.data.letterbox import letterbox
from yolov5_smddp.models.weights import save_weights
from yolov5_smddp.models.yolo import build_model
from yolov5_smddp.postprocess import non_max_suppression
from yolov5_smddp.serving import handler_source, serving_formats, write_model_folder

CONF = 0.1


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """(model dir, best.pt written beside it as training does, the model)."""
    root = tmp_path_factory.mktemp("serving")
    torch.manual_seed(0)
    model = build_model("yolov5n", nc=3)
    with torch.no_grad():  # an objectness prior that lets a random model detect something at CONF
        for conv in model.detect.m:
            conv.bias.view(model.detect.na, -1)[:, 4] += 4.0
    model.names = ["cat", "dog", "bird"]
    model_dir = root / "model"
    weights = save_weights(model_dir / "best.pt", model, meta={}, half=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    written = write_model_folder(model_dir, model, 160, float16_weights=True)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # left untouched
    assert model.training and any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())  # unfused
    assert sorted(written) == sorted(["handler", *serving_formats()])
    return model_dir, weights


def test_model_folder_holds_only_what_serving_needs(folder):
    model_dir, _ = folder
    files = sorted(str(p.relative_to(model_dir)) for p in model_dir.rglob("*") if p.is_file())
    assert files == ["best.onnx", "best.pt", "best.torchscript", "code/inference.py"]
    assert (model_dir / "code" / "inference.py").read_text() == handler_source()
    # self-contained: the standard library and what the SageMaker PyTorch inference container has
    tree = ast.parse(handler_source())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"__future__", "io", "json", "os", "cv2", "numpy", "torch", "torchvision"}
    total = sum((model_dir / f).stat().st_size for f in files)
    assert total < 30 * 2**20, total  # yolov5n: a few MB per file


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scene")
    scene_image(folder / "a.jpg")
    return folder / "a.jpg"


def test_handler_in_a_fresh_process_answers_as_predict(folder, scene, tmp_path):
    model_dir, weights = folder
    out = tmp_path / "predict"
    argv = ["predict", "--weights", str(weights), "--source", str(scene), "--out", str(out)]
    assert main([*argv, "--imgsz", "160", "--conf", str(CONF)]) == 0
    want = json.loads((out / "a.json").read_text())
    got = run_handler(model_dir, scene, "image/jpeg", YOLOV5_CONF=str(CONF))
    assert set(got) == {"width", "height", "detections"}
    assert len(want["detections"]) > 3
    assert_same_detections(got, want)
    # the same image as a .npy RGB array and as a PNG gives the same answer
    rgb = cv2.cvtColor(cv2.imread(str(scene)), cv2.COLOR_BGR2RGB)
    np.save(tmp_path / "a.npy", rgb)
    assert_same_detections(
        run_handler(model_dir, tmp_path / "a.npy", "application/x-npy", YOLOV5_CONF=str(CONF)), want
    )
    cv2.imwrite(str(tmp_path / "a.png"), cv2.imread(str(scene)))
    assert_same_detections(
        run_handler(model_dir, tmp_path / "a.png", "image/png", YOLOV5_CONF=str(CONF)), want
    )
    # the default threshold (0.25) as predict's default
    fewer = run_handler(model_dir, scene, "image/jpeg")
    assert all(d["score"] > 0.25 for d in fewer["detections"])
    assert len(fewer["detections"]) == sum(d["score"] > 0.25 for d in want["detections"])


def _handler_module(folder):
    spec = importlib.util.spec_from_file_location("inference_under_test", folder[0] / "code" / "inference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_handler_rejects_what_it_cannot_read(folder, monkeypatch):
    handler = _handler_module(folder)
    with pytest.raises(ValueError, match="unsupported content type 'text/csv'"):
        handler.input_fn(b"1,2", "text/csv")
    with pytest.raises(ValueError, match="not a decodable image/jpeg image"):
        handler.input_fn(b"not a jpeg", "image/jpeg")
    buffer = io.BytesIO()
    np.save(buffer, np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match=r"expected a uint8 \[H, W, 3\] RGB array, got float32 \[4, 4\]"):
        handler.input_fn(buffer.getvalue(), "application/x-npy")
    with pytest.raises(ValueError, match="unsupported accept type 'text/html'"):
        handler.output_fn({"width": 1, "height": 1, "detections": []}, "text/html")
    assert json.loads(handler.output_fn({"width": 1, "height": 2, "detections": []}, "application/json")) == {
        "width": 1,
        "height": 2,
        "detections": [],
    }
    monkeypatch.setenv("YOLOV5_CONF", "2")
    with pytest.raises(ValueError, match="YOLOV5_CONF 2.0"):
        handler.thresholds()
    monkeypatch.setenv("YOLOV5_CONF", "0.5")
    monkeypatch.setenv("YOLOV5_IOU", "0.6")
    monkeypatch.setenv("YOLOV5_MAX_DET", "7")
    assert handler.thresholds() == (0.5, 0.6, 7)


def test_handler_letterbox_and_nms_are_predicts(folder):
    """The handler's own copies of letterbox and NMS give exactly what the package's functions give."""
    handler = _handler_module(folder)
    image = np.random.default_rng(0).integers(0, 255, (75, 203, 3), dtype=np.uint8)
    for shape in ((160, 160), (96, 224), (320, 128)):
        got, want = handler.letterbox(image, shape), letterbox(image, shape, auto=False)
        assert np.array_equal(got[0], want[0]) and got[1:] == want[1:]
    pred = torch.rand(1, 500, 8, generator=torch.Generator().manual_seed(1))
    pred[..., :2] *= 160
    pred[..., 2:4] *= 40
    for conf, iou, max_det in ((0.25, 0.45, 300), (0.1, 0.3, 5)):
        (want,) = non_max_suppression(pred, conf, iou, max_det=max_det)
        assert torch.equal(handler.nms(pred[0], conf, iou, max_det), want)


def test_a_failing_onnx_export_leaves_a_folder_that_deploys(tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("exporter bug")

    monkeypatch.setattr(export, "_onnx", broken)
    with caplog.at_level(logging.WARNING):
        written = write_model_folder(tmp_path, build_model("yolov5n", nc=2), 64)
    assert sorted(written) == ["handler", "torchscript"]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "best.torchscript",
        "code/inference.py",
    ]
    assert "best.onnx not written (RuntimeError: exporter bug)" in caplog.text
