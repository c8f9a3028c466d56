"""`export --include openvino` (outputs within 1e-4 of torch, static and dynamic, the release's folder
layout), `--simplify`, the TensorRT refusal, and `predict` giving the same detections on the .pt, the
.onnx, the .torchscript and the OpenVINO folder."""

from __future__ import annotations

import importlib.util
import json
import logging

import pytest
import torch
import yaml
from detections import assert_same_detections, randomise_batchnorm, scene_image

from yolov5_smddp.cli import main
from yolov5_smddp.errors import ConfigError
from yolov5_smddp.inference import export
from yolov5_smddp.inference.export import ExportOptions, check_tensorrt, export_model
from yolov5_smddp.models.weights import save_weights
from yolov5_smddp.models.yolo import build_model

TOLERANCE = 1e-4  # max |export - torch| / max |torch|


def _model(nc: int = 3):
    torch.manual_seed(0)
    model = build_model("yolov5n", nc=nc)
    randomise_batchnorm(model)
    with torch.no_grad():
        for conv in model.detect.m:  # an objectness prior: a random model then detects at --conf 0.1
            conv.bias.view(model.detect.na, -1)[:, 4] += 4.0
    model.names = [f"thing {i}" for i in range(nc)]
    return model.eval()


def _reference(x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return _model()(x)[0]


def _relative_error(got, ref: torch.Tensor) -> float:
    return float((torch.as_tensor(got).float() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("dynamic", [False, True])
def test_openvino_matches_torch(tmp_path, dynamic):
    ov = pytest.importorskip("openvino")
    options = ExportOptions(include=("openvino",), imgsz=(128, 160), dynamic=dynamic)
    written = export_model(_model(), tmp_path / "best", options)
    folder = written["openvino"]
    assert folder == tmp_path / "best_openvino_model"
    assert sorted(p.name for p in folder.iterdir()) == ["best.bin", "best.xml", "metadata.yaml"]
    assert [p.name for p in tmp_path.iterdir()] == ["best_openvino_model"]  # no temporary left
    assert yaml.safe_load((folder / "metadata.yaml").read_text()) == {
        "stride": 32,
        "names": {0: "thing 0", 1: "thing 1", 2: "thing 2"},
    }
    parameters = sum(p.numel() for p in _model().fuse().parameters())
    assert (folder / "best.bin").stat().st_size > 0.9 * 4 * parameters  # float32 weights (float16: half that)
    core = ov.Core()
    # float32 arithmetic: on CPUs with bf16 units OpenVINO would otherwise choose bf16 (about 3e-4 off)
    compiled = core.compile_model(
        core.read_model(str(folder / "best.xml")), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
    )
    assert compiled.inputs[0].get_any_name() == "images" and compiled.outputs[0].get_any_name() == "output0"
    shapes = [(1, 128, 160), (2, 96, 224)] if dynamic else [(1, 128, 160)]
    for batch, h, w in shapes:
        x = torch.rand(batch, 3, h, w, generator=torch.Generator().manual_seed(h))
        got = compiled(x.numpy())[0]
        error = _relative_error(got, _reference(x))
        print(f"openvino {'dynamic' if dynamic else 'static'} {batch}x{h}x{w} max relative error {error:.2e}")
        assert got.shape == tuple(_reference(x).shape) and error < TOLERANCE


def test_simplify_uses_what_is_installed(tmp_path, caplog, monkeypatch):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    x = torch.rand(1, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    options = ExportOptions(include=("onnx",), imgsz=(64, 96), simplify=True)
    installed = [name for name in export.SIMPLIFIERS if importlib.util.find_spec(name) is not None]
    if installed:
        with caplog.at_level(logging.INFO):
            path = export_model(_model(), tmp_path / "slim", options)["onnx"]
        assert any(r.getMessage().startswith(f"--simplify: {installed[0]} ") for r in caplog.records)
        caplog.clear()
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert _relative_error(session.run(None, {"images": x.numpy()})[0], _reference(x)) < TOLERANCE
    monkeypatch.setattr(export, "SIMPLIFIERS", ("no_such_simplifier_a", "no_such_simplifier_b"))
    with caplog.at_level(logging.INFO):
        path = export_model(_model(), tmp_path / "plain", options)["onnx"]
    lines = [r.getMessage() for r in caplog.records if "--simplify" in r.getMessage()]
    assert lines == [
        "--simplify: skipped (neither no_such_simplifier_a nor no_such_simplifier_b is installed: "
        "pip install onnxslim)"
    ]
    assert path.is_file()


def test_tensorrt_engine_is_refused_with_the_reason(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"--include engine: TensorRT is not installed here"):
        check_tensorrt(torch.device("cuda"), importable=False)
    with pytest.raises(ConfigError, match=r"built on the GPU it runs on; give --device cuda"):
        check_tensorrt(torch.device("cpu"), importable=True)
    weights = save_weights(tmp_path / "w.pt", _model(), meta={})
    assert main(["export", "--weights", str(weights), "--include", "engine"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --include engine: ") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.pt"]


def test_predict_gives_the_same_detections_on_every_export(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("openvino")
    weights = save_weights(tmp_path / "w.pt", _model(), meta={})
    argv = ["export", "--weights", str(weights), "--img-size", "160", "--include"]
    assert main([*argv, "onnx", "torchscript", "openvino"]) == 0
    source = tmp_path / "images"
    source.mkdir()
    scene_image(source / "a.jpg")
    results = {}
    for name, model in (
        ("pt", weights),
        ("onnx", tmp_path / "w.onnx"),
        ("torchscript", tmp_path / "w.torchscript"),
        ("openvino", tmp_path / "w_openvino_model"),
        ("openvino_xml", tmp_path / "w_openvino_model" / "w.xml"),
    ):
        out = tmp_path / f"out_{name}"
        rc = main(
            ["predict", "--weights", str(model), "--source", str(source), "--out", str(out)]
            + ["--img", "160", "--conf", "0.1"]
        )
        assert rc == 0, name
        results[name] = json.loads((out / "a.json").read_text())
    assert len(results["pt"]["detections"]) > 0
    for name, got in results.items():
        print(name, len(got["detections"]), "detections")
        assert_same_detections(got, results["pt"])
        assert {d["class_name"] for d in got["detections"]} <= {"thing 0", "thing 1", "thing 2"}


def test_an_output_folder_or_file_that_cannot_be_written_is_one_line(tmp_path, capsys):
    weights = save_weights(tmp_path / "w.pt", _model(), meta={})
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main(["export", "--weights", str(weights), "--output-dir", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --output-dir: cannot make the folder {blocker / 'sub'} (Not a directory)"
    (tmp_path / "w.torchscript").mkdir()  # where the file should go: a folder
    assert main(["export", "--weights", str(weights), "--imgsz", "64"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: cannot write {tmp_path / 'w.torchscript'}: {tmp_path / 'w.torchscript'} is a folder where a file "
        "should be"
    )
