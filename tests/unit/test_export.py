"""`export`: TorchScript and ONNX files compute the torch model's eval output (within 1e-4 relative) for
n and s, static and dynamic, in the layout ONNX users of YOLOv5 expect; the release's .pt as input;
`predict` on the .onnx file gives predict's detections on the .pt file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from detections import assert_same_detections, randomise_batchnorm, scene_image

from yolov5_smddp.cli import main
from yolov5_smddp.inference.export import ExportOptions, export_model, names_literal
from yolov5_smddp.inference.exported_models import TorchScriptDetector
from yolov5_smddp.inference.onnx_model import parse_names
from yolov5_smddp.models.weights import load_model, save_weights
from yolov5_smddp.models.yolo import build_model

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

TOLERANCE = 1e-4  # max |export - torch| / max |torch|


def relative_error(got: torch.Tensor | np.ndarray, ref: torch.Tensor) -> float:
    got = torch.as_tensor(np.asarray(got)).float()
    return float((got - ref).abs().max() / ref.abs().max())


def _model(size: str, nc: int = 3):
    torch.manual_seed({"n": 0, "s": 1}[size])
    model = build_model(f"yolov5{size}", nc=nc)
    randomise_batchnorm(model)
    model.names = [f"thing {i}" for i in range(nc)]
    return model.eval()


def _eval(model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(x)[0]


@pytest.fixture(scope="module", params=["n", "s"])
def exported(request, tmp_path_factory):
    """(size, unfused torch model, {(format, dynamic): path}) at 128 x 160 (h x w), batch 2."""
    folder = tmp_path_factory.mktemp(f"export_{request.param}")
    model = _model(request.param)
    reference = _model(request.param)  # same seed: same weights, left unfused
    files = {}
    for dynamic in (False, True):
        options = ExportOptions(
            include=("torchscript", "onnx") if not dynamic else ("onnx",),
            imgsz=(128, 160),
            batch_size=2,
            dynamic=dynamic,
        )
        stem = folder / ("dynamic" if dynamic else "static") / "best"
        for fmt, path in export_model(_model(request.param), stem, options).items():
            files[fmt, dynamic] = path
    del model
    return request.param, reference, files


def test_torchscript_matches_the_torch_model(exported):
    size, reference, files = exported
    extra = {"config.txt": ""}
    module = torch.jit.load(str(files["torchscript", False]), map_location="cpu", _extra_files=extra)
    config = json.loads(extra["config.txt"])
    assert config["shape"] == [2, 3, 128, 160] and config["stride"] == 32 and config["imgsz"] == [128, 160]
    assert config["names"] == {"0": "thing 0", "1": "thing 1", "2": "thing 2"}
    x = torch.rand(2, 3, 128, 160, generator=torch.Generator().manual_seed(5))
    ref = _eval(reference, x)
    with torch.no_grad():
        got = module(x)
    assert got.shape == ref.shape == (2, 3 * (16 * 20 + 8 * 10 + 4 * 5), 8)
    error = relative_error(got, ref)
    print(f"yolov5{size} torchscript max relative error {error:.2e}")
    assert error < TOLERANCE


def test_predict_runs_a_torchscript_file_as_exported_on_every_call(tmp_path):
    """predict's TorchScript backend answers image after image with the graph as exported: the bits of a
    freshly loaded module's first call (TorchScript optimizes after it), as the endpoint's handler does."""
    path = export_model(_model("n"), tmp_path / "best", ExportOptions(imgsz=(160, 160)))["torchscript"]
    x = torch.rand(1, 3, 160, 160, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        first = torch.jit.load(str(path), map_location="cpu")(x)
    detector = TorchScriptDetector(path, torch.device("cpu"))
    assert detector.fixed_size() == (160, 160)
    got = [detector(x) for _ in range(4)]
    assert all(torch.equal(first, g) for g in got), [(first - g).abs().max().item() for g in got]


@pytest.mark.parametrize("dynamic", [False, True])
def test_onnx_layout_metadata_and_values(exported, dynamic):
    size, reference, files = exported
    path = files["onnx", dynamic]
    graph = onnx.load(str(path))
    meta = {p.key: p.value for p in graph.metadata_props}
    assert meta == {"stride": "32", "names": "{0: 'thing 0', 1: 'thing 1', 2: 'thing 2'}"}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inp,), (out,) = session.get_inputs(), session.get_outputs()
    assert (inp.name, out.name) == ("images", "output0")
    assert inp.type == out.type == "tensor(float)"
    if dynamic:
        assert inp.shape == ["batch", 3, "height", "width"] and out.shape == ["batch", "anchors", 8]
        shapes = [(2, 128, 160), (1, 96, 224)]  # another batch size and input size too
    else:
        assert inp.shape == [2, 3, 128, 160] and out.shape == [2, 1260, 8]
        shapes = [(2, 128, 160)]
    for batch, h, w in shapes:
        x = torch.rand(batch, 3, h, w, generator=torch.Generator().manual_seed(h))
        ref = _eval(reference, x)
        (got,) = session.run(["output0"], {"images": x.numpy()})
        assert got.shape == tuple(ref.shape)
        error = relative_error(got, ref)
        print(
            f"yolov5{size} onnx {'dynamic' if dynamic else 'static'} {batch}x{h}x{w} max relative error {error:.2e}"
        )
        assert error < TOLERANCE


@pytest.mark.parametrize("dynamic", [False, True])
def test_export_records_no_tracer_warning(tmp_path, dynamic):
    """Tracing the model leaves no Python branch on a traced value (the log a user reads stays clean):
    no TracerWarning from either exporter, static or dynamic."""
    import warnings

    include = ("onnx",) if dynamic else ("torchscript", "onnx")
    options = ExportOptions(include=include, imgsz=(64, 96), batch_size=2, dynamic=dynamic)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_model(_model("n"), tmp_path / "best", options)
    tracer = [str(w.message) for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    assert tracer == []


def test_names_metadata_round_trip():
    assert names_literal(["a", "b c", "d'e"]) == "{0: 'a', 1: 'b c', 2: \"d'e\"}"
    assert parse_names(names_literal(["a", "b c", "d'e"]), 3) == ["a", "b c", "d'e"]
    assert parse_names("['x', 'y']", 3) == ["x", "y", "class2"]
    assert parse_names("__import__('os').system('true')", 2) == ["class0", "class1"]  # never evaluated
    assert parse_names(None, 1) == ["class0"]
    # the TorchScript / OpenVINO metadata's parsed forms: the same rule
    assert parse_names({"1": "b", 0: "a", "x": "no", 5: "out"}, 3) == ["a", "b", "class2"]
    assert parse_names(["p"], 2) == ["p", "class1"]


def test_export_cli_from_the_releases_pt(tmp_path, capsys):
    weights = tmp_path / "weights" / "yolov5n.pt"
    weights.parent.mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "fixtures" / "release_models" / "yolov5n.pt", weights)
    out = tmp_path / "exported"
    argv = ["export", "--weights", str(weights), "--include", "onnx", "torchscript", "--imgsz", "96", "128"]
    assert main([*argv, "--output-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["yolov5n.onnx", "yolov5n.torchscript"]
    assert sorted(p.name for p in weights.parent.iterdir()) == ["yolov5n.pt"]  # nothing beside the weights
    reference = load_model(weights)
    x = torch.rand(1, 3, 96, 128, generator=torch.Generator().manual_seed(0))
    ref = _eval(reference, x)
    session = ort.InferenceSession(str(out / "yolov5n.onnx"), providers=["CPUExecutionProvider"])
    assert relative_error(session.run(None, {"images": x.numpy()})[0], ref) < TOLERANCE
    with torch.no_grad():
        assert relative_error(torch.jit.load(str(out / "yolov5n.torchscript"))(x), ref) < TOLERANCE
    names = {p.key: p.value for p in onnx.load(str(out / "yolov5n.onnx")).metadata_props}["names"]
    assert names.startswith("{0: 'class0', 1: 'class1'") and names.endswith("79: 'class79'}")
    # without --output-dir: beside the weights
    assert main(["export", "--weights", str(weights), "--imgsz", "64"]) == 0
    assert sorted(p.name for p in weights.parent.iterdir()) == ["yolov5n.pt", "yolov5n.torchscript"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--imgsz", "100"], "--imgsz 100 100: must be positive multiples of 32"),
        (["--imgsz", "64", "64", "64"], "--imgsz 64 64 64: give one size or height and width"),
        (["--half"], "--half: float16 export needs a GPU"),
        (["--batch-size", "0"], "--batch-size 0: must be at least 1"),
    ],
)
def test_export_rejects_bad_options(tmp_path, capsys, extra, message):
    weights = save_weights(tmp_path / "w.pt", _model("n"), meta={})
    assert main(["export", "--weights", str(weights), *extra]) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.pt"]


def test_export_names_a_missing_weights_file(tmp_path, capsys):
    assert main(["export", "--weights", str(tmp_path / "nope.pt")]) == 2
    assert "nope.pt does not exist" in capsys.readouterr().err


def test_predict_on_onnx_gives_the_detections_of_the_pt(tmp_path):
    model = _model("n")
    with torch.no_grad():  # an objectness prior that lets a random model detect something at --conf 0.1
        for conv in model.detect.m:
            conv.bias.view(model.detect.na, -1)[:, 4] += 4.0
    weights = save_weights(tmp_path / "w.pt", model, meta={})
    assert (
        main(["export", "--weights", str(weights), "--include", "onnx", "--imgsz", "160", "--dynamic"]) == 0
    )
    source = tmp_path / "images"
    source.mkdir()
    scene_image(source / "a.jpg")
    common = ["--source", str(source), "--imgsz", "160", "--conf", "0.1"]
    assert main(["predict", "--weights", str(weights), "--out", str(tmp_path / "pt"), *common]) == 0
    assert (
        main(["predict", "--weights", str(tmp_path / "w.onnx"), "--out", str(tmp_path / "onnx"), *common])
        == 0
    )
    want = json.loads((tmp_path / "pt" / "a.json").read_text())
    got = json.loads((tmp_path / "onnx" / "a.json").read_text())
    assert len(want["detections"]) > 0
    assert_same_detections(got, want)
