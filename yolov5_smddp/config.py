"""Training configuration: the typed `TrainConfig`, its command-line form and the hyperparameter YAMLs.

`parse_train_args(argv)` is the one way a list of command-line words becomes a validated `TrainConfig`.
Every problem is a `ConfigError` naming the option or hyperparameter key, raised before any work starts.
Option names accept both spellings (`--batch-size` and `--batch_size`, as SageMaker hyperparameters often
arrive); boolean options accept an optional value (`--rect`, `--rect True`, `--rect false`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from yolov5_smddp.data.imageinfo import DEFAULT_MAX_PIXELS
from yolov5_smddp.errors import ConfigError

HYP_NAMES = ("scratch-low", "scratch-high")
OPTIMIZERS = ("SGD", "Adam", "AdamW")
AMP_MODES = ("auto", "fp16", "bf16", "off")
BACKENDS = ("auto", "smddp", "nccl", "gloo")
CACHE_MODES = ("ram",)  # decoded images in RAM, each rank its own shard

# Allowed closed ranges per hyperparameter key; the YAMLs in yolov5_smddp/hyps/ hold every key.
HYP_RANGES: dict[str, tuple[float, float]] = {
    "lr0": (1e-8, 1.0),
    "lrf": (1e-6, 1.0),
    "momentum": (0.0, 0.999),
    "weight_decay": (0.0, 0.1),
    "warmup_epochs": (0.0, 100.0),
    "warmup_momentum": (0.0, 0.999),
    "warmup_bias_lr": (0.0, 1.0),
    "box": (0.0, 100.0),
    "cls": (0.0, 100.0),
    "cls_pw": (1e-3, 100.0),
    "obj": (0.0, 100.0),
    "obj_pw": (1e-3, 100.0),
    "iou_t": (0.0, 1.0),
    "anchor_t": (1.0, 100.0),
    "fl_gamma": (0.0, 10.0),
    "hsv_h": (0.0, 1.0),
    "hsv_s": (0.0, 1.0),
    "hsv_v": (0.0, 1.0),
    "degrees": (0.0, 180.0),
    "translate": (0.0, 0.99),
    "scale": (0.0, 0.99),
    "shear": (0.0, 90.0),
    "perspective": (0.0, 0.001),
    "flipud": (0.0, 1.0),
    "fliplr": (0.0, 1.0),
    "mosaic": (0.0, 1.0),
    "mixup": (0.0, 1.0),
    "copy_paste": (0.0, 1.0),
}


@dataclass(kw_only=True)
class TrainConfig:
    """Every training option. Paths are strings as given; `None` means "use the default" (see
    `resolve_output_dirs`)."""

    data: str | None = None
    """data.yaml path; None → the embedded synthetic dataset generated under the cache folder."""
    cfg: str = "yolov5s"
    """model config: a name (yolov5n/s/m/l/x) or a YAML path."""
    weights: str | None = None
    """initial weights (ours or the release's .pt); None → train from scratch."""
    hyp: str = "scratch-low"
    """hyperparameters: a shipped name (scratch-low, scratch-high) or a YAML path."""
    hyp_overrides: dict[str, float] = field(default_factory=dict)
    """hyperparameter values replacing the file's (`--hyp-override lr0=0.02,mosaic=0`)."""
    epochs: int = 100
    """number of training epochs."""
    batch_size: int | None = None
    """GLOBAL batch over all ranks (the release's meaning); default 16 when batch_per_gpu is not given."""
    batch_per_gpu: int | None = None
    """batch per rank; the global batch is this times the world size."""
    imgsz: int = 640
    """train/val image size in pixels (a multiple of the largest stride, 32)."""
    workers: int = 8
    """maximum DataLoader workers per rank (also capped by CPUs per local rank and the batch)."""
    optimizer: str = "SGD"
    """SGD (Nesterov), Adam or AdamW."""
    cos_lr: bool = False
    """cosine instead of linear learning-rate decay."""
    label_smoothing: float = 0.0
    """class label smoothing epsilon."""
    patience: int = 100
    """early stopping: epochs without fitness improvement (0 disables)."""
    freeze: list[int] = field(default_factory=list)
    """layer indices to freeze; a single value n freezes layers 0..n-1 (the release's meaning)."""
    seed: int = 0
    """global random seed (each rank and worker derives its own)."""
    rect: bool = False
    """rectangular training batches (no mosaic)."""
    multi_scale: bool = False
    """vary the image size +/- 50% per batch (multiples of 32)."""
    sync_bn: bool = False
    """SyncBatchNorm under DDP (GPU backends only)."""
    cache: str | None = None
    """cache decoded images: 'ram' (each rank its shard); None → decode every time. No disk cache."""
    max_image_pixels: int = DEFAULT_MAX_PIXELS
    """skip images whose header claims more pixels (w * h) than this, before decoding them. 2^27 keeps
    a decoded image at 384 MiB, which every loader worker of every GPU may hold at once; OpenCV itself
    stops only at 2^30 (3 GiB), with an error."""
    amp: str = "auto"
    """mixed precision: auto (bf16 on GPUs that support it, fp16 on older GPUs, off on CPU), fp16, bf16, off."""
    backend: str = "auto"
    """process-group backend: auto (smddp if importable on CUDA, else nccl on CUDA, else gloo)."""
    channels_last: bool = True
    """use the channels_last memory format for the model and the input batch (faster convolutions with
    AMP on GPUs and with oneDNN on CPUs: yolov5n b8@320 CPU step 435 vs 458 ms fp32; `false` to disable)."""
    compile: bool = False
    """wrap the model in torch.compile."""
    log_every: int = 50
    """print a metric line (the only time losses are read back from the device) every N micro-steps."""
    model_dir: str | None = None
    """final weights, resolved config and metrics.json."""
    output_dir: str | None = None
    """results.csv and plots."""
    checkpoint_dir: str | None = None
    """last/best training checkpoints; a valid `last` here is resumed automatically."""
    cache_dir: str | None = None
    """label caches and the embedded dataset (nothing is ever written under a dataset); None →
    $XDG_CACHE_HOME/yolov5-smddp or ~/.cache/yolov5-smddp; on SageMaker the warm-pool cache, else
    /tmp/yolov5-smddp-cache."""
    tensorboard_dir: str | None = None
    """TensorBoard event files (optional; needs the tensorboard package)."""
    run_name: str | None = None
    """the MLflow run's name (mlflow_log; on SageMaker the training job's name)."""
    dist_timeout: float = 1800.0
    """collective timeout in seconds."""
    val_conf: float = 0.001
    """validation confidence threshold."""
    val_iou: float = 0.6
    """validation NMS IoU threshold."""
    max_det: int = 300
    """validation maximum detections per image."""
    noval: bool = False
    """validate only after the final epoch."""
    max_nonfinite_steps: int = 25
    """stop the run after this many consecutive optimizer steps with a non-finite loss or gradient."""
    inject_nonfinite_step: int | None = None
    """test hook (hidden from --help): make the loss NaN from this micro-step on."""

    def __post_init__(self) -> None:
        _check(self.epochs >= 1, "--epochs", self.epochs, "must be >= 1")
        for name in ("batch_size", "batch_per_gpu"):
            value = getattr(self, name)
            _check(value is None or value >= 1, _opt(name), value, "must be >= 1")
        _check(
            self.imgsz >= 32 and self.imgsz % 32 == 0,
            "--imgsz",
            self.imgsz,
            "must be a multiple of 32 (>= 32)",
        )
        _check(0 <= self.workers <= 64, "--workers", self.workers, "must be in 0..64")
        _check(
            self.optimizer in OPTIMIZERS,
            "--optimizer",
            self.optimizer,
            f"must be one of {', '.join(OPTIMIZERS)}",
        )
        _check(
            0.0 <= self.label_smoothing < 1.0, "--label-smoothing", self.label_smoothing, "must be in [0, 1)"
        )
        _check(self.patience >= 0, "--patience", self.patience, "must be >= 0")
        _check(all(i >= 0 for i in self.freeze), "--freeze", self.freeze, "layer indices must be >= 0")
        _check(
            self.cache in (None, *CACHE_MODES),
            "--cache",
            self.cache,
            "must be 'ram' (or absent); there is no disk cache",
        )
        _check(self.max_image_pixels >= 1, "--max-image-pixels", self.max_image_pixels, "must be >= 1")
        _check(self.amp in AMP_MODES, "--amp", self.amp, f"must be one of {', '.join(AMP_MODES)}")
        _check(self.backend in BACKENDS, "--backend", self.backend, f"must be one of {', '.join(BACKENDS)}")
        _check(self.log_every >= 1, "--log-every", self.log_every, "must be >= 1")
        _check(self.dist_timeout > 0, "--dist-timeout", self.dist_timeout, "must be > 0 seconds")
        _check(0.0 <= self.val_conf < 1.0, "--val-conf", self.val_conf, "must be in [0, 1)")
        _check(0.0 < self.val_iou <= 1.0, "--val-iou", self.val_iou, "must be in (0, 1]")
        _check(self.max_det >= 1, "--max-det", self.max_det, "must be >= 1")
        _check(
            self.max_nonfinite_steps >= 1, "--max-nonfinite-steps", self.max_nonfinite_steps, "must be >= 1"
        )
        for key, value in self.hyp_overrides.items():
            check_hyp_value(key, value, source="--hyp-override")
        if len(self.freeze) == 1:  # the release's `--freeze 10`: the first 10 layers
            self.freeze = list(range(self.freeze[0]))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able copy of every field (what checkpoints and the model folder record)."""
        return dataclasses.asdict(self)


def _opt(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check(ok: bool, option: str, value: object, why: str) -> None:
    if not ok:
        raise ConfigError(f"{option}={value!r} {why}")


# ---------------------------------------------------------------------------------------------- batches


@dataclass(frozen=True)
class BatchPlan:
    """global_batch = per_rank * world_size."""

    global_batch: int
    per_rank: int


def plan_batch(batch_size: int | None, batch_per_gpu: int | None, world_size: int) -> BatchPlan:
    """Split the global batch over `world_size` ranks; a global batch that does not divide is an error."""
    if batch_per_gpu is not None:
        if batch_size is not None and batch_size != batch_per_gpu * world_size:
            raise ConfigError(
                f"--batch-size={batch_size} contradicts --batch-per-gpu={batch_per_gpu} with {world_size} "
                f"rank(s) (= global batch {batch_per_gpu * world_size}); give only one of them"
            )
        return BatchPlan(batch_per_gpu * world_size, batch_per_gpu)
    total = 16 if batch_size is None else batch_size
    if total % world_size:
        raise ConfigError(
            f"--batch-size={total} is the GLOBAL batch and must be divisible by the world size {world_size}; "
            f"use e.g. --batch-size {max(1, total // world_size) * world_size} or --batch-per-gpu"
        )
    return BatchPlan(total, total // world_size)


# ---------------------------------------------------------------------------------------- hyperparameters


def check_hyp_value(key: str, value: object, *, source: str) -> float:
    """Return `value` as a float if `key` is a known hyperparameter and the value lies in its range."""
    if key not in HYP_RANGES:
        raise ConfigError(f"{source}: unknown hyperparameter {key!r}; known keys: {', '.join(HYP_RANGES)}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{source}: hyperparameter {key}={value!r} is not a number")
    low, high = HYP_RANGES[key]
    if not (math.isfinite(value) and low <= value <= high):
        raise ConfigError(f"{source}: hyperparameter {key}={value!r} is out of range [{low}, {high}]")
    return float(value)


def hyp_path(name_or_path: str) -> Path | None:
    """The shipped YAML for a name (`scratch-low`, `hyp.scratch-low.yaml`), else None."""
    stem = name_or_path.removeprefix("hyp.").removesuffix(".yaml")
    if stem in HYP_NAMES:
        return Path(str(resources.files("yolov5_smddp") / "hyps" / f"hyp.{stem}.yaml"))
    return None


def load_hyp(name_or_path: str, overrides: dict[str, float] | None = None) -> dict[str, float]:
    """Read a hyperparameter YAML (shipped name or path), validate it and apply `overrides`.

    A user file may hold a subset of the keys; the rest come from scratch-low. Unknown keys and
    out-of-range values are ConfigErrors naming the key and the file.
    """
    path = hyp_path(name_or_path) or Path(name_or_path)
    if not path.is_file():
        raise ConfigError(f"--hyp={name_or_path!r}: no such file, and not one of {', '.join(HYP_NAMES)}")
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"--hyp file {path} is not valid YAML: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"--hyp file {path} must be a mapping of key: number")
    base: dict[str, float] = {}
    if path != hyp_path("scratch-low"):
        base = load_hyp("scratch-low")
    for key, value in loaded.items():
        base[str(key)] = check_hyp_value(str(key), value, source=f"--hyp file {path}")
    for key, value in (overrides or {}).items():
        base[key] = check_hyp_value(key, value, source="--hyp-override")
    return base


# ------------------------------------------------------------------------------------------ command line


class ConfigArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are ConfigErrors (no SystemExit in library code)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"invalid training option: {message}")


def parse_bool(text: str) -> bool:
    lowered = str(text).strip().strip('"').lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected True/False/true/false/1/0, got {text!r}")


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def _string(text: str) -> str:
    return _unquote(text)


def _optional_string(text: str) -> str | None:
    value = _unquote(text)
    return None if value.lower() in ("", "none", "null") else value


def _int_list(text: str) -> list[int]:
    """'10', '0,1,2', '[0, 1, 2]' → list of ints."""
    value = _unquote(text)
    try:
        parsed = (
            json.loads(value) if value.startswith("[") else [int(v) for v in value.split(",") if v.strip()]
        )
        if isinstance(parsed, int):
            parsed = [parsed]
        return [int(v) for v in parsed]
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        raise argparse.ArgumentTypeError(
            f"expected a layer count or a list of layer indices, got {text!r}"
        ) from exc


def parse_overrides(text: str) -> dict[str, float]:
    """'lr0=0.02,mosaic=0' or a JSON object '{"lr0": 0.02}' → {key: float}."""
    value = _unquote(text)
    try:
        if value.startswith("{"):
            pairs = json.loads(value)
            if not isinstance(pairs, dict):
                raise ValueError("not an object")
            return {str(k): float(v) for k, v in pairs.items()}
        out: dict[str, float] = {}
        for item in filter(None, (p.strip() for p in value.split(","))):
            key, sep, number = item.partition("=")
            if not sep:
                raise ValueError(f"{item!r} is not key=value")
            out[key.strip()] = float(number)
        return out
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        raise argparse.ArgumentTypeError(
            f"expected key=value,key=value or a JSON object, got {text!r} ({exc})"
        ) from exc


def _choice(choices: tuple[str, ...]):
    def convert(text: str) -> str:
        value = _unquote(text)
        for choice in choices:
            if value.lower() == choice.lower():
                return choice
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(choices)}")

    convert.__name__ = "choice"
    return convert


def _optional_int(text: str) -> int | None:
    value = _optional_string(text)
    return None if value is None else int(value)


def _optional_cache(text: str) -> str | None:
    value = _optional_string(text)
    if value is None or value.lower() in ("false", "0"):
        return None
    if value.lower() in ("true", "1"):  # the release's bare --cache means RAM
        return "ram"
    return _choice(CACHE_MODES)(value)


def _add(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """Register `--a-b` together with its `--a_b` spelling."""
    flags = [f"--{name}"]
    if "-" in name:
        flags.append(f"--{name.replace('-', '_')}")
    parser.add_argument(*flags, dest=name.replace("-", "_"), **kwargs)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every TrainConfig option to `parser` (defaults stay None so the dataclass owns them)."""
    flag = {"type": parse_bool, "nargs": "?", "const": True, "default": None, "metavar": "BOOL"}
    _add(parser, "data", type=_optional_string, help="data.yaml (default: the embedded synthetic dataset)")
    _add(parser, "cfg", type=_string, help="model config name (yolov5n/s/m/l/x) or YAML path")
    _add(parser, "weights", type=_optional_string, help="initial weights (ours or the release's .pt)")
    _add(parser, "hyp", type=_string, help="hyperparameters: scratch-low, scratch-high or a YAML path")
    parser.add_argument(
        "--hyp-override",
        "--hyp_override",
        "--hyp-overrides",
        "--hyp_overrides",
        dest="hyp_overrides",
        type=parse_overrides,
        help="key=value,... replacing hyperparameters",
    )
    _add(parser, "epochs", type=int)
    _add(parser, "batch-size", type=_optional_int, help="GLOBAL batch over all ranks (default 16)")
    _add(parser, "batch-per-gpu", type=_optional_int, help="batch per rank (alternative to --batch-size)")
    parser.add_argument(
        "--imgsz", "--img-size", "--img_size", "--img", dest="imgsz", type=int, help="image size"
    )
    _add(parser, "workers", type=int, help="max DataLoader workers per rank")
    _add(parser, "optimizer", type=_choice(OPTIMIZERS))
    _add(parser, "cos-lr", help="cosine learning-rate decay", **flag)
    _add(parser, "label-smoothing", type=float)
    _add(parser, "patience", type=int, help="early-stopping patience in epochs (0 = off)")
    _add(parser, "freeze", type=_int_list, help="freeze the first N layers, or a list of layer indices")
    _add(parser, "seed", type=int)
    _add(parser, "rect", help="rectangular training batches", **flag)
    _add(parser, "multi-scale", help="vary image size +/-50%% per batch", **flag)
    _add(parser, "sync-bn", help="SyncBatchNorm under DDP", **flag)
    _add(parser, "cache", type=_optional_cache, nargs="?", const="ram", help="cache decoded images in RAM")
    _add(
        parser,
        "max-image-pixels",
        type=int,
        help=f"skip images whose header claims more pixels (default {DEFAULT_MAX_PIXELS:,} = 2^27: a decoded "
        "image of 384 MiB per loader worker; OpenCV's own limit 2^30 fails with an error)",
    )
    _add(parser, "amp", type=_choice(AMP_MODES), help="mixed precision: auto, fp16, bf16, off")
    _add(parser, "backend", type=_choice(BACKENDS), help="auto, smddp, nccl, gloo")
    _add(parser, "channels-last", help="channels_last memory format", **flag)
    _add(parser, "compile", help="torch.compile the model", **flag)
    _add(parser, "log-every", type=int, help="metric line every N steps")
    for name in ("model-dir", "output-dir", "checkpoint-dir", "tensorboard-dir"):
        _add(parser, name, type=_optional_string)
    _add(
        parser,
        "cache-dir",
        type=_optional_string,
        help="label caches and the embedded dataset (default $XDG_CACHE_HOME/yolov5-smddp, else "
        "~/.cache/yolov5-smddp; on SageMaker the warm-pool cache or /tmp/yolov5-smddp-cache); "
        "nothing is ever written under a dataset",
    )
    _add(parser, "run-name", type=_optional_string, help="MLflow run name (SageMaker: the job name)")
    _add(parser, "dist-timeout", type=float, help="collective timeout in seconds")
    _add(parser, "val-conf", type=float)
    _add(parser, "val-iou", type=float)
    _add(parser, "max-det", type=int)
    _add(parser, "noval", help="validate only after the final epoch", **flag)
    _add(parser, "max-nonfinite-steps", type=int, help="stop after N consecutive non-finite steps")
    _add(parser, "inject-nonfinite-step", type=_optional_int, help=argparse.SUPPRESS)


def config_from_namespace(namespace: argparse.Namespace) -> TrainConfig:
    """Build a TrainConfig from parsed options; options left unset take the dataclass defaults."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    given = {k: v for k, v in vars(namespace).items() if k in names and v is not None}
    return TrainConfig(**given)


def parse_train_args(argv: list[str]) -> TrainConfig:
    """Parse command-line words (no shell strings) into a validated TrainConfig; ConfigError on any problem."""
    parser = ConfigArgumentParser(prog="yolov5-smddp train", allow_abbrev=False, add_help=False)
    add_train_arguments(parser)
    return config_from_namespace(parser.parse_args(list(argv)))


def resolve_output_dirs(
    config: TrainConfig, cwd: Path, environ: Mapping[str, str] | None = None, home: Path | None = None
) -> dict[str, Path]:
    """The folders a run writes to: the given ones, else `runs/train/<kind>` under `cwd`; the cache folder
    defaults to the user's (`data.cache.default_cache_dir` of `environ`, default os.environ, and `home`)."""
    from yolov5_smddp.data.cache import default_cache_dir

    base = cwd / "runs" / "train"
    defaults = {
        "model_dir": base / "model",
        "output_dir": base / "output",
        "checkpoint_dir": base / "checkpoints",
        "cache_dir": default_cache_dir(os.environ if environ is None else environ, home or Path.home()),
    }
    out = {
        key: Path(getattr(config, key)) if getattr(config, key) else path for key, path in defaults.items()
    }
    if config.tensorboard_dir:
        out["tensorboard_dir"] = Path(config.tensorboard_dir)
    return out
