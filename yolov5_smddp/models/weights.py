"""Checkpoint I/O for models: our own weights format, and the release's `.pt` files read safely.

Ours: `torch.save` of {"format", "state_dict": plain tensors, "meta": JSON-able metadata}, written
atomically and read back with `torch.load(weights_only=True)`. The release's `.pt` (pickled model
objects) goes through the allow-listed reader in `release_pickle`.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from yolov5_smddp.atomic import atomic_write
from yolov5_smddp.ema import unwrap
from yolov5_smddp.errors import ConfigError, WeightsError
from yolov5_smddp.models.release_pickle import ReleaseModel, read_release_checkpoint
from yolov5_smddp.models.yolo import PACKAGE_CONFIGS, DetectionModel, build_model, load_model_config

FORMAT = "yolov5-smddp/weights/v1"


@dataclass(frozen=True)
class LoadedWeights:
    """What a weights file holds. `cfg` / `nc` / `names` are None when the file does not say (a bare
    state dict); `source` is "yolov5-smddp", "release" or "state_dict"."""

    state_dict: dict[str, torch.Tensor]
    cfg: dict | None
    nc: int | None
    names: list[str] | None
    source: str
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TransferReport:
    """Outcome of `transfer_state`: how many tensors were copied and which keys were not."""

    loaded: int
    skipped_shape: list[str]  # in both, shapes differ (e.g. the Detect convs for another nc)
    missing: list[str]  # in the model only
    unexpected: list[str]  # in the checkpoint only
    excluded: list[str] = field(default_factory=list)  # matched an `exclude` pattern

    def summary(self) -> str:
        return (
            f"transferred {self.loaded} tensors; skipped {len(self.skipped_shape)} with other shapes, "
            f"{len(self.excluded)} excluded, {len(self.missing)} missing, {len(self.unexpected)} unexpected"
        )


def _detection_model(model: nn.Module) -> DetectionModel:
    """The DetectionModel inside a DistributedDataParallel and/or torch.compile wrapper."""
    inner = unwrap(model)
    if not isinstance(inner, DetectionModel):
        raise TypeError(f"expected a DetectionModel, got {type(inner).__name__}")
    return inner


def save_weights(path: str | Path, model: nn.Module, *, meta: dict, half: bool = False) -> Path:
    """Write `model`'s weights in our format to `path` atomically (temp file in the same folder, fsync,
    os.replace), so a reader never sees a partial file. `meta` must be JSON-able; cfg, nc, names,
    stride and precision are added. `half` stores floating tensors as float16."""
    model = _detection_model(model)
    path = Path(path)
    precision = "float16" if half else "float32"
    state = {
        k: (
            v.detach().to("cpu", torch.float16 if half else torch.float32)
            if v.is_floating_point()
            else v.cpu()
        )
        for k, v in model.state_dict().items()
    }
    info = {
        **meta,
        "cfg": model.cfg,
        "nc": model.nc,
        "names": list(model.names),
        "stride": model.stride.tolist(),
        "precision": precision,
    }
    try:
        info = json.loads(json.dumps(info))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"save_weights: metadata must be JSON-able ({exc})") from exc
    with atomic_write(path) as f:
        torch.save({"format": FORMAT, "state_dict": state, "meta": info}, f)
    return path


def load_weights(path: str | Path) -> LoadedWeights:
    """Read ours, a bare state dict, or the release's `.pt`, never executing code from the file.
    Raises WeightsError naming the file when it is missing, unreadable or unsafe."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"weights file {path} does not exist")
    if not zipfile.is_zipfile(path):
        raise WeightsError(f"{path}: not a PyTorch checkpoint (expected the zip format of torch.save)")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        return _load_release(path)  # holds more than plain data: try the release's model objects
    except Exception as exc:  # a corrupt archive raises RuntimeError, EOFError, KeyError, ...
        raise WeightsError(f"{path}: cannot be read as a PyTorch checkpoint ({exc})") from exc
    if isinstance(obj, dict) and obj.get("format") == FORMAT:
        meta = obj["meta"]
        return LoadedWeights(
            obj["state_dict"], meta.get("cfg"), meta.get("nc"), meta.get("names"), "yolov5-smddp", meta
        )
    if (
        isinstance(obj, dict)
        and obj
        and all(isinstance(k, str) and torch.is_tensor(v) for k, v in obj.items())
    ):
        return LoadedWeights(dict(obj), None, None, None, "state_dict")
    raise WeightsError(f"{path}: a torch file, but neither our weights format nor a state dict")


def transfer_state(
    model: nn.Module, state_dict: dict[str, torch.Tensor], *, exclude: Collection[str] = ()
) -> TransferReport:
    """Copy every tensor of `state_dict` whose key and shape match `model`'s (cast to the model's dtype
    and device); keys containing any `exclude` string are left alone. For transfer learning, e.g. a COCO
    checkpoint into an nc=3 model (the three Detect convs are skipped)."""
    model = _detection_model(model)
    own = model.state_dict()
    excluded = [k for k in state_dict if k in own and any(pattern in k for pattern in exclude)]
    usable = {k: v for k, v in state_dict.items() if k in own and k not in excluded}
    matching = {k: v for k, v in usable.items() if v.shape == own[k].shape}
    model.load_state_dict(matching, strict=False)
    return TransferReport(
        loaded=len(matching),
        skipped_shape=[k for k in usable if k not in matching],
        missing=[k for k in own if k not in state_dict],
        unexpected=[k for k in state_dict if k not in own],
        excluded=excluded,
    )


def load_model(path: str | Path, device: str | torch.device = "cpu") -> DetectionModel:
    """A float32 DetectionModel in eval mode built from the checkpoint's config, with all its weights
    (WeightsError when the file has no config or its tensors do not fit that config)."""
    weights = load_weights(path)
    if weights.cfg is None:
        raise WeightsError(
            f"{path}: holds only a state dict, without a model config; build the model with "
            f"build_model(cfg) and load it with transfer_state"
        )
    try:
        model = build_model(weights.cfg)
    except ConfigError as exc:
        raise WeightsError(f"{path}: its model config cannot be built ({exc})") from exc
    own = model.state_dict()
    wrong = [k for k in own if k not in weights.state_dict or weights.state_dict[k].shape != own[k].shape]
    extra = [k for k in weights.state_dict if k not in own]
    if wrong or extra:
        raise WeightsError(
            f"{path}: incompatible with its own config ({weights.cfg.get('name', 'model')}, nc={model.nc}): "
            f"{len(wrong)} tensors missing or of another shape (first: {wrong[:3]}), {len(extra)} unexpected "
            f"(first: {extra[:3]})"
        )
    model.load_state_dict(
        {k: v.float() if v.is_floating_point() else v for k, v in weights.state_dict.items()}
    )
    if weights.names is not None:
        model.names = list(weights.names)
    return model.to(device).eval()


def _load_release(path: Path) -> LoadedWeights:
    release = read_release_checkpoint(path)
    nc = release.yaml.get("nc")
    cfg = _config_for_release(release)
    return LoadedWeights(
        release.state_dict, cfg, nc if isinstance(nc, int) else None, release.names, "release"
    )


def _config_for_release(release: ReleaseModel) -> dict | None:
    """Our packaged config with the release model's depth/width multiples, its nc and its (possibly
    auto-fitted) anchors in pixels; None when no packaged config has those multiples."""
    release_yaml, stride = release.yaml, release.stride
    multiples = (release_yaml.get("depth_multiple"), release_yaml.get("width_multiple"))
    for name in PACKAGE_CONFIGS:
        config = load_model_config(name)
        if (config["depth_multiple"], config["width_multiple"]) != multiples:
            continue
        anchors = release.state_dict.get("model.24.anchors")
        if anchors is not None and stride is not None and stride.numel() == anchors.shape[0]:
            pixels = anchors.float() * stride.float().view(-1, 1, 1)
            config["anchors"] = [[round(v, 4) for v in level.flatten().tolist()] for level in pixels]
        if isinstance(release_yaml.get("nc"), int):
            config["nc"] = release_yaml["nc"]
        return config
    return None
