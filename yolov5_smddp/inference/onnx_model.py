"""Run an exported `.onnx` detector with onnxruntime: the same (pred, names) interface `predict` uses for
torch models. The file's metadata is read with `ast.literal_eval` (data only, never code).

A model file is foreign input: before onnxruntime opens it, every tensor stored as external data must be
a regular file inside the model's own folder (a `location` such as `../../etc/passwd` is refused, never
read), and the one output must be [batch, boxes, 5 + classes]; every output row is checked at run time
(finite, scores in [0, 1]), so a file that is no detector is an error, never a prediction.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from yolov5_smddp.errors import ConfigError, WeightsError


def parse_names(value: object, nc: int) -> list[str]:
    """An export's `names` metadata → a list of nc names, class<i> where missing or unreadable: ONNX's
    text ("{0: 'a', 1: 'b'}" or "['a', 'b']", read with ast.literal_eval), or the mapping or list a
    TorchScript config.txt or an OpenVINO metadata.yaml holds (keys int or digit strings)."""
    names = [f"class{i}" for i in range(nc)]
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value) if value else None
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return names
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, name in items:
        index = int(key) if isinstance(key, int) or (isinstance(key, str) and key.isdigit()) else -1
        if 0 <= index < nc:
            names[index] = str(name)
    return names


def _tensors(graph) -> Iterator:
    """Every TensorProto of an onnx GraphProto: initializers, sparse initializers and node attributes,
    in subgraphs (If / Loop / Scan bodies) too."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _tensors(subgraph)


def check_external_data(path: Path) -> None:
    """WeightsError unless every external-data tensor of the .onnx file `path` lies in a regular file
    inside `path`'s folder (after links are resolved). Reads the file's protobuf only, no external data."""
    try:
        import onnx
    except ImportError:
        raise ConfigError(
            f"--weights {path}: checking an .onnx file needs the onnx package (pip install onnx)"
        ) from None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # a protobuf DecodeError, or onnx's own classes
        raise WeightsError(f"{path}: not a readable ONNX model ({type(exc).__name__})") from None
    folder = path.resolve().parent
    for tensor in _tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (folder / location).resolve()
        if not location or os.path.isabs(location) or not target.is_relative_to(folder):
            raise WeightsError(
                f"{path}: tensor {tensor.name!r} keeps its data in {location!r}, outside the model's folder "
                f"{folder}; refused (external data must sit beside the model)"
            )
        if not target.is_file():
            raise WeightsError(f"{path}: tensor {tensor.name!r}: its external data file {target} is missing")


def check_output(path: Path, shape: list) -> int:
    """The class count of a detector output of `shape` [batch, boxes, 5 + classes] (symbolic dims are
    strings); WeightsError naming the file when the output is no such tensor."""
    channels = shape[2] if len(shape) == 3 else None
    if not (isinstance(channels, str) or (isinstance(channels, int) and channels > 5)):
        raise WeightsError(
            f"{path}: its output has shape {list(shape)}; a detector's is [batch, boxes, 5 + classes]"
        )
    return channels - 5 if isinstance(channels, int) else 0


def check_predictions(path: Path, pred: np.ndarray) -> None:
    """WeightsError unless `pred` is [batch, boxes, > 5] with finite values and the objectness and class
    scores (columns 4:) in [0, 1], as an exported detector's sigmoid outputs are."""
    if pred.ndim != 3 or pred.shape[2] <= 5:
        raise WeightsError(
            f"{path}: the model returned shape {list(pred.shape)}; a detector's is [batch, boxes, 5 + classes]"
        )
    if not np.isfinite(pred).all():
        raise WeightsError(
            f"{path}: the model returned non-finite values (NaN or inf); not a working detector"
        )
    scores = pred[..., 4:]
    if scores.size and (scores.min() < 0.0 or scores.max() > 1.0):
        worst = scores.max() if scores.max() > 1.0 else scores.min()
        raise WeightsError(
            f"{path}: the model returned a score of {float(worst):g}, outside [0, 1]; not a detector exported "
            "by yolov5-smddp export (or its weights are not a detector's)"
        )


class OnnxDetector:
    """An `.onnx` file exported by `yolov5-smddp export` (or the release's export): call it with float
    images [B, 3, H, W] in [0, 1] → pred [B, N, 5 + nc] as a torch tensor."""

    def __init__(self, path: Path) -> None:
        try:
            import onnxruntime
        except ImportError:
            raise ConfigError(
                f"--weights {path}: running .onnx files needs the onnxruntime package (pip install onnxruntime)"
            ) from None
        if not path.is_file():
            raise WeightsError(f"weights file {path} does not exist")
        check_external_data(path)
        try:
            self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own classes for corrupt or unsupported files
            raise WeightsError(f"{path}: cannot be loaded by onnxruntime ({exc})") from None
        self.path = path
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if len(inputs) != 1 or len(inputs[0].shape) != 4 or not outputs:
            raise WeightsError(
                f"{path}: {len(inputs)} input(s) of shape {[list(i.shape) for i in inputs]}; a detector has "
                "one [batch, 3, height, width] input"
            )
        (self.input,) = inputs
        nc = check_output(path, list(outputs[0].shape))
        meta = self.session.get_modelmeta().custom_metadata_map
        self.names = parse_names(meta.get("names"), nc)
        self.stride = int(meta.get("stride", "32")) if meta.get("stride", "32").isdigit() else 32
        self.half = "float16" in self.input.type

    def fixed_size(self) -> tuple[int, int] | None:
        """(h, w) when the file was exported for one input size, else None (dynamic)."""
        h, w = self.input.shape[2], self.input.shape[3]
        return (h, w) if isinstance(h, int) and isinstance(w, int) else None

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        array = images.cpu().numpy().astype(np.float16 if self.half else np.float32)
        try:
            (pred,) = self.session.run(None, {self.input.name: array})[:1]
        except Exception as exc:  # onnxruntime's own classes: a graph that fails on a real input
            raise WeightsError(
                f"{self.path}: onnxruntime could not run it ({' '.join(str(exc).split())})"
            ) from None
        pred = np.asarray(pred, dtype=np.float32)
        check_predictions(self.path, pred)
        return torch.from_numpy(pred)
