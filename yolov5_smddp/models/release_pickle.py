"""Reads the YOLOv5 release's `.pt` files without executing them.

Such a file is a torch zip archive whose `data.pkl` pickles whole model objects. `_ReleaseUnpickler`'s
`find_class` resolves only an explicit allow-list: tensor rebuild functions, storage types and dtypes map
onto our own tensor-building code, the release's model classes and the torch.nn layer classes map onto
inert records (`_PickledObject`) that only keep their pickled state, and every other global (os.system,
builtins.eval, ...) is refused before anything is imported or called. Storages are read from the
archive's data/ records.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from yolov5_smddp.errors import WeightsError


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
    "HalfStorage": torch.float16,
    "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
}
_RELEASE_CLASSES = (
    "models.yolo.DetectionModel",
    "models.yolo.Model",
    "models.yolo.Detect",
    "models.common.Conv",
    "models.common.C3",
    "models.common.Bottleneck",
    "models.common.SPPF",
    "models.common.Concat",
    "models.common.C3TR",
    "models.common.TransformerBlock",
    "models.common.TransformerLayer",
    "models.common.C3Ghost",
    "models.common.GhostConv",
    "models.common.GhostBottleneck",
    "models.common.DWConv",
    # the older releases' (v3.0-v5.0) blocks
    "models.common.Focus",
    "models.common.SPP",
    "models.common.BottleneckCSP",
)
_TORCH_NN_CLASSES = (
    "conv.Conv2d",
    "batchnorm.BatchNorm2d",
    "activation.SiLU",
    "activation.ReLU",
    "activation.ReLU6",
    "activation.LeakyReLU",
    "activation.Hardswish",
    "activation.Hardsigmoid",
    "activation.Mish",
    "activation.GELU",
    "activation.ELU",
    "activation.Sigmoid",
    "activation.Tanh",
    "activation.MultiheadAttention",
    "linear.Linear",
    "linear.NonDynamicallyQuantizableLinear",
    "padding.ZeroPad2d",
    "container.Sequential",
    "container.ModuleList",
    "pooling.MaxPool2d",
    "upsampling.Upsample",
    "linear.Identity",
)
# Things a checkpoint's metadata may contain (best_fitness as a numpy array, paths in `opt`): kept as
# inert records, never built.
_INERT_METADATA = (
    "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct",
    "numpy.ndarray",
    "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar",
    "numpy.dtype",
    "pathlib.PosixPath",
    "pathlib.WindowsPath",
    "pathlib._local.PosixPath",
    "pathlib._local.WindowsPath",
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
    **{
        f"torch.{name}": getattr(torch, name)
        for name in ("float16", "float32", "float64", "bfloat16", "int64")
    },
    **{name: _record_class(name) for name in _RELEASE_CLASSES + _INERT_METADATA},
    # the same classes as the PyPI package `yolov5` names them (its modules live under `yolov5.`)
    **{f"yolov5.{name}": _record_class(name) for name in _RELEASE_CLASSES},
    **{f"torch.nn.modules.{name}": _record_class(f"torch.nn.modules.{name}") for name in _TORCH_NN_CLASSES},
}


_BUILDABLE = tuple(name.rsplit(".", 1)[-1] for name in _RELEASE_CLASSES)


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
            if module.removeprefix("yolov5.").startswith("models."):
                raise WeightsError(
                    f"cannot rebuild its architecture: it uses the release's class {module}.{name}, which "
                    f"yolov5-smddp does not build (it builds {sorted(_BUILDABLE)})"
                ) from None
            raise WeightsError(
                f"refuses to load: the pickle names {module}.{name}, which is not a model class, tensor "
                f"type or container (a checkpoint that needs it could run code)"
            ) from None

    def persistent_load(self, pid: Any) -> torch.Tensor:
        if not (
            isinstance(pid, tuple)
            and len(pid) == 5
            and pid[0] == "storage"
            and isinstance(pid[1], _StorageType)
        ):
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


@dataclass(frozen=True)
class ReleaseModel:
    """What a release checkpoint's model object holds that we use."""

    state_dict: dict[str, torch.Tensor]  # as the release stored it (float16 usually)
    yaml: dict  # the release's model config (nc, depth_multiple, width_multiple, ...); {} if absent
    names: list[str] | None
    stride: torch.Tensor | None  # [nl]
    modules: dict[str, PickledModule] = field(default_factory=dict)  # "" = the model, "model.0.conv", ...


@dataclass(frozen=True)
class PickledModule:
    """One module of the pickled model: its class (as pickled) and its plain (non-tensor) attributes."""

    qualname: str
    attrs: dict[str, Any]

    @property
    def class_name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]


def read_release_checkpoint(path: Path) -> ReleaseModel:
    """The release's checkpoint → its EMA model (else `model`): weights, config, names, strides.
    Raises WeightsError naming the file for anything outside the allow-list or not a YOLOv5 model."""
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
            raise WeightsError(
                f"{path}: unreadable checkpoint pickle ({type(exc).__name__}: {exc})"
            ) from None
    model = None
    if isinstance(ckpt, dict):
        model = ckpt.get("ema") or ckpt.get("model")
    if not isinstance(model, _PickledObject) or model.qualname not in (
        "models.yolo.DetectionModel",
        "models.yolo.Model",
    ):
        raise WeightsError(f"{path}: no YOLOv5 DetectionModel under the checkpoint's 'ema' or 'model' key")
    attrs = model.state if isinstance(model.state, dict) else {}
    names = attrs.get("names")
    if isinstance(names, dict):
        names = [names[k] for k in sorted(names)]
    stride = attrs.get("stride")
    return ReleaseModel(
        state_dict=_module_state(model, ""),
        yaml=attrs.get("yaml") if isinstance(attrs.get("yaml"), dict) else {},
        names=[str(n) for n in names] if isinstance(names, list | tuple) else None,
        stride=stride if torch.is_tensor(stride) else None,
        modules=_module_records(model, ""),
    )


def _module_records(obj: _PickledObject, path: str) -> dict[str, PickledModule]:
    """Every module of a pickled nn.Module record by path, with its attributes that are not tensors,
    modules or torch's bookkeeping."""
    attrs = obj.state if isinstance(obj.state, dict) else {}
    plain = {
        k: v
        for k, v in attrs.items()
        if not k.startswith("_") and not isinstance(v, _PickledObject) and not torch.is_tensor(v)
    }
    out = {path: PickledModule(obj.qualname, plain)}
    for name, child in (attrs.get("_modules") or {}).items():
        if isinstance(child, _PickledObject):
            out.update(_module_records(child, f"{path}.{name}" if path else name))
    return out


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
