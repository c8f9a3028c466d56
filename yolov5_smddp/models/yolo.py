"""Builds a YOLOv5 DetectionModel from a config (package YAML, file path or dict).

The builder reads YAML with `yaml.safe_load` and maps block names through `BLOCK_BUILDERS`; nothing in a
config is ever evaluated as code.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from yolov5_smddp.errors import ConfigError
from yolov5_smddp.models.blocks import C3, SPPF, Concat, Conv, Upsample
from yolov5_smddp.models.detect import Detect

PACKAGE_CONFIGS = ("yolov5n", "yolov5s", "yolov5m", "yolov5l", "yolov5x")
REQUIRED_KEYS = ("nc", "depth_multiple", "width_multiple", "anchors", "layers")
INPUT = -1  # source index meaning "the network input" (only reachable from layer 0)


@dataclass(frozen=True)
class LayerSpec:
    """One resolved layer: what `info` prints and what `DetectionModel.forward` wires."""

    index: int
    sources: tuple[int, ...]  # absolute layer indices feeding this one; INPUT = the image
    repeats: int  # after depth scaling
    block: str
    args: tuple[Any, ...]  # constructor arguments after scaling (input channels first where used)
    out_channels: int
    stride: float  # total downsampling of this layer's output


@dataclass(frozen=True)
class _BlockInput:
    """What a block builder sees: its sources' channels/strides, the raw args and the scaling."""

    where: str  # "layer 7 (C3) in yolov5s.yaml", for error messages
    channels: tuple[int, ...]
    strides: tuple[float, ...]
    args: tuple[Any, ...]
    repeats: int
    width_multiple: float
    nc: int
    anchors: tuple[tuple[float, ...], ...]

    def width(self, channels: int) -> int:
        return math.ceil(channels * self.width_multiple / 8) * 8

    def ints(self, low: int, high: int) -> tuple[int, ...]:
        if not low <= len(self.args) <= high or not all(_is_int(a) for a in self.args):
            raise ConfigError(f"{self.where}: args {list(self.args)} must be {low}..{high} integers")
        return tuple(int(a) for a in self.args)


@dataclass(frozen=True)
class _Built:
    module: nn.Module
    out_channels: int
    stride: float
    args: tuple[Any, ...]
    repeats: int = 1  # the repeats the module holds inside (C3's bottlenecks)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _single_source(inp: _BlockInput) -> None:
    if len(inp.channels) != 1:
        raise ConfigError(f"{inp.where}: takes one input, got {len(inp.channels)}")


def _no_repeats(inp: _BlockInput) -> None:
    if inp.repeats != 1:
        raise ConfigError(f"{inp.where}: repeats must be 1 (only C3 repeats), got {inp.repeats}")


def _build_conv(inp: _BlockInput) -> _Built:
    _single_source(inp)
    _no_repeats(inp)
    c2, k, s, *p = inp.ints(3, 4)
    args = (inp.channels[0], inp.width(c2), k, s, *p)
    return _Built(Conv(*args), args[1], inp.strides[0] * s, args)


def _build_c3(inp: _BlockInput) -> _Built:
    _single_source(inp)
    if not 1 <= len(inp.args) <= 2 or not _is_int(inp.args[0]):
        raise ConfigError(f"{inp.where}: args {list(inp.args)} must be [channels] or [channels, shortcut]")
    shortcut = inp.args[1] if len(inp.args) == 2 else True
    if not isinstance(shortcut, bool):
        raise ConfigError(f"{inp.where}: shortcut must be true or false, got {shortcut!r}")
    args = (inp.channels[0], inp.width(inp.args[0]), inp.repeats, shortcut)
    return _Built(C3(*args), args[1], inp.strides[0], args, repeats=inp.repeats)


def _build_sppf(inp: _BlockInput) -> _Built:
    _single_source(inp)
    _no_repeats(inp)
    c2, k = inp.ints(2, 2)
    args = (inp.channels[0], inp.width(c2), k)
    return _Built(SPPF(*args), args[1], inp.strides[0], args)


def _build_upsample(inp: _BlockInput) -> _Built:
    _single_source(inp)
    _no_repeats(inp)
    if len(inp.args) != 2 or not _is_int(inp.args[0]) or inp.args[1] not in ("nearest", "bilinear"):
        raise ConfigError(f"{inp.where}: args {list(inp.args)} must be [factor, nearest|bilinear]")
    factor, mode = inp.args
    return _Built(Upsample(factor, mode), inp.channels[0], inp.strides[0] / factor, (factor, mode))


def _build_concat(inp: _BlockInput) -> _Built:
    _no_repeats(inp)
    (dim,) = inp.ints(1, 1)
    if dim != 1:
        raise ConfigError(f"{inp.where}: only channel concatenation (dim 1) is supported, got {dim}")
    if len(set(inp.strides)) != 1:
        raise ConfigError(f"{inp.where}: inputs have different strides {list(inp.strides)}")
    return _Built(Concat(dim), sum(inp.channels), inp.strides[0], (dim,))


def _build_detect(inp: _BlockInput) -> _Built:
    _no_repeats(inp)
    if inp.args:
        raise ConfigError(f"{inp.where}: Detect takes no args (nc and anchors come from the config)")
    if len(inp.anchors) != len(inp.channels):
        raise ConfigError(f"{inp.where}: {len(inp.anchors)} anchor rows for {len(inp.channels)} inputs")
    args = (inp.nc, [list(a) for a in inp.anchors], list(inp.channels))
    return _Built(Detect(inp.nc, inp.anchors, inp.channels, inp.strides), inp.nc + 5, 0.0, args)


BLOCK_BUILDERS: dict[str, Callable[[_BlockInput], _Built]] = {
    "Conv": _build_conv,
    "C3": _build_c3,
    "SPPF": _build_sppf,
    "Upsample": _build_upsample,
    "Concat": _build_concat,
    "Detect": _build_detect,
}


def load_model_config(cfg: str | Path | dict) -> dict:
    """A validated copy of a model config: a dict, a YAML file path, or a packaged name such as
    "yolov5s" / "yolov5s.yaml". Raises ConfigError naming the file and key."""
    if isinstance(cfg, dict):
        config, origin = copy.deepcopy(cfg), "the model config"
    else:
        config, origin = _read_config_file(cfg)
    if not isinstance(config, dict):
        raise ConfigError(f"{origin}: expected a mapping with keys {list(REQUIRED_KEYS)}")
    missing = [key for key in REQUIRED_KEYS if key not in config]
    if missing:
        raise ConfigError(f"{origin}: missing keys {missing}")
    config.setdefault("name", origin)
    return config


def _read_config_file(cfg: str | Path) -> tuple[Any, str]:
    path = Path(cfg)
    if path.is_file():
        text, origin = path.read_text(encoding="utf-8"), str(path)
    else:
        stem = path.name.removesuffix(".yaml").removesuffix(".yml")
        if stem not in PACKAGE_CONFIGS or path.parent != Path("."):
            raise ConfigError(
                f"model config {str(cfg)!r}: no such file and not one of {list(PACKAGE_CONFIGS)}"
            )
        text = (
            resources.files("yolov5_smddp.models").joinpath("cfg", f"{stem}.yaml").read_text(encoding="utf-8")
        )
        origin = f"{stem}.yaml"
    try:
        return yaml.safe_load(text), origin
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: not valid YAML ({exc})") from exc


def _check_anchors(anchors: Any, origin: str) -> tuple[tuple[float, ...], ...]:
    rows = anchors if isinstance(anchors, list | tuple) else None
    ok = bool(rows) and all(
        isinstance(r, list | tuple)
        and len(r) >= 2
        and len(r) % 2 == 0
        and len(r) == len(rows[0])
        and all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in r)
        for r in rows
    )
    if not ok:
        raise ConfigError(
            f"{origin}: anchors must be one list of positive (w, h) pixel pairs per level, e.g. "
            f"[[10, 13, 16, 30, 33, 23], ...]; got {anchors!r}"
        )
    return tuple(tuple(float(v) for v in r) for r in rows)


def resolve_layers(config: dict) -> list[LayerSpec]:
    """The config's layers, scaled and wired (their modules are built on the meta device and dropped)."""
    with torch.device("meta"):
        return [spec for spec, _ in _build_layers(config)]


def _build_layers(config: dict) -> list[tuple[LayerSpec, nn.Module]]:
    origin = config.get("name", "the model config")
    nc, gd, gw = config["nc"], config["depth_multiple"], config["width_multiple"]
    if not _is_int(nc) or nc < 1:
        raise ConfigError(f"{origin}: nc must be a positive integer, got {nc!r}")
    for key, value in (("depth_multiple", gd), ("width_multiple", gw)):
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{origin}: {key} must be a positive number, got {value!r}")
    anchors = _check_anchors(config["anchors"], origin)
    layers = config["layers"]
    if not isinstance(layers, list) or not layers:
        raise ConfigError(f"{origin}: layers must be a non-empty list")

    built: list[tuple[LayerSpec, nn.Module]] = []
    for index, entry in enumerate(layers):
        where = f"layer {index} in {origin}"
        if not isinstance(entry, dict) or set(entry) - {"from", "repeats", "block", "args"}:
            raise ConfigError(
                f"{where}: expected a mapping with keys from, repeats, block, args; got {entry!r}"
            )
        block = entry.get("block")
        if block not in BLOCK_BUILDERS:
            raise ConfigError(f"{where}: unknown block {block!r}; known blocks: {sorted(BLOCK_BUILDERS)}")
        where = f"layer {index} ({block}) in {origin}"
        sources = _resolve_sources(entry.get("from", -1), index, where)
        repeats = entry.get("repeats", 1)
        if not _is_int(repeats) or repeats < 1:
            raise ConfigError(f"{where}: repeats must be a positive integer, got {repeats!r}")
        args = entry.get("args", [])
        if not isinstance(args, list):
            raise ConfigError(f"{where}: args must be a list, got {args!r}")
        channels = tuple(3 if s == INPUT else built[s][0].out_channels for s in sources)
        strides = tuple(1.0 if s == INPUT else built[s][0].stride for s in sources)
        result = BLOCK_BUILDERS[block](
            _BlockInput(
                where=where,
                channels=channels,
                strides=strides,
                args=tuple(args),
                repeats=max(round(repeats * gd), 1) if repeats > 1 else repeats,
                width_multiple=float(gw),
                nc=nc,
                anchors=anchors,
            )
        )
        spec = LayerSpec(
            index=index,
            sources=sources,
            repeats=result.repeats,
            block=block,
            args=result.args,
            out_channels=result.out_channels,
            stride=result.stride,
        )
        built.append((spec, result.module))
    if built[-1][0].block != "Detect" or any(spec.block == "Detect" for spec, _ in built[:-1]):
        raise ConfigError(f"{origin}: the last layer, and only the last, must be Detect")
    return built


def _resolve_sources(value: Any, index: int, where: str) -> tuple[int, ...]:
    """'from' (an int or a list; negative = relative to this layer) → absolute indices."""
    items = value if isinstance(value, list) else [value]
    if not items or not all(_is_int(v) for v in items):
        raise ConfigError(f"{where}: 'from' must be a layer index or a list of them, got {value!r}")
    sources = tuple(index + v if v < 0 else v for v in items)
    if any(s >= index or s < INPUT for s in sources) or (INPUT in sources and index != 0):
        raise ConfigError(f"{where}: 'from' {value!r} must name earlier layers")
    return sources


class DetectionModel(nn.Module):
    """A YOLOv5 detector: `model` (ModuleList of layers, so keys are `model.{i}...`) wired by `layers`.

    Input: float images [B, 3, H, W] in [0, 1], H and W multiples of the largest stride (32).
    Training: `forward(x)` → list of nl raw tensors [B, na, ny, nx, 5 + nc].
    Eval: → (pred [B, N, 5 + nc] with xywh in input pixels and sigmoid scores, raw list).
    """

    def __init__(self, config: dict, layers: list[LayerSpec], modules: Sequence[nn.Module]) -> None:
        super().__init__()
        self.cfg = config
        self.layers = layers
        self.model = nn.ModuleList(modules)
        self.nc: int = config["nc"]
        self.names: list[str] = [f"class{i}" for i in range(self.nc)]
        self.register_buffer("stride", torch.tensor(self.detect.strides), persistent=False)
        # outputs read later by a layer other than the next one must be kept during forward
        needed = {s for spec in layers for s in spec.sources if s != spec.index - 1}
        self._keep = tuple(spec.index in needed for spec in layers)

    @property
    def detect(self) -> Detect:
        """The Detect head (`model[-1]`; a property so that it is not registered twice)."""
        return self.model[-1]

    def forward(self, x: torch.Tensor) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        outputs: list[torch.Tensor | None] = []
        for spec, layer, keep in zip(self.layers, self.model, self._keep):
            inputs = [x if s == INPUT or s == spec.index - 1 else outputs[s] for s in spec.sources]
            x = layer(inputs if len(inputs) > 1 or spec.block == "Detect" else inputs[0])
            outputs.append(x if keep else None)
        return x

    def fuse(self) -> DetectionModel:
        """Fold every Conv's BatchNorm into its convolution, for inference. Returns self."""
        for module in self.modules():
            if isinstance(module, Conv):
                module.fuse()
        return self


def build_model(cfg: str | Path | dict, nc: int | None = None, anchors: Any = None) -> DetectionModel:
    """Build a DetectionModel from a config name ("yolov5s", "yolov5s.yaml"), YAML path or dict, with
    `nc` and `anchors` (pixel (w, h) pairs per level) overriding the config's. Detect biases get the
    from-scratch prior."""
    config = load_model_config(cfg)
    if nc is not None:
        config["nc"] = nc
    if anchors is not None:
        config["anchors"] = anchors
    built = _build_layers(config)
    model = DetectionModel(config, [spec for spec, _ in built], [module for _, module in built])
    model.detect.initialize_biases()
    return model
