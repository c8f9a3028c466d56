"""Writes checkpoints in the release's format (a pickled whole model, classes named models.yolo.* and
models.common.*) from one of OUR models, for the integration test that fine-tunes from a model trained
here. Tests of reading the release's files use the genuine checkpoints the release's own code pickled
(tests/fixtures/release_models, made by bench/release_reference/make_model_fixtures.py), never this.

Stand-in classes carrying the release's module and class names are registered in sys.modules only while
torch.save runs; the file then holds exactly what a release `.pt` holds: the model object with `yaml`,
`names` and `stride` attributes in a dict with the release's keys, weights in float16.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import torch
import yaml
from torch import nn

from yolov5_smddp.models import blocks, detect
from yolov5_smddp.models.yolo import DetectionModel, build_model


def release_yaml(config: dict, *, with_layers: bool = True) -> dict:
    """Our model config (the release's yaml format) as a release checkpoint stores it: the dict
    `yaml.safe_load` gives (Upsample's first argument the string 'None'); `with_layers=False` keeps only nc,
    the multiples and the anchors."""
    keys = ["nc", "depth_multiple", "width_multiple", "anchors", "activation"]
    keys += ["backbone", "head"] if with_layers else []
    return yaml.safe_load(yaml.safe_dump({k: config[k] for k in keys if k in config}, sort_keys=False))


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
        cls: stand_in(cls, common_mod, cls.__name__)
        for cls in vars(blocks).values()
        if isinstance(cls, type) and issubclass(cls, nn.Module) and cls.__module__ == blocks.__name__
    }
    mapping[detect.Detect] = stand_in(detect.Detect, yolo_mod, "Detect")

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
