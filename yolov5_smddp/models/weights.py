"""Checkpoint I/O for models: our own weights format, and the release's `.pt` files read safely.

Ours: `torch.save` of {"format", "state_dict": plain tensors, "meta": JSON-able metadata}, written
atomically and read back with `torch.load(weights_only=True)`. Our training checkpoints (`last.pt`,
`epochN.pt`, the checkpoint folder's `best.pt`: checkpoint.py) are read the same way and give their EMA
weights. The release's `.pt` (pickled model objects) goes through the allow-listed reader in
`release_pickle`.
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

from yolov5_smddp.errors import ConfigError, WeightsError
from yolov5_smddp.files.atomic import atomic_write
from yolov5_smddp.files.bounded_read import not_regular_reason, shown
from yolov5_smddp.models.blocks import Conv
from yolov5_smddp.models.release_pickle import PickledModule, ReleaseModel, read_release_checkpoint
from yolov5_smddp.models.torchfile import check_torch_file, torch_error_line
from yolov5_smddp.models.wrappers import unwrap
from yolov5_smddp.models.yolo import ACTIVATION_OVERRIDES, DetectionModel, activation_names, build_model

FORMAT = "yolov5-smddp/weights/v1"
# The tag of our training checkpoints (train/checkpoint.py writes it), declared here where weight files are
# told apart, so that models/ never imports train/.
TRAINING_CHECKPOINT_FORMAT = "yolov5-smddp-train-checkpoint/1"
MAX_META_VALUES = 1_000_000
"""Values in a weights file's metadata as JSON would write them (yolov5x6's: ~1,000). A list that holds
the same list twice, nested 40 deep, is a few hundred bytes in the file and 2**40 values written out."""
_ACTIVATION_NAMES = activation_names()


@dataclass(frozen=True)
class LoadedWeights:
    """What a weights file holds. `cfg` / `nc` / `names` are None when the file does not say (a bare
    state dict); `source` is "yolov5-smddp", "training checkpoint", "release" or "state_dict"."""

    state_dict: dict[str, torch.Tensor]
    cfg: dict | None
    nc: int | None
    names: list[str] | None
    source: str
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TransferReport:
    """Outcome of `transfer_state`: which tensors were copied and which keys were not.

    `loaded` counts every copied key; `tensors` / `total_tensors` count only real parameters and buffers
    (BatchNorm's `num_batches_tracked` counters are left out: they match whatever the architecture), and
    `copied_params` / `total_params` count the model's parameter elements that came from the checkpoint
    (a Detect conv in `partial` contributes its box/objectness rows)."""

    loaded: int
    skipped_shape: list[str]  # in both, shapes differ (e.g. the Detect convs for another nc)
    missing: list[str]  # in the model only
    unexpected: list[str]  # in the checkpoint only
    excluded: list[str] = field(default_factory=list)  # matched an `exclude` pattern
    partial: list[str] = field(default_factory=list)  # Detect convs: box/objectness rows kept, class rows new
    tensors: int = 0
    total_tensors: int = 0
    copied_params: int = 0
    total_params: int = 0

    @property
    def param_fraction(self) -> float:
        """Share of the model's parameter elements that came from the checkpoint (0..1)."""
        return self.copied_params / self.total_params if self.total_params else 0.0

    def line(self) -> str:
        """`transferred N/M tensors (P% of parameters)`, as the training log prints it."""
        text = f"transferred {self.tensors}/{self.total_tensors} tensors ({100 * self.param_fraction:.1f}% of parameters)"
        if self.partial:
            text += (
                f"; the {len(self.partial) // 2} Detect convs keep their box/objectness rows, class rows new"
            )
        return text

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


def check_meta(meta: object, path: Path) -> dict:
    """Our format's metadata, checked before anything reads it: a dict of at most MAX_META_VALUES values
    counted as written out (each shared reference again), `names` a list of strings. WeightsError
    naming the file otherwise."""
    if not isinstance(meta, dict):
        raise WeightsError(f"{path}: its metadata is a {type(meta).__name__}, not a mapping")
    pending, seen = [meta], 0
    while pending:
        value = pending.pop()
        seen += 1
        if seen > MAX_META_VALUES:
            raise WeightsError(
                f"{path}: its metadata holds over {MAX_META_VALUES:,} values (nested or repeated references); "
                "refused"
            )
        if isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list | tuple):
            pending.extend(value)
    names = meta.get("names")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise WeightsError(f"{path}: its class names (meta 'names') are not a list of strings")
    return meta


def load_weights(path: str | Path) -> LoadedWeights:
    """Read ours, a bare state dict, or the release's `.pt`, never executing code from the file.
    Raises WeightsError naming the file when it is missing, unreadable or unsafe."""
    path = Path(path)
    try:
        not_regular = not_regular_reason(path)
    except OSError:
        raise WeightsError(f"weights file {shown(path)} does not exist") from None
    if not_regular:
        raise WeightsError(f"weights file {shown(path)}: {not_regular}")
    if not zipfile.is_zipfile(path):
        raise WeightsError(f"{shown(path)}: not a PyTorch checkpoint (expected the zip format of torch.save)")
    check_torch_file(path)  # declared sizes bounded before torch or the release reader allocates
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        return _load_release(path)  # holds more than plain data: try the release's model objects
    except Exception as exc:  # a corrupt archive raises RuntimeError, EOFError, KeyError, ...
        raise WeightsError(
            f"{shown(path)}: cannot be read as a PyTorch checkpoint ({torch_error_line(exc)})"
        ) from exc
    if isinstance(obj, dict) and obj.get("format") == FORMAT:
        meta = check_meta(obj.get("meta"), path)
        cfg = meta.get("cfg")
        if isinstance(cfg, dict) and "layers" in cfg:
            cfg = config_from_first_layout(cfg, path)
        return LoadedWeights(obj["state_dict"], cfg, meta.get("nc"), meta.get("names"), "yolov5-smddp", meta)
    if isinstance(obj, dict) and obj.get("format") == TRAINING_CHECKPOINT_FORMAT:
        return _from_training_checkpoint(obj, path)
    if (
        isinstance(obj, dict)
        and obj
        and all(isinstance(k, str) and torch.is_tensor(v) for k, v in obj.items())
    ):
        return LoadedWeights(dict(obj), None, None, None, "state_dict")
    raise WeightsError(f"{path}: a torch file, but neither our weights format nor a state dict")


def _from_training_checkpoint(state: dict, path: Path) -> LoadedWeights:
    """The EMA weights of one of our training checkpoints (the weights it validates and best.pt keeps),
    with its model config; names where the checkpoint records them (0.x checkpoints do not)."""
    try:
        weights, cfg = state["ema"]["state_dict"], state["model_cfg"]
    except (KeyError, TypeError) as exc:
        raise WeightsError(f"{path}: a training checkpoint without its EMA weights or model config") from exc
    if isinstance(cfg, dict) and "layers" in cfg:
        cfg = config_from_first_layout(cfg, path)
    names = state.get("names")
    nc = cfg.get("nc") if isinstance(cfg, dict) else None
    meta = {"epoch": state.get("epoch"), "from": "the EMA of a training checkpoint"}
    return LoadedWeights(dict(weights), cfg, nc, list(names) if names else None, "training checkpoint", meta)


def _is_counter(key: str) -> bool:
    return key.endswith("num_batches_tracked")


def _detect_rows(own: torch.Tensor, theirs: torch.Tensor, na: int) -> torch.Tensor | None:
    """A Detect conv weight/bias for another number of classes: `own` with the first 5 rows of each
    anchor (box, objectness) taken from `theirs`; None when the two do not line up that way."""
    if own.dim() != theirs.dim() or own.shape[1:] != theirs.shape[1:]:
        return None
    if own.shape[0] % na or theirs.shape[0] % na or min(own.shape[0], theirs.shape[0]) // na < 5:
        return None
    merged = own.detach().clone().view(na, own.shape[0] // na, *own.shape[1:])
    rows = theirs.to(own.dtype).view(na, theirs.shape[0] // na, *theirs.shape[1:])
    merged[:, :5] = rows[:, :5]
    return merged.view_as(own)


def transfer_state(
    model: nn.Module,
    state_dict: dict[str, torch.Tensor],
    *,
    exclude: Collection[str] = (),
    detect_rows: bool = False,
) -> TransferReport:
    """Copy every tensor of `state_dict` whose key and shape match `model`'s (cast to the model's dtype
    and device); keys containing any `exclude` string are left alone. For transfer learning, e.g. a COCO
    checkpoint into an nc=3 model (the three Detect convs are skipped). With `detect_rows`, a Detect conv
    whose shape differs only by the number of classes keeps the checkpoint's box/objectness rows and gets
    new class rows (listed in `partial` instead of `skipped_shape`)."""
    model = _detection_model(model)
    own = model.state_dict()
    params = dict(model.named_parameters())
    excluded = [k for k in state_dict if k in own and any(pattern in k for pattern in exclude)]
    usable = {k: v for k, v in state_dict.items() if k in own and k not in excluded}
    matching = {k: v for k, v in usable.items() if v.shape == own[k].shape}
    partial: dict[str, torch.Tensor] = {}
    copied = sum(v.numel() for k, v in matching.items() if k in params)
    if detect_rows:  # per Detect conv: the weight first; its bias follows only if the weight fits
        head = f"model.{len(model.model) - 1}.m."
        for key in sorted(
            k for k in usable if k.startswith(head) and k.endswith(".weight") and k not in matching
        ):
            bias = key.removesuffix("weight") + "bias"
            merged = _detect_rows(own[key], usable[key], model.detect.na)
            merged_bias = _detect_rows(own[bias], usable[bias], model.detect.na) if bias in usable else None
            if merged is None or merged_bias is None:
                continue
            partial.update({key: merged, bias: merged_bias})
            copied += model.detect.na * 5 * (merged.numel() // merged.shape[0] + 1)
    model.load_state_dict({**matching, **partial}, strict=False)
    real = [k for k in own if not _is_counter(k)]
    return TransferReport(
        loaded=len(matching),
        skipped_shape=[k for k in usable if k not in matching and k not in partial],
        missing=[k for k in own if k not in state_dict],
        unexpected=[k for k in state_dict if k not in own],
        excluded=excluded,
        partial=list(partial),
        tensors=sum(1 for k in matching if not _is_counter(k)),
        total_tensors=len(real),
        copied_params=copied,
        total_params=sum(p.numel() for p in params.values()),
    )


# Our first config layout (`layers`: {from, repeats, block, args}, up to 0.1.0-1b6775095), as written in the
# checkpoints of those versions: block -> (the release's module name, its args from ours).
_FIRST_LAYOUT_BLOCKS = {
    "Conv": ("Conv", lambda args, cfg: list(args)),
    "C3": ("C3", lambda args, cfg: list(args)),
    "SPPF": ("SPPF", lambda args, cfg: list(args)),
    "Upsample": ("nn.Upsample", lambda args, cfg: [None, *args]),
    "Concat": ("Concat", lambda args, cfg: list(args)),
    "Detect": ("Detect", lambda args, cfg: ["nc", "anchors"]),
}


def config_from_first_layout(cfg: dict, path: Path | str = "checkpoint") -> dict:
    """A model config of our first layout (`layers` rows) in the release's format (`backbone` / `head`
    rows [from, number, module, args]): the same layers, in the same order, with the same scaling rules,
    so the same state dict keys and the same function. Checkpoints of earlier versions of this package
    carry that layout. Raises WeightsError naming the row it cannot convert."""
    rows = []
    for index, entry in enumerate(cfg.get("layers") or []):
        block = entry.get("block") if isinstance(entry, dict) else None
        if block not in _FIRST_LAYOUT_BLOCKS:
            raise WeightsError(
                f"{path}: layer {index} of its model config ({entry!r}) is no block of this layout"
            )
        module, convert = _FIRST_LAYOUT_BLOCKS[block]
        rows.append(
            [entry.get("from", -1), entry.get("repeats", 1), module, convert(entry.get("args", []), cfg)]
        )
    if not rows:
        raise WeightsError(f"{path}: its model config has an empty `layers` list")
    # the split is only for reading: the layer index runs on through both lists (the release's P5 yamls
    # end the backbone at SPPF)
    sppf = [i for i, row in enumerate(rows) if row[2] == "SPPF"]
    split = sppf[-1] + 1 if sppf else len(rows) - 1
    converted = {k: v for k, v in cfg.items() if k != "layers"}
    converted.update(backbone=rows[:split], head=rows[split:])
    return converted


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
    cfg = config_for_release(release, path)
    state = {k: v for k, v in release.state_dict.items() if not k.endswith(".anchor_grid")}
    return LoadedWeights(state, cfg, cfg["nc"], release.names, "release")


# attributes that fix a module's computation beyond its tensors' shapes, compared per pickled module
_STRUCTURE_ATTRS = (
    "kernel_size",
    "stride",
    "padding",
    "dilation",
    "groups",
    "scale_factor",
    "mode",
    "negative_slope",
    "add",
    "num_heads",
    "embed_dim",
    "c2",
)
_SAME_CLASS = {"Sequential": "ModuleList", "Model": "DetectionModel"}


def _architecture_differences(model: nn.Module, release: ReleaseModel) -> tuple[dict[str, str], list[str]]:
    """Compare the pickled model's module tree with `model`'s: (activation modules that differ, as
    {path: config spelling}, and every other difference as a sentence naming the module and class)."""
    ours = dict(model.named_modules())
    activations, problems = {}, []
    for path, record in release.modules.items():
        mine = ours.get(path)
        theirs = _SAME_CLASS.get(record.class_name, record.class_name)
        if mine is None:
            problems.append(f"{path} ({record.qualname}) has no counterpart in the model its yaml builds")
            continue
        name = _SAME_CLASS.get(type(mine).__name__, type(mine).__name__)
        if name != theirs or any(
            record.attrs.get(attr) != getattr(mine, attr)
            for attr in _STRUCTURE_ATTRS
            if attr in record.attrs and hasattr(mine, attr) and not isinstance(getattr(mine, attr), nn.Module)
        ):
            is_activation = (
                record.class_name in _ACTIVATION_NAMES and type(mine).__name__ in _ACTIVATION_NAMES
            )
            if is_activation and path:
                activations[path] = _activation_of(record)
                continue
            problems.append(
                f"{path or 'the model'} is a {record.qualname} {_shown(record.attrs)} in the checkpoint but "
                f"a {type(mine).__name__} in the model its yaml builds"
            )
    missing = [p for p in ours if p and p not in release.modules]
    problems += [f"{p} ({type(ours[p]).__name__}) is not in the checkpoint" for p in missing[:3]]
    return activations, problems


def _shown(attrs: dict) -> str:
    shown = {k: v for k, v in attrs.items() if k in _STRUCTURE_ATTRS}
    return f"{shown}" if shown else ""


def _activation_of(record: PickledModule) -> str:
    """The config spelling of a pickled activation module."""
    slope = record.attrs.get("negative_slope")
    if record.class_name == "LeakyReLU":
        return f"nn.LeakyReLU({slope!r})"
    if record.class_name == "ELU":
        return f"nn.ELU({record.attrs.get('alpha', 1.0)!r})"
    if record.class_name == "GELU" and record.attrs.get("approximate", "none") != "none":
        return f"nn.GELU(approximate={record.attrs['approximate']!r})"
    return f"nn.{record.class_name}()"


def config_for_release(release: ReleaseModel, path: Path | str = "checkpoint") -> dict:
    """The model config that rebuilds the release model exactly: its stored yaml (the release's format,
    read as written: the string 'None' is None), its anchors and strides as stored, and the activations
    its pickled modules use where they differ from what the yaml builds (older releases' Hardswish
    convolutions, LeakyReLU inside BottleneckCSP). WeightsError naming the module and class when the
    architecture cannot be rebuilt; no other model is ever substituted."""
    if not release.yaml:
        raise WeightsError(f"{path}: the release model holds no yaml to rebuild its architecture from")
    config = dict(release.yaml)
    config["name"] = f"{Path(str(path)).name} (a release checkpoint)"
    anchor_keys = [k for k in release.state_dict if k.endswith(".anchors")]
    anchors = release.state_dict[anchor_keys[-1]] if anchor_keys else None
    if anchors is not None and release.stride is not None and release.stride.numel() == anchors.shape[0]:
        pixels = anchors.float() * release.stride.float().view(-1, 1, 1)
        config["anchors"] = [[round(v, 4) for v in level.flatten().tolist()] for level in pixels]
    try:
        for attempt in range(2):
            with torch.device("meta"):
                model = build_model(config)
            activations, problems = _architecture_differences(model, release)
            if problems or not activations or attempt:
                break
            config = _with_activations(config, activations, model)
    except ConfigError as exc:
        raise WeightsError(f"{path}: its model config cannot be built ({exc})") from exc
    if problems or activations:
        listed = problems + [f"{p} is a {a}" for p, a in activations.items()]
        raise WeightsError(
            f"{path}: the model its yaml builds differs from the pickled one, so it cannot be rebuilt "
            f"exactly: {'; '.join(listed[:3])}"
            + (f" (and {len(listed) - 3} more)" if len(listed) > 3 else "")
        )
    stride = [float(v) for v in release.stride.tolist()] if release.stride is not None else None
    if stride is not None and stride != list(model.detect.strides):
        raise WeightsError(
            f"{path}: the checkpoint's strides {stride} differ from the strides its yaml builds "
            f"{list(model.detect.strides)}"
        )
    return config


def _with_activations(config: dict, activations: dict[str, str], model: nn.Module) -> dict:
    """`config` with the checkpoint's activations: one `activation` when every activated Conv uses the
    same one, else per-path `activations` overrides."""
    config = dict(config)
    conv_acts = {f"{name}.act" for name, m in model.named_modules() if isinstance(m, Conv) and m.activated}
    texts = {activations.get(p) for p in conv_acts}
    rest = activations
    if conv_acts and conv_acts <= activations.keys() and len(texts) == 1:
        config["activation"] = texts.pop()
        rest = {p: a for p, a in activations.items() if p not in conv_acts}
    if rest:
        config[ACTIVATION_OVERRIDES] = dict(sorted(rest.items()))
    return config
