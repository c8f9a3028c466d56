"""Run an exported `.onnx` detector with onnxruntime: the same (pred, names) interface `predict` uses for
torch models. The file's metadata is read with `ast.literal_eval` (data only, never code)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import torch

from yolov5_smddp.errors import ConfigError, WeightsError


def parse_names(value: str | None, nc: int) -> list[str]:
    """The `names` metadata ("{0: 'a', 1: 'b'}" or "['a', 'b']") → a list of nc names; class<i> where
    missing or unreadable."""
    names = [f"class{i}" for i in range(nc)]
    if not value:
        return names
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return names
    items = (
        parsed.items() if isinstance(parsed, dict) else enumerate(parsed) if isinstance(parsed, list) else ()
    )
    for key, name in items:
        if isinstance(key, int) and 0 <= key < nc:
            names[key] = str(name)
    return names


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
        try:
            self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own classes for corrupt or unsupported files
            raise WeightsError(f"{path}: cannot be loaded by onnxruntime ({exc})") from None
        (self.input,) = self.session.get_inputs()
        output = self.session.get_outputs()[0]
        nc = output.shape[2] - 5 if isinstance(output.shape[2], int) else 0
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
        (pred,) = self.session.run(None, {self.input.name: array})[:1]
        return torch.from_numpy(pred).float()
