"""Builds a YOLOv5 DetectionModel from a model config in the release's yaml format (a package name, a
YAML path or a dict).

The format: `nc`, `depth_multiple`, `width_multiple`, `anchors` (per-level lists of (w, h) pixel pairs,
or an int = that many anchors per level for AutoAnchor to fit), optional `activation`, and `backbone` +
`head`, one row `[from, number, module, args]` per layer. `from` is the input layer (-1 = the previous
one; a list for Concat/Detect), `number` the repeats before depth scaling. Channel arguments are scaled by
the width multiple (ceil(c * width / 8) * 8), repeats by the depth multiple (max(round(n * depth), 1)).

Every size a config gives is bounded before anything is built (`MAX_*` below: the multiples, a row's
repeats, a layer's channels, the anchors, the classes, the layer count, and the parameters in all), so a
hostile or mistyped config is one ConfigError naming the key and the layer, never an allocation attempt.

Nothing in a config is evaluated as code: module names map through `MODULES`, the string arguments the
release's yamls use ('None', 'nc', 'anchors', 'nearest') through `_resolve_arg`, and `activation` through
`parse_activation`, which reads one `nn.<Name>(<literals>)` call from an allow-list.
"""

from __future__ import annotations

import ast
import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import nn

from yolov5_smddp.errors import ConfigError
from yolov5_smddp.files.bounded_read import shown
from yolov5_smddp.files.bounded_yaml import load_yaml, parse_yaml
from yolov5_smddp.models import blocks
from yolov5_smddp.models.detect import Detect

P5_CONFIGS = ("yolov5n", "yolov5s", "yolov5m", "yolov5l", "yolov5x")
P6_CONFIGS = ("yolov5n6", "yolov5s6", "yolov5m6", "yolov5l6", "yolov5x6")  # stride 64, trained at 1280
PACKAGE_CONFIGS = P5_CONFIGS + P6_CONFIGS
REQUIRED_KEYS = ("nc", "depth_multiple", "width_multiple", "anchors", "backbone", "head")
INPUT = -1  # source index meaning "the network input" (only reachable from layer 0)
ACTIVATION_OVERRIDES = "activations"  # {module path: activation}, for checkpoints whose blocks differ

MAX_MULTIPLE = 8.0
"""depth_multiple / width_multiple at most (the release's largest: 1.33 / 1.25)."""
MAX_REPEATS = 64
"""A row's `number`, before and after depth scaling (the release's largest: 9)."""
MAX_CHANNELS = 16384
"""A layer's output channels after width scaling (the release's largest: 1280)."""
MAX_LAYERS = 512
"""Rows in backbone + head (the release's largest: 34)."""
MAX_CLASSES = 100_000
"""nc (LVIS: 1,203; OpenImages: 601)."""
MAX_ANCHORS_PER_LEVEL = 32
"""Anchors per level (the release: 3)."""
MAX_ANCHOR_PIXELS = 16384.0
"""An anchor's width or height in input pixels."""
MAX_PARAMETERS = 1_000_000_000
"""Parameters in all (yolov5x6: 140.8 M; 1 G float32 = 4 GB of weights, 16 GB with Adam's states)."""

# ---------------------------------------------------------------------------------------------------
# activations


_ACTIVATIONS: dict[str, type[nn.Module]] = {
    cls.__name__: cls
    for cls in (
        nn.SiLU,
        nn.ReLU,
        nn.ReLU6,
        nn.LeakyReLU,
        nn.Hardswish,
        nn.Hardsigmoid,
        nn.Mish,
        nn.GELU,
        nn.ELU,
        nn.Sigmoid,
        nn.Tanh,
        nn.Identity,
    )
}


def parse_activation(text: Any, where: str = "activation") -> Callable[[], nn.Module]:
    """A factory for the activation `text` names, e.g. "nn.LeakyReLU(0.1)" or "nn.ReLU()": one call of an
    allow-listed torch.nn activation with literal arguments. Raises ConfigError otherwise."""
    allowed = f"one of nn.{{{', '.join(sorted(_ACTIVATIONS))}}}(...) with literal arguments"
    if not isinstance(text, str):
        raise ConfigError(f"{where}: expected a string such as 'nn.LeakyReLU(0.1)', got {text!r}")
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ConfigError(f"{where}: {text!r} is not {allowed}") from None
    func = node.func if isinstance(node, ast.Call) else None
    if not (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "nn"
        and func.attr in _ACTIVATIONS
    ):
        raise ConfigError(f"{where}: {text!r} is not {allowed}")
    try:
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
        if len(kwargs) != len(node.keywords):
            raise ValueError("**kwargs")
        cls = _ACTIVATIONS[func.attr]
        cls(*args, **kwargs)  # arguments checked once, here
    except (ValueError, TypeError, SyntaxError) as exc:
        raise ConfigError(f"{where}: {text!r}: bad arguments ({exc})") from None
    return lambda: cls(*args, **kwargs)


def activation_text(module: nn.Module) -> str:
    """The config spelling of an activation module ("nn.LeakyReLU(0.1)"), the inverse of parse_activation."""
    name = type(module).__name__
    if name not in _ACTIVATIONS:
        raise ConfigError(f"{name} is not an activation a config can name")
    if isinstance(module, nn.LeakyReLU):
        return f"nn.LeakyReLU({module.negative_slope!r})"
    if isinstance(module, nn.ELU):
        return f"nn.ELU({module.alpha!r})"
    if isinstance(module, nn.GELU) and module.approximate != "none":
        return f"nn.GELU(approximate={module.approximate!r})"
    return f"nn.{name}()"


# ---------------------------------------------------------------------------------------------------
# argument checks and the module table


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _positive_int(v: Any) -> bool:
    return _is_int(v) and v > 0


def _non_negative_int(v: Any) -> bool:
    return _is_int(v) and v >= 0


def _kernel(v: Any) -> bool:
    return _positive_int(v) or (isinstance(v, list | tuple) and len(v) == 2 and all(map(_positive_int, v)))


def _padding(v: Any) -> bool:
    return (
        v is None
        or _non_negative_int(v)
        or (isinstance(v, list | tuple) and len(v) == 2 and all(map(_non_negative_int, v)))
    )


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _fraction(v: Any) -> bool:
    return _is_number(v) and 0 < v <= 4


def _odd_kernels(v: Any) -> bool:
    return isinstance(v, list | tuple) and bool(v) and all(_positive_int(k) and k % 2 for k in v)


def _upsample_size(v: Any) -> bool:
    return v is None


def _scale_factor(v: Any) -> bool:
    return _is_number(v) and v > 0


def _upsample_mode(v: Any) -> bool:
    return v in ("nearest", "bilinear", "bicubic")


def _pad4(v: Any) -> bool:
    return _non_negative_int(v) or (
        isinstance(v, list | tuple) and len(v) == 4 and all(map(_non_negative_int, v))
    )


_CHECK_TEXT = {
    _positive_int: "a positive integer",
    _non_negative_int: "a non-negative integer",
    _kernel: "a kernel size (int or [h, w])",
    _padding: "a padding (None, int or [h, w])",
    _bool: "true or false",
    _fraction: "a number in (0, 4]",
    _odd_kernels: "a list of odd kernel sizes",
    _upsample_size: "None (size is not supported: use scale_factor)",
    _scale_factor: "a positive number",
    _upsample_mode: "'nearest', 'bilinear' or 'bicubic'",
    _pad4: "an int or [left, right, top, bottom]",
}


REQUIRED = object()  # a parameter default: the yaml must give it


@dataclass(frozen=True)
class _Param:
    name: str
    check: Callable[[Any], bool]
    default: Any


@dataclass(frozen=True)
class ModuleKind:
    """How one yaml module name is built: its class, its parameters after the leading ones the builder
    supplies, and how it changes the stride.

    kind: "channels" (args[0] = output channels, width-scaled; the input channels go first),
    "csp" (the same, the repeats go third and the module is built once), "same" (channels unchanged),
    "concat", "detect"."""

    cls: Callable[..., nn.Module]
    kind: str
    params: tuple[_Param, ...] = ()
    stride: Callable[[dict], float] = lambda a: 1.0


def _p(name: str, check: Callable[[Any], bool], default: Any) -> _Param:
    return _Param(name, check, default)


_CSP_PARAMS = (_p("shortcut", _bool, True), _p("g", _positive_int, 1), _p("e", _fraction, 0.5))
_CONV_STRIDE = (_p("s", _positive_int, 1),)

MODULES: dict[str, ModuleKind] = {
    "Conv": ModuleKind(
        blocks.Conv,
        "channels",
        (
            _p("k", _kernel, 1),
            *_CONV_STRIDE,
            _p("p", _padding, None),
            _p("g", _positive_int, 1),
            _p("d", _positive_int, 1),
            _p("act", _bool, True),
        ),
        lambda a: a["s"],
    ),
    "DWConv": ModuleKind(
        blocks.DWConv,
        "channels",
        (_p("k", _kernel, 1), *_CONV_STRIDE, _p("d", _positive_int, 1), _p("act", _bool, True)),
        lambda a: a["s"],
    ),
    "GhostConv": ModuleKind(
        blocks.GhostConv,
        "channels",
        (_p("k", _kernel, 1), *_CONV_STRIDE, _p("g", _positive_int, 1), _p("act", _bool, True)),
        lambda a: a["s"],
    ),
    "GhostBottleneck": ModuleKind(
        blocks.GhostBottleneck,
        "channels",
        (_p("k", _positive_int, 3), _p("s", lambda v: v in (1, 2) and _is_int(v), 1)),
        lambda a: a["s"],
    ),
    "Focus": ModuleKind(
        blocks.Focus,
        "channels",
        (
            _p("k", _kernel, 1),
            *_CONV_STRIDE,
            _p("p", _padding, None),
            _p("g", _positive_int, 1),
            _p("act", _bool, True),
        ),
        lambda a: 2 * a["s"],
    ),
    "Bottleneck": ModuleKind(blocks.Bottleneck, "channels", _CSP_PARAMS),
    "SPP": ModuleKind(blocks.SPP, "channels", (_p("k", _odd_kernels, (5, 9, 13)),)),
    "SPPF": ModuleKind(blocks.SPPF, "channels", (_p("k", lambda v: _positive_int(v) and v % 2 == 1, 5),)),
    "C3": ModuleKind(blocks.C3, "csp", _CSP_PARAMS),
    "C3TR": ModuleKind(blocks.C3TR, "csp", _CSP_PARAMS),
    "C3Ghost": ModuleKind(blocks.C3Ghost, "csp", _CSP_PARAMS),
    "BottleneckCSP": ModuleKind(blocks.BottleneckCSP, "csp", _CSP_PARAMS),
    "nn.Upsample": ModuleKind(
        nn.Upsample,
        "same",
        (
            _p("size", _upsample_size, None),
            _p("scale_factor", _scale_factor, REQUIRED),
            _p("mode", _upsample_mode, "nearest"),
        ),
        lambda a: 1.0 / a["scale_factor"],
    ),
    "nn.MaxPool2d": ModuleKind(
        nn.MaxPool2d,
        "same",
        (
            _p("kernel_size", _positive_int, REQUIRED),
            _p("stride", lambda v: v is None or _positive_int(v), None),
            _p("padding", _non_negative_int, 0),
        ),
        lambda a: a["stride"] or a["kernel_size"],
    ),
    "nn.ZeroPad2d": ModuleKind(blocks.ZeroPad2d, "same", (_p("padding", _pad4, REQUIRED),)),
    "Concat": ModuleKind(blocks.Concat, "concat", (_p("dim", lambda v: v == 1, 1),)),
    "Detect": ModuleKind(Detect, "detect"),
}


# ---------------------------------------------------------------------------------------------------
# reading configs


def load_model_config(cfg: str | Path | dict) -> dict:
    """A validated copy of a model config: a dict, a YAML file path, or a packaged name such as
    "yolov5s" / "yolov5s6.yaml". Raises ConfigError naming the file and key."""
    if isinstance(cfg, dict):
        config, origin = copy.deepcopy(cfg), str(cfg.get("name", "the model config"))
    else:
        config, origin = _read_config_file(cfg)
    if not isinstance(config, dict):
        raise ConfigError(f"{origin}: expected a mapping with keys {list(REQUIRED_KEYS)}")
    missing = [key for key in REQUIRED_KEYS if key not in config]
    if missing:
        hint = ""
        if "layers" in config:
            hint = (
                " (this is the old yolov5-smddp layout with `layers`; write the release's format: "
                "`backbone` and `head` rows [from, number, module, args])"
            )
        raise ConfigError(f"{origin}: missing keys {missing}{hint}")
    config.setdefault("name", origin)
    return config


def _read_config_file(cfg: str | Path) -> tuple[Any, str]:
    path = Path(cfg)
    if path.exists():
        return load_yaml(path, ConfigError), shown(path)
    stem = path.name.removesuffix(".yaml").removesuffix(".yml")
    if stem not in PACKAGE_CONFIGS or path.parent != Path("."):
        raise ConfigError(f"model config {str(cfg)!r}: no such file and not one of {list(PACKAGE_CONFIGS)}")
    text = resources.files("yolov5_smddp.models").joinpath("cfg", f"{stem}.yaml").read_text(encoding="utf-8")
    origin = f"{stem}.yaml"
    return parse_yaml(text, origin, ConfigError), origin


def _check_anchors(anchors: Any, origin: str) -> tuple[tuple[float, ...], ...] | int:
    """Per-level pixel (w, h) lists, or an int (anchors per level, to be fitted by AutoAnchor)."""
    if _positive_int(anchors):
        if anchors > MAX_ANCHORS_PER_LEVEL:
            raise ConfigError(
                f"{origin}: anchors {anchors} per level is over the limit of {MAX_ANCHORS_PER_LEVEL}"
            )
        return int(anchors)
    rows = anchors if isinstance(anchors, list | tuple) else None
    ok = bool(rows) and all(
        isinstance(r, list | tuple)
        and len(r) >= 2
        and len(r) % 2 == 0
        and len(r) == len(rows[0])
        and all(_is_number(v) and v >= 0 for v in r)
        for r in rows
    )
    if not ok:
        shown = repr(anchors)
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        raise ConfigError(
            f"{origin}: anchors must be one list of (w, h) pixel pairs per level, e.g. "
            f"[[10, 13, 16, 30, 33, 23], ...], or a number of anchors per level; got {shown}"
        )
    if len(rows[0]) // 2 > MAX_ANCHORS_PER_LEVEL:
        raise ConfigError(
            f"{origin}: anchors: {len(rows[0]) // 2} per level is over the limit of {MAX_ANCHORS_PER_LEVEL}"
        )
    largest = max(v for r in rows for v in r)
    if not largest <= MAX_ANCHOR_PIXELS:  # also NaN
        raise ConfigError(f"{origin}: anchors: {largest!r} px is over the limit of {MAX_ANCHOR_PIXELS:g} px")
    return tuple(tuple(float(v) for v in r) for r in rows)


# ---------------------------------------------------------------------------------------------------
# building


@dataclass(frozen=True)
class LayerSpec:
    """One resolved layer: what `info` prints and what `DetectionModel.forward` wires."""

    index: int
    sources: tuple[int, ...]  # absolute layer indices feeding this one; INPUT = the image
    repeats: int  # after depth scaling
    block: str  # the module name as the config writes it ("C3", "nn.Upsample")
    args: tuple[Any, ...]  # the row's arguments after scaling (input channels first where used), as given
    out_channels: int
    stride: float  # total downsampling of this layer's output


def _make_divisible(x: float, divisor: int = 8) -> int:
    return math.ceil(x / divisor) * divisor


def _resolve_arg(value: Any, nc: int, anchors: Any) -> Any:
    """The string arguments the release's yamls use, read without eval: 'None' / 'True' / 'False', and
    the names 'nc' and 'anchors' (the config's values). Other strings stay strings ('nearest')."""
    if not isinstance(value, str):
        return value
    named = {"None": None, "True": True, "False": False, "nc": nc, "anchors": anchors}
    return named.get(value.strip(), value)


def _bind(kind: ModuleKind, args: list, leading: int, where: str) -> dict:
    """Bind the args after the `leading` builder-supplied ones to the module's parameters, checked."""
    given = args[leading:]
    if len(given) > len(kind.params):
        names = [p.name for p in kind.params]
        raise ConfigError(f"{where}: {len(given)} arguments where at most {len(names)} fit ({names})")
    bound = {}
    for param, value in zip(kind.params, [*given, *(p.default for p in kind.params[len(given) :])]):
        if value is REQUIRED:
            raise ConfigError(f"{where}: argument {param.name} is required")
        if not param.check(value):
            raise ConfigError(
                f"{where}: argument {param.name}={value!r} must be {_CHECK_TEXT.get(param.check, 'valid')}"
            )
        bound[param.name] = value
    return bound


@dataclass(frozen=True)
class _Layer:
    """One resolved row, not yet built: `make()` builds its module, `estimate` bounds its parameters."""

    spec: LayerSpec
    make: Callable[[], nn.Module]
    estimate: int


def _build_row(
    index: int,
    row: Any,
    built: list[_Layer],
    origin: str,
    nc: int,
    gd: float,
    gw: float,
    anchors: tuple | int,
    activation: Callable[[], nn.Module] | None,
) -> _Layer:
    """One row resolved and checked (nothing built)."""
    where = f"layer {index} in {origin}"
    if not (isinstance(row, list | tuple) and len(row) == 4):
        raise ConfigError(f"{where}: expected a row [from, number, module, args], got {row!r}")
    source, number, name, raw_args = row
    if not isinstance(name, str) or name not in MODULES:
        raise ConfigError(f"{where}: unknown module {name!r}; known modules: {sorted(MODULES)}")
    kind = MODULES[name]
    where = f"layer {index} ({name}) in {origin}"
    sources = _resolve_sources(source, index, where)
    if not _positive_int(number) or number > MAX_REPEATS:
        raise ConfigError(
            f"{where}: number (repeats) must be an integer in [1, {MAX_REPEATS}], got {number!r}"
        )
    if not isinstance(raw_args, list | tuple):
        raise ConfigError(f"{where}: args must be a list, got {raw_args!r}")
    args = [_resolve_arg(a, nc, anchors) for a in raw_args]
    n = max(round(number * gd), 1) if number > 1 else number
    if n > MAX_REPEATS:
        raise ConfigError(
            f"{where}: number {number} x depth_multiple {gd} = {n} repeats, over the limit of {MAX_REPEATS}"
        )
    channels = [3 if s == INPUT else built[s].spec.out_channels for s in sources]
    strides = [1.0 if s == INPUT else built[s].spec.stride for s in sources]
    if kind.kind not in ("concat", "detect") and len(sources) != 1:
        raise ConfigError(f"{where}: takes one input, got {len(sources)}")

    if kind.kind in ("channels", "csp"):
        if not args or not _positive_int(args[0]):
            raise ConfigError(f"{where}: args must start with the output channels, got {list(raw_args)}")
        c1 = channels[0]
        na = anchors if isinstance(anchors, int) else len(anchors[0]) // 2
        if args[0] > MAX_CHANNELS:
            raise ConfigError(f"{where}: channels {args[0]} is over the limit of {MAX_CHANNELS}")
        c2 = args[0] if args[0] == na * (nc + 5) else _make_divisible(args[0] * gw)
        if c2 > MAX_CHANNELS:
            raise ConfigError(
                f"{where}: channels {args[0]} x width_multiple {gw} = {c2}, over the limit of {MAX_CHANNELS}"
            )
        leading = [c1, c2]
        if kind.kind == "csp":
            leading.append(n)
            n_inside, n = n, 1
        bound = _bind(kind, args, 1, where)
        ctor_args, shown = (*leading, *bound.values()), (*leading, *args[1:])
        if n > 1 and c1 != c2:
            raise ConfigError(f"{where}: {n} repeats of a {c1}→{c2} channel block cannot be chained")
        out_channels, stride = c2, strides[0] * float(kind.stride(bound)) ** n
        repeats = n_inside if kind.kind == "csp" else n
    elif kind.kind == "same":
        bound = _bind(kind, args, 0, where)
        ctor_args, shown = tuple(bound.values()), tuple(args)
        out_channels, stride, repeats = channels[0], strides[0] * float(kind.stride(bound)) ** n, n
    elif kind.kind == "concat":
        if n != 1:
            raise ConfigError(f"{where}: number must be 1, got {number}")
        bound = _bind(kind, args, 0, where)
        if len(set(strides)) != 1:
            raise ConfigError(f"{where}: inputs have different strides {strides}")
        ctor_args, shown = tuple(bound.values()), tuple(args)
        out_channels, stride, repeats = sum(channels), strides[0], 1
    else:  # detect
        return _build_detect(index, sources, args, channels, strides, n, where, name)

    def make() -> nn.Module:
        module = kind.cls(*ctor_args)
        if activation is not None:
            for child in module.modules():
                if isinstance(child, blocks.Conv) and child.activated:
                    child.act = activation()
        return module

    def make_all() -> nn.Module:
        return make() if n == 1 else nn.Sequential(*(make() for _ in range(n)))

    spec = LayerSpec(index, sources, repeats, name, shown, out_channels, stride)
    return _Layer(spec, make_all, _parameter_estimate(kind.kind, bound, channels, out_channels, n))


def _build_detect(
    index: int,
    sources: tuple[int, ...],
    args: list,
    channels: list[int],
    strides: list[float],
    n: int,
    where: str,
    name: str,
) -> _Layer:
    if n != 1 or len(args) != 2:
        raise ConfigError(f"{where}: expected number 1 and args [nc, anchors], got {n} and {args}")
    nc, anchors = args
    if not _positive_int(nc) or nc > MAX_CLASSES:
        raise ConfigError(f"{where}: nc must be an integer in [1, {MAX_CLASSES:,}], got {nc!r}")
    anchors = _check_anchors(anchors, where)
    if isinstance(anchors, int):  # placeholders (0, 1, 2, ...) for AutoAnchor to replace, as the release
        anchors = tuple(tuple(float(v) for v in range(2 * anchors)) for _ in sources)
    if not 1 <= len(sources) <= 5 or len(anchors) != len(sources):
        raise ConfigError(f"{where}: {len(anchors)} anchor rows for {len(sources)} inputs (1 to 5 levels)")
    anchors = _anchor_order(anchors, strides)
    na = len(anchors[0]) // 2
    head_parameters = sum((c + 1) * na * (nc + 5) for c in channels)  # one 1x1 conv (+ bias) per level
    ctor_args = (nc, [list(a) for a in anchors], list(channels))
    spec = LayerSpec(index, sources, 1, name, ctor_args, nc + 5, 0.0)
    return _Layer(spec, lambda: Detect(nc, anchors, channels, strides), head_parameters)


def _parameter_estimate(
    kind: str, bound: dict, channels: Sequence[int], out_channels: int, repeats: int
) -> int:
    """An upper bound of a row's parameters without building it: every block here is at most a few
    convolutions per repeat (a C3 with n bottlenecks: 3 + 2n), each at most 3x3 or the row's kernel `k`,
    between its widest input, output or hidden (`e` x output) channels."""
    if kind in ("concat", "same"):
        return 0  # Concat, Upsample, MaxPool2d, ZeroPad2d: no parameters
    k = bound.get("k", 1)
    kernel_area = max(k * k if _is_int(k) else math.prod(k) if _kernel(k) else 1, 9)
    widest = math.ceil(max(*channels, out_channels) * max(bound.get("e", 1), 1))
    units = 3 + 2 * repeats if kind == "csp" else 4 * repeats  # CSP repeats are the inside bottlenecks
    return units * (kernel_area + 4) * widest * widest


def _check_parameters(layers: Sequence[_Layer], origin: str) -> None:
    """ConfigError naming the first layer at which the parameters exceed MAX_PARAMETERS. Counted
    exactly (built on the meta device: no memory) only when the estimates add up to more than that."""
    if sum(layer.estimate for layer in layers) <= MAX_PARAMETERS:
        return
    total = 0
    with torch.device("meta"):
        for layer in layers:
            total += sum(p.numel() for p in layer.make().parameters())
            if total > MAX_PARAMETERS:
                raise ConfigError(
                    f"layer {layer.spec.index} ({layer.spec.block}) in {origin}: {total:,} parameters up to "
                    f"this layer, over the limit of {MAX_PARAMETERS:,} (check depth_multiple, "
                    "width_multiple, the repeats, channels, anchors and nc)"
                )


def _anchor_order(anchors: tuple, strides: Sequence[float]) -> tuple:
    """Levels' anchors reversed when their mean area runs against the strides (the release's check)."""
    areas = [sum(r[i] * r[i + 1] for i in range(0, len(r), 2)) / (len(r) // 2) for r in anchors]
    da, ds = areas[-1] - areas[0], strides[-1] - strides[0]
    if da and ds and (da > 0) != (ds > 0):
        return tuple(reversed(anchors))
    return anchors


def _resolve_sources(value: Any, index: int, where: str) -> tuple[int, ...]:
    """'from' (an int or a list; negative = relative to this layer) → absolute indices."""
    items = value if isinstance(value, list | tuple) else [value]
    if not items or not all(_is_int(v) for v in items):
        raise ConfigError(f"{where}: 'from' must be a layer index or a list of them, got {value!r}")
    sources = tuple(index + v if v < 0 else v for v in items)
    if any(s >= index or s < INPUT for s in sources) or (INPUT in sources and index != 0):
        raise ConfigError(f"{where}: 'from' {value!r} must name earlier layers")
    return sources


def _build_layers(config: dict) -> list[_Layer]:
    origin = config.get("name", "the model config")
    nc, gd, gw = config["nc"], config["depth_multiple"], config["width_multiple"]
    if not _positive_int(nc):
        raise ConfigError(f"{origin}: nc must be a positive integer, got {nc!r}")
    if nc > MAX_CLASSES:
        raise ConfigError(f"{origin}: nc {nc} is over the limit of {MAX_CLASSES:,}")
    for key, value in (("depth_multiple", gd), ("width_multiple", gw)):
        if not _is_number(value) or not 0 < value <= MAX_MULTIPLE:
            raise ConfigError(f"{origin}: {key} must be a number in (0, {MAX_MULTIPLE:g}], got {value!r}")
    anchors = _check_anchors(config["anchors"], origin)
    activation = None
    if config.get("activation") is not None:
        activation = parse_activation(config["activation"], f"{origin}: activation")
    rows = []
    for key in ("backbone", "head"):
        if not isinstance(config[key], list):
            raise ConfigError(f"{origin}: {key} must be a list of rows [from, number, module, args]")
        rows += config[key]
    if not rows:
        raise ConfigError(f"{origin}: backbone and head hold no layers")
    if len(rows) > MAX_LAYERS:
        raise ConfigError(
            f"{origin}: {len(rows)} layers in backbone and head, over the limit of {MAX_LAYERS}"
        )
    built: list[_Layer] = []
    for index, row in enumerate(rows):
        built.append(_build_row(index, row, built, origin, nc, gd, gw, anchors, activation))
    if built[-1].spec.block != "Detect" or any(layer.spec.block == "Detect" for layer in built[:-1]):
        raise ConfigError(f"{origin}: the last layer, and only the last, must be Detect")
    _check_parameters(built, origin)
    return built


def resolve_layers(config: dict) -> list[LayerSpec]:
    """The config's layers, scaled and wired (their modules are built on the meta device and dropped)."""
    layers = _build_layers(load_model_config(config))
    with torch.device("meta"):
        for layer in layers:
            layer.make()
    return [layer.spec for layer in layers]


def _apply_activation_overrides(model: nn.Module, overrides: Any, origin: str) -> None:
    """Set the activation modules a checkpoint's config lists by module path (e.g. an older release's
    BottleneckCSP, whose own activation was LeakyReLU(0.1))."""
    if not isinstance(overrides, dict):
        raise ConfigError(f"{origin}: {ACTIVATION_OVERRIDES} must map module paths to activations")
    for path, text in overrides.items():
        factory = parse_activation(text, f"{origin}: {ACTIVATION_OVERRIDES}[{path!r}]")
        parent_path, _, attr = str(path).rpartition(".")
        try:
            parent = model.get_submodule(parent_path)
            current = getattr(parent, attr)
        except AttributeError:
            raise ConfigError(f"{origin}: {ACTIVATION_OVERRIDES}: the model has no module {path!r}") from None
        if type(current).__name__ not in _ACTIVATIONS:
            raise ConfigError(
                f"{origin}: {ACTIVATION_OVERRIDES}: {path!r} is a {type(current).__name__}, not an activation"
            )
        setattr(parent, attr, factory())


class DetectionModel(nn.Module):
    """A YOLOv5 detector: `model` (ModuleList of layers, so keys are `model.{i}...`) wired by `layers`.

    Input: float images [B, 3, H, W] in [0, 1], H and W multiples of the largest stride (32, 64 for P6).
    Training: `forward(x)` → list of nl raw tensors [B, na, ny, nx, 5 + nc].
    Eval: → (pred [B, N, 5 + nc] with xywh in input pixels and sigmoid scores, raw list).
    """

    def __init__(self, config: dict, layers: list[LayerSpec], modules: Sequence[nn.Module]) -> None:
        super().__init__()
        self.cfg = config
        self.layers = layers
        self.model = nn.ModuleList(modules)
        self.nc: int = self.detect.nc
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
            if isinstance(module, blocks.Conv):
                module.fuse()
        return self


def build_model(cfg: str | Path | dict, nc: int | None = None, anchors: Any = None) -> DetectionModel:
    """Build a DetectionModel from a config name ("yolov5s", "yolov5s6.yaml"), YAML path or dict, with
    `nc` and `anchors` (pixel (w, h) pairs per level) overriding the config's. Detect biases get the
    from-scratch prior."""
    config = load_model_config(cfg)
    if nc is not None:
        config["nc"] = nc
    if anchors is not None:
        config["anchors"] = anchors
    built = _build_layers(config)
    model = DetectionModel(config, [layer.spec for layer in built], [layer.make() for layer in built])
    if config.get(ACTIVATION_OVERRIDES):
        _apply_activation_overrides(model, config[ACTIVATION_OVERRIDES], str(config.get("name")))
    model.detect.initialize_biases()
    return model


def activation_names() -> frozenset[str]:
    """The class names of the activations a config can name."""
    return frozenset(_ACTIVATIONS)
