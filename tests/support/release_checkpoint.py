"""Writes checkpoints in the release's format (a pickled whole model, classes named models.yolo.* and
models.common.*) from one of our models, for tests of the allow-listed reader and of fine-tuning.

Stand-in classes carrying the release's module and class names are registered in sys.modules only while
torch.save runs; the file then holds exactly what a release `.pt` holds: the model object with `yaml`,
`names` and `stride` attributes in a dict with the release's keys, weights in float16.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import torch
from torch import nn

from yolov5_smddp.models import blocks, detect
from yolov5_smddp.models.yolo import DetectionModel, build_model

_RELEASE_MODULE = {"Upsample": "nn.Upsample"}


def release_yaml(config: dict, *, with_layers: bool = True) -> dict:
    """Our model config as the release writes its model yaml (`backbone` / `head` rows of
    [from, repeats, module, args]); `with_layers=False` keeps only nc and the multiples."""
    out = {
        "nc": config["nc"],
        "depth_multiple": config["depth_multiple"],
        "width_multiple": config["width_multiple"],
        "anchors": [list(row) for row in config["anchors"]],
    }
    if not with_layers:
        return out
    rows = []
    for layer in config["layers"]:
        block, args = layer["block"], list(layer.get("args", []))
        if block == "Upsample":
            args = [None, *args]
        if block == "Detect":
            args = ["nc", "anchors"]
        rows.append([layer.get("from", -1), layer.get("repeats", 1), _RELEASE_MODULE.get(block, block), args])
    out["backbone"], out["head"] = rows[:10], rows[10:]
    return out


def save_release_checkpoint(
    path: Path, model: DetectionModel, *, yaml: dict, names: list[str], ema: bool = True
) -> Path:
    """Write `model` (a copy of it, fp16) as the release would save a finished training run."""
    yolo_mod, common_mod = types.ModuleType("models.yolo"), types.ModuleType("models.common")

    def stand_in(base: type, module: types.ModuleType, name: str) -> type:
        cls = type(name, (base,), {"__module__": module.__name__, "__qualname__": name})
        setattr(module, name, cls)
        return cls

    mapping = {
        blocks.Conv: stand_in(blocks.Conv, common_mod, "Conv"),
        blocks.C3: stand_in(blocks.C3, common_mod, "C3"),
        blocks.Bottleneck: stand_in(blocks.Bottleneck, common_mod, "Bottleneck"),
        blocks.SPPF: stand_in(blocks.SPPF, common_mod, "SPPF"),
        blocks.Concat: stand_in(blocks.Concat, common_mod, "Concat"),
        detect.Detect: stand_in(detect.Detect, yolo_mod, "Detect"),
    }

    class ReleaseDetectionModel(nn.Module):
        pass

    ReleaseDetectionModel.__module__ = "models.yolo"
    ReleaseDetectionModel.__name__ = ReleaseDetectionModel.__qualname__ = "DetectionModel"
    yolo_mod.DetectionModel = ReleaseDetectionModel

    copy = build_model(model.cfg)
    copy.load_state_dict(model.state_dict())
    layers = []
    for layer in copy.model:
        for child in layer.modules():
            if type(child) in mapping:
                child.__class__ = mapping[type(child)]
            elif type(child) is blocks.Upsample:  # the release uses torch's class itself
                child.__class__ = nn.Upsample
        layers.append(layer)
    release = ReleaseDetectionModel()
    release.model = nn.Sequential(*layers)
    release.yaml = yaml
    release.names = dict(enumerate(names))
    release.stride = torch.tensor(copy.detect.strides)
    release = release.half()
    ckpt = {
        "epoch": -1,
        "best_fitness": None,
        "model": None if ema else release,
        "ema": release if ema else None,
        "updates": None,
        "optimizer": None,
        "opt": {"imgsz": 640},
        "git": {"commit": "test"},
        "date": "2022-11-22T00:00:00",
    }
    saved = {name: sys.modules.get(name) for name in ("models", "models.yolo", "models.common")}
    sys.modules.update(
        {"models": types.ModuleType("models"), "models.yolo": yolo_mod, "models.common": common_mod}
    )
    try:
        torch.save(ckpt, path)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return Path(path)
