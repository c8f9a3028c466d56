"""Run an exported TorchScript file or OpenVINO IR folder with the interface `predict` uses for `.onnx`
files (`onnx_model.OnnxDetector`): call with float images [B, 3, H, W] RGB in [0, 1] → pred [B, N, 5 + nc]
(a torch tensor); `names` (list of nc); `fixed_size()` → (h, w) the file was exported for, or None.

Class names come from the export's own metadata: TorchScript's `config.txt` extra file (JSON), the
OpenVINO folder's `metadata.yaml` (read with yaml.safe_load, at most 16 MiB); `class<i>` where missing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import yaml

from yolov5_smddp.errors import ConfigError, WeightsError
from yolov5_smddp.inference.export import OPENVINO_METADATA, SUFFIXES, TORCHSCRIPT_CONFIG
from yolov5_smddp.inference.onnx_model import parse_names

MAX_METADATA_BYTES = 16 * 2**20


def exported_format(path: Path) -> str | None:
    """ "onnx", "torchscript", "openvino" (a folder holding an .xml, or the .xml itself) or None (a .pt)."""
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        return "onnx"
    if suffix == SUFFIXES["torchscript"]:
        return "torchscript"
    if suffix == ".xml" or path.is_dir():
        return "openvino"
    return None


class TorchScriptDetector:
    """A `.torchscript` file written by `export`: traced for one input size, so fed that size."""

    def __init__(self, path: Path, device: torch.device) -> None:
        if not path.is_file():
            raise WeightsError(f"weights file {path} does not exist")
        extra = {TORCHSCRIPT_CONFIG: ""}
        try:
            self.module = torch.jit.load(str(path), map_location=device, _extra_files=extra).eval()
        except (RuntimeError, ValueError) as exc:
            raise WeightsError(
                f"{path}: not a TorchScript file torch can load ({str(exc).splitlines()[0]})"
            ) from None
        try:
            config = json.loads(extra[TORCHSCRIPT_CONFIG] or "{}")
        except json.JSONDecodeError:
            config = {}
        shape = config.get("shape") if isinstance(config, dict) else None
        if not (isinstance(shape, list) and len(shape) == 4 and all(isinstance(v, int) for v in shape)):
            raise WeightsError(
                f"{path}: no {TORCHSCRIPT_CONFIG} with the input shape; export it with `export`"
            )
        if shape[0] != 1:
            raise ConfigError(
                f"--weights {path}: exported for batch size {shape[0]}; predict feeds one image at a time "
                f"(export with --batch-size 1)"
            )
        self.shape = (shape[2], shape[3])
        self.dtype = torch.float16 if config.get("half") else torch.float32
        self.device = device
        nc = self._nc()
        self.names = parse_names(config.get("names", {}), nc)

    def _nc(self) -> int:
        with torch.no_grad():
            return int(self(torch.zeros(1, 3, *self.shape)).shape[2]) - 5

    def fixed_size(self) -> tuple[int, int]:
        return self.shape

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        # the graph as exported on every call, as the endpoint's handler runs it (serving/inference.py's
        # forward): TorchScript's optimizing executor would switch graphs after the first call(s)
        with torch.no_grad(), torch.jit.optimized_execution(False):
            return self.module(images.to(self.device, self.dtype)).float()


class OpenVinoDetector:
    """An OpenVINO IR (`<stem>_openvino_model/` from `export`, or the release's), run on the CPU."""

    def __init__(self, path: Path) -> None:
        try:
            import openvino
        except ImportError:
            raise ConfigError(
                f"--weights {path}: running OpenVINO IR needs the openvino package (pip install openvino)"
            ) from None
        xml = self._xml(path)
        try:
            core = openvino.Core()
            model = core.read_model(str(xml))
            # float32 as the export: on CPUs with bf16 units OpenVINO would otherwise pick bf16 arithmetic
            self.compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        except Exception as exc:  # OpenVINO raises its own RuntimeError subclasses for bad files
            raise WeightsError(f"{xml}: cannot be loaded by OpenVINO ({str(exc).splitlines()[0]})") from None
        shape = self.compiled.inputs[0].get_partial_shape()
        out = self.compiled.outputs[0].get_partial_shape()
        self.fixed = (shape[2].get_length(), shape[3].get_length()) if shape.is_static else None
        if shape.is_static and shape[0].get_length() != 1:
            raise ConfigError(
                f"--weights {path}: exported for batch size {shape[0].get_length()}; predict feeds one image "
                f"at a time (export with --batch-size 1 or --dynamic)"
            )
        nc = out[2].get_length() - 5 if out.rank.is_static and out[2].is_static else 0
        self.names = parse_names(self._metadata(xml.parent).get("names", {}), nc)

    @staticmethod
    def _xml(path: Path) -> Path:
        if path.suffix.lower() == ".xml":
            if not path.is_file():
                raise WeightsError(f"weights file {path} does not exist")
            return path
        if not path.is_dir():
            raise WeightsError(f"weights folder {path} does not exist")
        found = sorted(path.glob("*.xml"))
        if len(found) != 1:
            raise WeightsError(
                f"--weights {path}: an OpenVINO folder holds exactly one .xml (found {len(found)})"
            )
        return found[0]

    @staticmethod
    def _metadata(folder: Path) -> dict:
        path = folder / OPENVINO_METADATA
        if not path.is_file():
            return {}
        with open(path, "rb") as handle:
            data = handle.read(MAX_METADATA_BYTES + 1)
        if len(data) > MAX_METADATA_BYTES:
            return {}
        try:
            parsed = yaml.safe_load(data)
        except yaml.YAMLError:
            return {}
        return parsed if isinstance(parsed, dict) else {}

    def fixed_size(self) -> tuple[int, int] | None:
        return self.fixed

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        array = np.ascontiguousarray(images.cpu().numpy().astype(np.float32))
        return torch.from_numpy(self.compiled(array)[0].copy())
