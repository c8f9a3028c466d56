"""Checkpoint I/O for models: our own weights format, and the release's `.pt` files read safely.

Ours: `torch.save` of {"format", "state_dict": plain tensors, "meta": JSON-able metadata}, written
atomically and read back with `torch.load(weights_only=True)`.

The release's `.pt`: a torch zip archive whose `data.pkl` pickles whole model objects. It is read by
`_ReleaseUnpickler`, whose `find_class` resolves only an explicit allow-list: tensor rebuild functions,
storage types and dtypes map onto our own tensor-building code, the release's model classes and the
torch.nn layer classes map onto inert records (`_PickledObject`) that only keep their pickled state, and
every other global (os.system, builtins.eval, ...) is refused before anything is imported or called.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import tempfile
import zipfile
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from yolov5_smddp.errors import ConfigError, WeightsError
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


def _unwrap(model: nn.Module) -> nn.Module:
    """The DetectionModel inside a DistributedDataParallel and/or torch.compile wrapper."""
    while not isinstance(model, DetectionModel):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            raise TypeError(f"expected a DetectionModel, got {type(model).__name__}")
        model = inner
    return model


def save_weights(path: str | Path, model: nn.Module, *, meta: dict, half: bool = False) -> Path:
    """Write `model`'s weights in our format to `path` atomically (temp file in the same folder, fsync,
    os.replace), so a reader never sees a partial file. `meta` must be JSON-able; cfg, nc, names,
    stride and precision are added. `half` stores floating tensors as float16."""
    model = _unwrap(model)
    path = Path(path)
    precision = "float16" if half else "float32"
    state = {
        k: (v.detach().to("cpu", torch.float16 if half else torch.float32) if v.is_floating_point() else v.cpu())
        for k, v in model.state_dict().items()
    }
    info = {
        **meta, "cfg": model.cfg, "nc": model.nc, "names": list(model.names),
        "stride": model.stride.tolist(), "precision": precision,
    }
    try:
        info = json.loads(json.dumps(info))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"save_weights: metadata must be JSON-able ({exc})") from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, "state_dict": state, "meta": info}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
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
        return LoadedWeights(obj["state_dict"], meta.get("cfg"), meta.get("nc"), meta.get("names"), "yolov5-smddp", meta)
    if isinstance(obj, dict) and obj and all(isinstance(k, str) and torch.is_tensor(v) for k, v in obj.items()):
        return LoadedWeights(dict(obj), None, None, None, "state_dict")
    raise WeightsError(f"{path}: a torch file, but neither our weights format nor a state dict")


def transfer_state(model: nn.Module, state_dict: dict[str, torch.Tensor], *, exclude: Collection[str] = ()) -> TransferReport:
    """Copy every tensor of `state_dict` whose key and shape match `model`'s (cast to the model's dtype
    and device); keys containing any `exclude` string are left alone. For transfer learning, e.g. a COCO
    checkpoint into an nc=3 model (the three Detect convs are skipped)."""
    model = _unwrap(model)
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
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in weights.state_dict.items()})
    if weights.names is not None:
        model.names = list(weights.names)
    return model.to(device).eval()


# ---------------------------------------------------------------------------------------------------
# The release's pickled models


class _PickledObject:
    """An inert stand-in for an allowed class: it records constructor args and pickled state and has
    no behaviour. `qualname` says which class it stands for."""

    qualname = "object"

    def __init__(self, *args: Any) -> None:
        self.args = args
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _record_class(qualname: str) -> type[_PickledObject]:
    return type(qualname.rsplit(".", 1)[-1], (_PickledObject,), {"qualname": qualname})


@dataclass(frozen=True)
class _StorageType:
    dtype: torch.dtype


def _rebuild_tensor(storage: torch.Tensor, offset: int, size: tuple, stride: tuple, *_: Any) -> torch.Tensor:
    """Stands in for torch._utils._rebuild_tensor_v2: a view of the flat storage tensor, copied."""
    return storage.as_strided(size, stride, offset).clone()


def _rebuild_parameter(data: torch.Tensor, *_: Any) -> torch.Tensor:
    """Stands in for torch._utils._rebuild_parameter: parameters come back as plain tensors."""
    return data


_STORAGE_DTYPES = {
    "HalfStorage": torch.float16, "FloatStorage": torch.float32, "DoubleStorage": torch.float64,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
}
_RELEASE_CLASSES = (
    "models.yolo.DetectionModel", "models.yolo.Model", "models.yolo.Detect",
    "models.common.Conv", "models.common.C3", "models.common.Bottleneck", "models.common.SPPF",
    "models.common.Concat",
    # older releases' blocks: readable, so that transfer_state can take the tensors that still fit
    "models.common.Focus", "models.common.SPP", "models.common.BottleneckCSP",
)
_TORCH_NN_CLASSES = (
    "conv.Conv2d", "batchnorm.BatchNorm2d", "activation.SiLU", "activation.ReLU", "activation.LeakyReLU",
    "container.Sequential", "container.ModuleList", "pooling.MaxPool2d", "upsampling.Upsample",
    "linear.Identity",
)
# Things a checkpoint's metadata may contain (best_fitness as a numpy array, paths in `opt`): kept as
# inert records, never built.
_INERT_METADATA = (
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct", "numpy.ndarray",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar", "numpy.dtype",
    "pathlib.PosixPath", "pathlib.WindowsPath", "pathlib._local.PosixPath", "pathlib._local.WindowsPath",
    "argparse.Namespace",
)


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """Stands in for _codecs.encode, which protocol-2 pickles use to spell bytes; latin-1 only."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise WeightsError(f"refuses to load: _codecs.encode with {encoding!r}")
    return text.encode("latin1")
_ALLOWED_GLOBALS: dict[str, Any] = {
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "collections.OrderedDict": OrderedDict,
    "builtins.set": set,
    "builtins.frozenset": frozenset,
    "_codecs.encode": _latin1_bytes,
    "torch.Size": tuple,
    **{f"torch.{name}": _StorageType(dtype) for name, dtype in _STORAGE_DTYPES.items()},
    **{f"torch.{name}": getattr(torch, name) for name in ("float16", "float32", "float64", "bfloat16", "int64")},
    **{name: _record_class(name) for name in _RELEASE_CLASSES + _INERT_METADATA},
    **{f"torch.nn.modules.{name}": _record_class(f"torch.nn.modules.{name}") for name in _TORCH_NN_CLASSES},
}


class _ReleaseUnpickler(pickle.Unpickler):
    """Unpickles a torch zip archive's data.pkl with the allow-list above; storages come from the
    archive's data/ records."""

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(io.BytesIO(data))
        self.archive, self.prefix = archive, prefix
        self.storages: dict[str, torch.Tensor] = {}

    def find_class(self, module: str, name: str) -> Any:
        # protocol-2 pickles spell builtins the Python 2 way; the base class would translate it
        module = "builtins" if module == "__builtin__" else module
        try:
            return _ALLOWED_GLOBALS[f"{module}.{name}"]
        except KeyError:
            raise WeightsError(
                f"refuses to load: the pickle names {module}.{name}, which is not a model class, tensor "
                f"type or container (a checkpoint that needs it could run code)"
            ) from None

    def persistent_load(self, pid: Any) -> torch.Tensor:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise WeightsError(f"refuses to load: unknown persistent id {str(pid)[:80]}")
        _, storage_type, key, _location, numel = pid
        if key not in self.storages:
            try:
                raw = self.archive.read(f"{self.prefix}data/{key}")
            except KeyError:
                raise WeightsError(f"storage record data/{key} is missing from the archive") from None
            dtype = storage_type.dtype
            flat = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
            if flat.numel() != numel:
                raise WeightsError(f"storage record data/{key} holds {flat.numel()} values, expected {numel}")
            self.storages[key] = flat
        return self.storages[key]


def _load_release(path: Path) -> LoadedWeights:
    """The release's checkpoint → its EMA weights (else `model`), with nc, names and a matching config."""
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise WeightsError(f"{path}: not a torch zip archive (found {len(pickles)} data.pkl records)")
        prefix = pickles[0].removesuffix("data.pkl")
        byteorder = f"{prefix}byteorder"
        if byteorder in archive.namelist() and archive.read(byteorder).strip() != b"little":
            raise WeightsError(f"{path}: saved on a big-endian machine, which is not supported")
        try:
            ckpt = _ReleaseUnpickler(archive.read(pickles[0]), archive, prefix).load()  # noqa: S301 - allow-listed
        except WeightsError as exc:
            raise WeightsError(f"{path}: {exc}") from None
        except Exception as exc:
            raise WeightsError(f"{path}: unreadable checkpoint pickle ({type(exc).__name__}: {exc})") from None
    model = None
    if isinstance(ckpt, dict):
        model = ckpt.get("ema") or ckpt.get("model")
    if not isinstance(model, _PickledObject) or model.qualname not in ("models.yolo.DetectionModel", "models.yolo.Model"):
        raise WeightsError(f"{path}: no YOLOv5 DetectionModel under the checkpoint's 'ema' or 'model' key")
    state_dict = _module_state(model, "")
    attrs = model.state if isinstance(model.state, dict) else {}
    release_yaml = attrs.get("yaml") if isinstance(attrs.get("yaml"), dict) else {}
    nc = release_yaml.get("nc")
    names = attrs.get("names")
    if isinstance(names, dict):
        names = [str(names[k]) for k in sorted(names)]
    cfg = _config_for_release(release_yaml, state_dict, attrs.get("stride"))
    return LoadedWeights(state_dict, cfg, nc, list(names) if names is not None else None, "release")


def _module_state(obj: _PickledObject, prefix: str) -> dict[str, torch.Tensor]:
    """The state dict of a pickled nn.Module record: its parameters and persistent buffers, then its
    children's, in registration order (as nn.Module.state_dict orders them)."""
    attrs = obj.state if isinstance(obj.state, dict) else {}
    out: dict[str, torch.Tensor] = {}
    non_persistent = attrs.get("_non_persistent_buffers_set") or set()
    for group in ("_parameters", "_buffers"):
        for name, tensor in (attrs.get(group) or {}).items():
            if torch.is_tensor(tensor) and not (group == "_buffers" and name in non_persistent):
                out[prefix + name] = tensor
    for name, child in (attrs.get("_modules") or {}).items():
        if isinstance(child, _PickledObject):
            out.update(_module_state(child, f"{prefix}{name}."))
    return out


def _config_for_release(release_yaml: dict, state_dict: dict[str, torch.Tensor], stride: Any) -> dict | None:
    """Our packaged config with the release model's depth/width multiples, its nc and its (possibly
    auto-fitted) anchors in pixels; None when no packaged config has those multiples."""
    multiples = (release_yaml.get("depth_multiple"), release_yaml.get("width_multiple"))
    for name in PACKAGE_CONFIGS:
        config = load_model_config(name)
        if (config["depth_multiple"], config["width_multiple"]) != multiples:
            continue
        anchors = state_dict.get("model.24.anchors")
        if anchors is not None and torch.is_tensor(stride) and stride.numel() == anchors.shape[0]:
            pixels = anchors.float() * stride.float().view(-1, 1, 1)
            config["anchors"] = [[round(v, 4) for v in level.flatten().tolist()] for level in pixels]
        if isinstance(release_yaml.get("nc"), int):
            config["nc"] = release_yaml["nc"]
        return config
    return None
