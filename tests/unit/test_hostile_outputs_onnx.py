"""Hostile .onnx files (issue 42, item 4), built at test time with the real `onnx` package: external data
outside the model's folder is refused before onnxruntime opens the file (never read), an output of the
wrong rank is one line, and scores outside [0, 1] are an error, never predictions."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from yolov5_smddp.cli import main
from yolov5_smddp.errors import WeightsError
from yolov5_smddp.inference.onnx_model import OnnxDetector

SIZE = 64


def _detector_file(
    folder: Path,
    values: np.ndarray,
    *,
    external: str | None = None,
    output_shape: list[int] | None = None,
) -> Path:
    """model.onnx: input `images` [1, 3, 64, 64], output `output0` = a constant `values` (its data inline,
    or in the file `external` names, relative to the model's folder, written when it is inside)."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = numpy_helper.from_array(values.astype(np.float32), "weights")
    if external is not None:
        weights.data_location = TensorProto.EXTERNAL
        entry = weights.external_data.add()
        entry.key, entry.value = "location", external
        length = weights.external_data.add()
        length.key, length.value = "length", str(values.astype(np.float32).nbytes)
        weights.ClearField("raw_data")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["weights"], ["output0"])],
        "detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, output_shape or list(values.shape))],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _rows(score: float) -> np.ndarray:
    """[1, 2, 7]: two boxes (xc, yc, w, h in input pixels, objectness, 2 class scores)."""
    return np.array([[[32, 32, 16, 16, score, score, 0.1], [10, 10, 4, 4, 0.2, 0.1, 0.3]]], np.float32)


@pytest.fixture
def source(tmp_path) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    cv2.imwrite(str(folder / "a.jpg"), np.full((48, 64, 3), 128, np.uint8))
    return folder


def _predict(weights: Path, source: Path, out: Path, capsys) -> tuple[int, str]:
    code = main(["predict", "--weights", str(weights), "--source", str(source), "--out", str(out)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_external_data_outside_the_models_folder_is_refused_unread(tmp_path, source, capsys):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.full(14, 13320.0, np.float32).tobytes())  # would become "scores" of 13320
    model = _detector_file(tmp_path / "models", _rows(0.5), external="../secret.bin")
    code, err = _predict(model, source, tmp_path / "out", capsys)
    assert code == 2
    assert err == (
        f"error: {model}: tensor 'weights' keeps its data in '../secret.bin', outside the model's folder "
        f"{model.parent}; refused (external data must sit beside the model)\n"
    )
    assert not (tmp_path / "out").exists()


def test_a_link_beside_the_model_that_points_outside_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 56)
    folder = tmp_path / "models"
    model = _detector_file(folder, _rows(0.5), external="w.bin")
    (folder / "w.bin").symlink_to(tmp_path / "secret.bin")
    with pytest.raises(WeightsError, match=r"keeps its data in 'w\.bin', outside the model's folder"):
        OnnxDetector(model)


def test_an_absolute_location_is_refused(tmp_path):
    model = _detector_file(tmp_path, _rows(0.5), external="/etc/passwd")
    with pytest.raises(WeightsError, match=r"keeps its data in '/etc/passwd', outside the model's folder"):
        OnnxDetector(model)


def test_external_data_beside_the_model_is_served(tmp_path, source, capsys):
    folder = tmp_path / "models"
    model = _detector_file(folder, _rows(0.9), external="w.bin")
    (folder / "w.bin").write_bytes(_rows(0.9).tobytes())
    code, _ = _predict(model, source, tmp_path / "out", capsys)
    assert code == 0
    detections = json.loads((tmp_path / "out" / "a.json").read_text())["detections"]
    assert [round(d["score"], 2) for d in detections] == [0.81]  # 0.9 objectness x 0.9 class


def test_scores_outside_0_1_are_an_error(tmp_path, source, capsys):
    model = _detector_file(tmp_path / "models", _rows(13320.0))
    code, err = _predict(model, source, tmp_path / "out", capsys)
    assert code == 2
    assert err == (
        f"error: {model}: the model returned a score of 13320, outside [0, 1]; not a detector exported by "
        "yolov5-smddp export (or its weights are not a detector's)\n"
    )
    assert not list((tmp_path / "out").glob("*.json"))


def test_non_finite_outputs_are_an_error(tmp_path):
    values = _rows(0.5)
    values[0, 0, 0] = np.nan
    detector = OnnxDetector(_detector_file(tmp_path, values))
    with pytest.raises(WeightsError, match="returned non-finite values"):
        detector(torch.zeros(1, 3, SIZE, SIZE))


@pytest.mark.parametrize("shape", [[1, 7], [14], [1, 2, 7, 1], [1, 2, 5]])
def test_an_output_of_the_wrong_rank_is_one_line(tmp_path, source, capsys, shape):
    model = _detector_file(tmp_path / "models", np.zeros(shape, np.float32), output_shape=shape)
    code, err = _predict(model, source, tmp_path / "out", capsys)
    assert code == 2
    assert err == (
        f"error: {model}: its output has shape {shape}; a detector's is [batch, boxes, 5 + classes]\n"
    )


def test_a_file_that_is_not_onnx_is_one_line(tmp_path, source, capsys):
    model = tmp_path / "model.onnx"
    model.write_bytes(b"\xff" * 100)
    code, err = _predict(model, source, tmp_path / "out", capsys)
    assert code == 2 and err == f"error: {model}: not a readable ONNX model (DecodeError)\n"
