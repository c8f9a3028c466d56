"""Which model a run trains and what it starts from: `initial_model` decides, from --cfg, --weights and the
dataset's classes, and says so in one log line.

The release's rules:
- `--weights` without `--cfg`: the checkpoint defines the architecture (its config: depth/width multiples,
  layers, anchors); only the Detect head's class rows are new when the dataset's nc differs (the box and
  objectness rows keep the checkpoint's values). Anchors come from the checkpoint, so anchors fitted to a
  dataset survive fine-tuning.
- `--cfg` with `--weights`: the cfg's architecture and anchors; tensors transfer by name and shape. When
  less than half of the model's parameter elements would come from the checkpoint, the two do not fit: a
  ConfigError names both, unless `allow_partial` (`--allow-partial-transfer`) says it is on purpose.
- neither: `--cfg` (default yolov5s) from scratch.
- resuming: the architecture stored in the training checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from yolov5_smddp.errors import ConfigError, WeightsError
from yolov5_smddp.models.weights import LoadedWeights, TransferReport, load_weights, transfer_state
from yolov5_smddp.models.yolo import (
    ACTIVATION_OVERRIDES,
    PACKAGE_CONFIGS,
    DetectionModel,
    build_model,
    load_model_config,
)

DEFAULT_CFG = "yolov5s"
MIN_TRANSFER = 0.5


@dataclass(frozen=True)
class InitialModel:
    """The model to train, where it came from, and the line the log prints."""

    model: DetectionModel
    architecture: str  # "yolov5n", or the config's name
    from_checkpoint: bool  # architecture taken from --weights (or the resumed checkpoint)
    anchors_from: str  # "the checkpoint" or the config's name
    transfer: TransferReport | None
    line: str


def architecture_name(config: dict) -> str:
    """ "yolov5n" etc. when `config` has a packaged config's multiples, layers and activations, else its
    name (or its multiples when it has none)."""
    keys = ("depth_multiple", "width_multiple", "backbone", "head", "activation", ACTIVATION_OVERRIDES)
    for name in PACKAGE_CONFIGS:
        packaged = load_model_config(name)
        if all(config.get(k) == packaged.get(k) for k in keys):
            return name
    named = config.get("name")
    if isinstance(named, str) and named and named != "the model config":
        return Path(named).name.removesuffix(".yaml").removesuffix(".yml")
    return f"custom (depth {config.get('depth_multiple')}, width {config.get('width_multiple')})"


def initial_model(
    cfg: str | None,
    weights: str | None,
    nc: int,
    names: list[str],
    *,
    allow_partial: bool = False,
    resume_cfg: dict | None = None,
) -> InitialModel:
    """Build the model a run starts from (see the module docstring). ConfigError / WeightsError name the
    option or file and say what to do."""
    if resume_cfg is not None:
        model = build_model(resume_cfg, nc=nc)
        arch = architecture_name(model.cfg)
        result = InitialModel(
            model,
            arch,
            True,
            "the checkpoint",
            None,
            f"model: {arch} (nc {nc}) as in the checkpoint being resumed",
        )
    elif weights is None:
        model = build_model(cfg or DEFAULT_CFG, nc=nc)
        arch, source = architecture_name(model.cfg), model.cfg.get("name", cfg)
        line = f"model: {arch} from {source} (nc {nc}, anchors from {source}), trained from scratch (no --weights)"
        result = InitialModel(model, arch, False, str(source), None, line)
    else:
        result = _from_weights(cfg, weights, load_weights(weights), nc, allow_partial)
    result.model.names = list(names)
    return result


def _from_weights(
    cfg: str | None, weights: str, loaded: LoadedWeights, nc: int, allow_partial: bool
) -> InitialModel:
    if loaded.cfg is None and cfg is None:
        raise ConfigError(
            f"--weights {weights} holds only a state dict, without its architecture: give --cfg with the "
            f"model it was trained as (yolov5n/s/m/l/x or a YAML)"
        )
    checkpoint_arch = architecture_name(loaded.cfg) if loaded.cfg is not None else "an unknown architecture"
    checkpoint_nc = loaded.nc if loaded.nc is not None else (loaded.cfg or {}).get("nc")
    classes = f"nc {checkpoint_nc}→{nc}" if checkpoint_nc not in (None, nc) else f"nc {nc}"
    if cfg is None:
        try:
            model = build_model(loaded.cfg, nc=nc)
        except ConfigError as exc:
            raise WeightsError(f"--weights {weights}: its model config cannot be built ({exc})") from exc
        report = transfer_state(model, loaded.state_dict, detect_rows=True)
        arch, anchors_from = checkpoint_arch, "the checkpoint"
        line = (
            f"model: {arch} from weights {weights} ({classes}, anchors from the checkpoint); {report.line()}"
        )
    else:
        model = build_model(cfg, nc=nc)
        report = transfer_state(model, loaded.state_dict, exclude=("anchors",), detect_rows=True)
        arch, anchors_from = architecture_name(model.cfg), str(model.cfg.get("name", cfg))
        line = (
            f"model: {arch} from --cfg {cfg} (anchors from {anchors_from}), weights {weights} "
            f"({checkpoint_arch}, {classes}); {report.line()}"
        )
    if report.param_fraction < MIN_TRANSFER and not allow_partial:
        raise ConfigError(
            f"--cfg {cfg} does not fit --weights {weights}: the checkpoint is {checkpoint_arch}, the model "
            f"{arch}, and only {100 * report.param_fraction:.1f}% of its parameters would come from the "
            f"checkpoint ({report.tensors}/{report.total_tensors} tensors). Drop --cfg to fine-tune "
            f"{checkpoint_arch} as the checkpoint defines it, or pass --allow-partial-transfer to train "
            f"{arch} mostly from scratch on purpose"
            if cfg is not None
            else f"--weights {weights}: only {100 * report.param_fraction:.1f}% of the parameters of the "
            f"model its config builds ({checkpoint_arch}) could be loaded ({report.tensors}/"
            f"{report.total_tensors} tensors); pass --allow-partial-transfer to train it anyway"
        )
    return InitialModel(model, arch, cfg is None, anchors_from, report, line)
