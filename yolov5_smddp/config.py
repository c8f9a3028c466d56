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
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from yolov5_smddp.bounded_read import shown
from yolov5_smddp.bounded_yaml import load_yaml
from yolov5_smddp.data.imageinfo import DEFAULT_MAX_PIXELS
from yolov5_smddp.errors import ConfigError

HYP_NAMES = ("scratch-low", "scratch-med", "scratch-high")
Optimizer = Literal["SGD", "Adam", "AdamW"]
AmpMode = Literal["auto", "fp16", "bf16", "off"]
Backend = Literal["auto", "smddp", "nccl", "gloo"]
CacheMode = Literal["ram", "disk"]  # decoded images in RAM (each rank its shard) or on local disk
MosaicPartners = Literal["random", "recent"]  # the release's sampling; the opt-in recent-image pool
ColorAug = Literal["auto", "workers", "device"]  # where HSV jitter and flips run (data/color.py)
OnOff = Literal["on", "off"]
LoaderKind = Literal["cpu", "gpu"]  # where a training batch is decoded and augmented (issue 40)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
AMP_MODES: tuple[str, ...] = get_args(AmpMode)
BACKENDS: tuple[str, ...] = get_args(Backend)
CACHE_MODES: tuple[str, ...] = get_args(CacheMode)
MOSAIC_PARTNERS: tuple[str, ...] = get_args(MosaicPartners)
COLOR_AUG_MODES: tuple[str, ...] = get_args(ColorAug)
RECENT_PARTNERS_HELP = (
    "mosaic partners: 'random' (default, the release's: uniform over the dataset, or over this rank's "
    "cached images with --cache ram) or 'recent' (this worker's recently decoded images: one JPEG decode "
    "per sample instead of four, but partners only from ~32 recent images; measured 0.030 mAP50-95 "
    "lower, 0.414 vs 0.444, yolov5n 30 epochs on a 1,000-image shapes set: docs/ACCURACY.md)"
)


def _key(low: float, high: float, unused: str | None = None) -> Any:
    """A hyperparameter: its allowed closed range and, for a key kept only for the release's files, why
    its value does nothing here."""
    return field(metadata={"range": (low, high), "unused": unused})


@dataclass(frozen=True, kw_only=True)
class Hyp:
    """The hyperparameter keys, each with its allowed closed range: the one declaration of them. Values
    come from the YAMLs in yolov5_smddp/hyps/ (the release's recipes; a user file may hold a subset, the
    rest come from scratch-low) and `--hyp-override`. The loss gains box/cls/obj are for 3 levels, 80
    classes and 640 px; the trainer rescales them."""

    lr0: float = _key(1e-8, 1.0)
    """initial learning rate (SGD; ~1e-3 for Adam/AdamW)."""
    lrf: float = _key(1e-6, 1.0)
    """final learning rate = lr0 * lrf."""
    momentum: float = _key(0.0, 0.999)
    """SGD momentum / Adam beta1."""
    weight_decay: float = _key(0.0, 0.1)
    """weight decay of conv/linear weights (scaled with the nominal batch)."""
    warmup_epochs: float = _key(0.0, 100.0)
    """warmup length in epochs (at least 100 iterations)."""
    warmup_momentum: float = _key(0.0, 0.999)
    """momentum at the start of warmup."""
    warmup_bias_lr: float = _key(0.0, 1.0)
    """bias learning rate at the start of warmup."""
    box: float = _key(0.0, 100.0)
    """box loss gain."""
    cls: float = _key(0.0, 100.0)
    """class loss gain."""
    cls_pw: float = _key(1e-3, 100.0)
    """class BCE positive weight."""
    obj: float = _key(0.0, 100.0)
    """objectness loss gain."""
    obj_pw: float = _key(1e-3, 100.0)
    """objectness BCE positive weight."""
    iou_t: float = _key(0.0, 1.0, unused="the release's loss never reads it either; anchor_t decides")
    """IoU training threshold (kept for the release's files)."""
    anchor_t: float = _key(1.0, 100.0)
    """anchor-multiple threshold for target assignment."""
    fl_gamma: float = _key(0.0, 10.0)
    """focal loss gamma (0 = plain BCE)."""
    hsv_h: float = _key(0.0, 1.0)
    """HSV hue jitter (fraction)."""
    hsv_s: float = _key(0.0, 1.0)
    """HSV saturation jitter (fraction)."""
    hsv_v: float = _key(0.0, 1.0)
    """HSV value jitter (fraction)."""
    degrees: float = _key(0.0, 180.0)
    """rotation (+/- degrees)."""
    translate: float = _key(0.0, 0.99)
    """translation (+/- fraction)."""
    scale: float = _key(0.0, 0.99)
    """scale gain (+/-)."""
    shear: float = _key(0.0, 90.0)
    """shear (+/- degrees)."""
    perspective: float = _key(0.0, 0.001)
    """perspective (+/- fraction)."""
    flipud: float = _key(0.0, 1.0)
    """vertical flip probability."""
    fliplr: float = _key(0.0, 1.0)
    """horizontal flip probability."""
    mosaic: float = _key(0.0, 1.0)
    """mosaic probability."""
    mixup: float = _key(0.0, 1.0)
    """mixup probability."""
    copy_paste: float = _key(0.0, 1.0, unused="segment copy-paste needs polygon labels; boxes-only here")
    """segment copy-paste probability (kept for the release's files)."""

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, values: Mapping[str, float]) -> Hyp:
        """The typed form of a full key: value mapping (`load_hyp`'s, a checkpoint's "hyp"): the boundary
        between the user-facing format and the code, which reads attributes. ConfigError naming the
        missing or unknown keys."""
        missing = [k for k in cls.keys() if k not in values]
        unknown = sorted(set(values) - set(cls.keys()))
        if missing or unknown:
            raise ConfigError(f"hyperparameters: missing keys {missing}, unknown keys {unknown}")
        return cls(**{k: float(values[k]) for k in cls.keys()})

    def to_dict(self) -> dict[str, float]:
        """The key: value mapping, in declaration order (what checkpoints, config.json and MLflow record)."""
        return {k: getattr(self, k) for k in self.keys()}


HYP_RANGES: dict[str, tuple[float, float]] = {f.name: f.metadata["range"] for f in dataclasses.fields(Hyp)}
"""Allowed closed range per hyperparameter key (from `Hyp`)."""
UNUSED_HYP: dict[str, str] = {
    f.name: f.metadata["unused"] for f in dataclasses.fields(Hyp) if f.metadata["unused"]
}
"""Keys accepted for the release's files that change nothing here, and why."""


def unused_hyp_warnings(hyp: Mapping[str, float], reference: Mapping[str, float]) -> list[str]:
    """One message per unused key (UNUSED_HYP) whose value in `hyp` differs from `reference` (scratch-low):
    a value someone set expecting an effect."""
    return [
        f"hyperparameter {key}={hyp[key]:g} has no effect: {why}"
        for key, why in UNUSED_HYP.items()
        if key in hyp and hyp[key] != reference.get(key)
    ]


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


def parse_int_list(text: str, *, minimum: int | None = None, what: str = "integers") -> list[int]:
    """'10', '0,1,2', '[0, 1, 2]' → list of ints; an argparse `type` (ArgumentTypeError naming `what`).
    `minimum`: every value must be >= it, and the list must not be empty."""
    value = _unquote(text)
    try:
        parsed = (
            json.loads(value) if value.startswith("[") else [int(v) for v in value.split(",") if v.strip()]
        )
        if isinstance(parsed, int):
            parsed = [parsed]
        values = [int(v) for v in parsed]
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from exc
    if minimum is not None and (not values or min(values) < minimum):
        raise argparse.ArgumentTypeError(f"expected {what} >= {minimum}, got {text!r}")
    return values


def _layer_list(text: str) -> list[int]:
    return parse_int_list(text, what="a layer count or a list of layer indices")


class _JoinLists(argparse.Action):
    """`--freeze 0 1 2` (nargs="+", each word a list): the words' lists joined into one."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, [item for part in values for item in part])


def _resume_value(text: str) -> str | None:
    """`--resume PATH`; `--resume true` (a SageMaker hyperparameter) is the bare `--resume` ("": the newest
    last.pt of the run folder); `--resume false` is no resume."""
    value = _unquote(text)
    if value.lower() in ("true", "1"):
        return ""
    return None if value.lower() in ("false", "0", "none", "null") else value


def parse_overrides(text: str) -> dict[str, float]:
    """'lr0=0.02,mosaic=0' or a JSON object '{"lr0": 0.02}' → {key: float}."""
    value = _unquote(text)
    try:
        if value.startswith("{"):
            pairs = json.loads(value)
            if not isinstance(pairs, dict):
                raise ValueError("not an object")
            return {str(k): float(v) for k, v in pairs.items()}  # OverflowError: an int beyond float
        out: dict[str, float] = {}
        for item in filter(None, (p.strip() for p in value.split(","))):
            key, sep, number = item.partition("=")
            if not sep:
                raise ValueError(f"{item!r} is not key=value")
            out[key.strip()] = float(number)
        return out
    except (ValueError, TypeError, OverflowError, json.JSONDecodeError) as exc:
        raise argparse.ArgumentTypeError(
            f"expected key=value,key=value or a JSON object, got {_short(text, 200)} ({_short(str(exc), 200)})"
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


RESUME_FROM_COMMAND: tuple[str, ...] = (
    # where the run writes and reads its caches
    "project",
    "name",
    "exist_ok",
    "model_dir",
    "output_dir",
    "checkpoint_dir",
    "cache_dir",
    "tensorboard_dir",
    "run_name",
    # the machine it runs on: the same model, data and schedule, computed there
    "workers",
    "cache",
    "amp",
    "backend",
    "channels_last",
    "compile",
    "color_aug",
    "loader",
    "jpeg_restart_cache",
    "dist_timeout",
    # what it reports and keeps
    "log_every",
    "noplots",
    "save_period",
    "max_nonfinite_steps",
    "inject_nonfinite_step",
    "inject_epoch_seconds",
    "resume",
)
"""The options a resumed run takes from its command line (given or default): where it writes, the
machine's settings, what it reports. Every other option is the run's, from its checkpoint; one given on
the command line with another value is refused (`resume_run`)."""


def option(
    default: Any = dataclasses.MISSING,
    *,
    factory: Any = dataclasses.MISSING,
    help: str | None = None,
    parse: Any = None,
    flags: tuple[str, ...] = (),
    hidden: bool = False,
    **argparse_kwargs: Any,
) -> Any:
    """A TrainConfig field and its command-line option: `--name-with-dashes` and `--name_with_underscores`
    unless `flags` names them; the value parser follows the type (bool: an optional true/false, Literal: a
    case-insensitive choice, `X | None`: "none" means None) unless `parse` is given."""
    cli = {"help": argparse.SUPPRESS if hidden else help, "parse": parse, "flags": flags, **argparse_kwargs}
    return field(default=default, default_factory=factory, metadata={"cli": cli})


@dataclass(kw_only=True)
class TrainConfig:
    """Every training option. Paths are strings as given; `None` means "use the default" (see
    `resolve_output_dirs`)."""

    data: str | None = option(None, help="data.yaml (default: the embedded synthetic dataset)")
    """data.yaml path; None → the embedded synthetic dataset generated under the cache folder."""
    cfg: str | None = option(
        None,
        help="model config name (yolov5n/s/m/l/x, P6 yolov5n6..x6) or a model yaml in the release's format "
        "(default: the architecture of --weights when "
        "given, else yolov5s)",
    )
    """model config: a name (yolov5n/s/m/l/x, or the P6 yolov5n6/s6/m6/l6/x6 for `--imgsz 1280`) or a model
    yaml in the release's format (any v7.0 `models/` or `models/hub/` detection yaml, or your own); None → the architecture of --weights when
    given (the release's rule), else yolov5s."""
    weights: str | None = option(None, help="initial weights (ours or the release's .pt)")
    """initial weights (ours or the release's .pt); None → train from scratch."""
    allow_partial_transfer: bool = option(
        False, help="train even when under half of the parameters come from --weights"
    )
    """train even when less than half of the model's parameters come from --weights (a --cfg that does
    not fit the checkpoint); without it that is an error."""
    noautoanchor: bool = option(False, help="keep the anchors (no AutoAnchor check or fit)")
    """keep the model's anchors as they are (no best-possible-recall check, no anchor fitting)."""
    single_cls: bool = option(False, help="train every class as one class 'item'")
    """train every class as class 0 (names ['item'] unless the dataset has one class)."""
    resume: str | None = option(
        None,
        help="resume a run from its checkpoint (a last.pt; alone: the newest last.pt under --project, or in "
        "--checkpoint-dir): the run's options, data, model, epoch and schedule come from it; an option "
        "given that contradicts the run is refused, except: "
        + ", ".join("--" + n.replace("_", "-") for n in RESUME_FROM_COMMAND if not n.startswith("inject")),
        parse=_resume_value,
        nargs="?",
        const="",
        metavar="PATH",
    )
    """resume a run from this training checkpoint: its options, data, model, epoch and schedule come from
    the checkpoint (`resume_run`); "" (a bare `--resume`) is the newest last.pt of the run folder
    (`resume_source`). Only RESUME_FROM_COMMAND options come from the command line."""
    save_period: int = option(-1, help="keep every N-th epoch's checkpoint as epochN.pt (-1: off)")
    """also keep the checkpoint of every N-th epoch as epoch{N}.pt in --checkpoint-dir (-1: off)."""
    hyp: str = option(
        "scratch-low", help="hyperparameters: scratch-low, scratch-med, scratch-high or a YAML path"
    )
    """hyperparameters: a shipped name (scratch-low, scratch-med, scratch-high) or a YAML path."""
    hyp_overrides: dict[str, float] = option(
        factory=dict,
        help="key=value,... replacing hyperparameters",
        parse=parse_overrides,
        flags=("--hyp-override", "--hyp_override", "--hyp-overrides", "--hyp_overrides"),
    )
    """hyperparameter values replacing the file's (`--hyp-override lr0=0.02,mosaic=0`)."""
    epochs: int = option(100)
    """number of training epochs (with --time: the schedule of the first epoch only)."""
    time: float | None = option(
        None,
        help="training budget in hours (overrides --epochs): after each epoch the epochs that fit are "
        "re-planned from the measured epoch times, and the learning rate decays over them; set SageMaker's "
        "max_run a little above it",
    )
    """training budget in hours (ultralytics' `time`): the epoch count is planned from the measured epoch
    times after each epoch (budget.py); None → --epochs."""
    batch_size: int | None = option(None, help="GLOBAL batch over all ranks (default 16)")
    """GLOBAL batch over all ranks (the release's meaning); default 16 when batch_per_gpu is not given."""
    batch_per_gpu: int | None = option(None, help="batch per rank (alternative to --batch-size)")
    """batch per rank; the global batch is this times the world size."""
    imgsz: int = option(
        640,
        help="image size (a multiple of 32, at most 8192)",
        flags=("--imgsz", "--img-size", "--img_size", "--img"),
    )
    """train/val image size in pixels (a multiple of the largest stride, 32)."""
    workers: int = option(8, help="max DataLoader workers per rank")
    """maximum DataLoader workers per rank (also capped by CPUs per local rank and the batch)."""
    optimizer: Optimizer = option("SGD")
    """SGD (Nesterov), Adam or AdamW."""
    cos_lr: bool = option(False, help="cosine learning-rate decay")
    """cosine instead of linear learning-rate decay."""
    label_smoothing: float = option(0.0)
    """class label smoothing epsilon."""
    patience: int = option(100, help="early-stopping patience in epochs (0 = off)")
    """early stopping: epochs without fitness improvement (0 disables)."""
    freeze: list[int] = option(
        factory=list,
        help="freeze the first N layers (--freeze 10), or the layers listed (--freeze 0 1 2, or 0,1,2)",
        parse=_layer_list,
        nargs="+",
        action=_JoinLists,
    )
    """layer indices to freeze; a single value n freezes layers 0..n-1 (the release's meaning)."""
    seed: int = option(0, help="random seed, 0..4294967295")
    """global random seed (each rank and worker derives its own)."""
    rect: bool = option(False, help="rectangular training batches")
    """rectangular training batches (no mosaic)."""
    multi_scale: bool = option(False, help="vary image size +/-50%% per batch")
    """vary the image size +/- 50% per batch (multiples of 32)."""
    sync_bn: bool = option(False, help="SyncBatchNorm under DDP")
    """SyncBatchNorm under DDP (GPU backends only)."""
    cache: CacheMode | None = option(
        None,
        help="cache decoded images: ram (each rank its shard) or disk (under --cache-dir, one copy per node)",
        parse=_optional_cache,
        nargs="?",
        const="ram",
    )
    """cache decoded, resized images: 'ram' (each rank its shard, in its memory); 'disk' (raw pixels under
    --cache-dir, never in the dataset: one copy per node, in the page cache after the first epoch, kept
    across runs; data/pixelcache.py); None → decode every time."""
    mosaic_partners: MosaicPartners = option("random", help=RECENT_PARTNERS_HELP)
    """mosaic sampling: 'random' (the release's) or 'recent' (faster, less accurate; see
    RECENT_PARTNERS_HELP and docs/ACCURACY.md)."""
    color_aug: ColorAug = option(
        "auto",
        help="where the HSV jitter and flips run: 'workers' (the loader's CPU workers), 'device' (on the "
        "batch, on the GPU: 2-3 ms less CPU per 640 px sample in every worker, the same pixels) or 'auto' "
        "(device on CUDA, workers on CPU, where the workers' OpenCV is the cheaper of the two)",
    )
    """where HSV jitter and flips run: 'workers', 'device' (data/color.py: OpenCV's 8-bit arithmetic on the
    batch, same pixels) or 'auto' (device on CUDA, workers on CPU)."""
    loader: LoaderKind = option(
        "cpu",
        help="where training batches are decoded and augmented: 'cpu' (default: the loader workers) or "
        "'gpu' (workers only read the files; the device decodes a batch's JPEGs in one call and does "
        "mosaic, affine, HSV and flips: the same boxes, pixels within interpolation rounding; "
        "data/gpu_batch.py)",
    )
    """where training batches are decoded and augmented: 'cpu' (the workers) or 'gpu' (data.bytes_dataset
    in the workers, data.gpu_batch on the device; the same boxes, pixels within data.gpu_batch.PIXEL_BOUNDS)."""
    jpeg_restart_cache: OnOff = option(
        "on",
        help="'on': lossless copies of the training JPEGs with restart markers under --cache-dir, so a "
        "mosaic tile's region decode skips the rows and columns it does not show (the same pixels; about "
        "the images' size on disk, made during the first epoch); 'off': decode regions from the originals",
    )
    """'on': lossless copies of the training JPEGs with restart markers under --cache-dir (never in the
    dataset: data/restart_cache.py), made the first time a tile of the image is region-decoded, so
    region decodes entropy-decode only the MCUs a tile shows (the same pixels). Used only where
    region decoding is (mosaic with the release's sampling, no --cache); off by itself, with one log
    line, when the cache folder's disk has less free than 1.2x the training images + 1 GiB. 'off':
    regions are decoded from the original files."""
    max_image_pixels: int = option(
        DEFAULT_MAX_PIXELS,
        help=f"skip images whose header claims more pixels (default {DEFAULT_MAX_PIXELS:,} = 2^27: a decoded "
        "image of 384 MiB per loader worker; OpenCV's own limit 2^30 fails with an error)",
    )
    """skip images whose header claims more pixels (w * h) than this, before decoding them. 2^27 keeps
    a decoded image at 384 MiB, which every loader worker of every GPU may hold at once; OpenCV itself
    stops only at 2^30 (3 GiB), with an error."""
    amp: AmpMode = option("auto", help="mixed precision: auto, fp16, bf16, off")
    """mixed precision: auto (bf16 on GPUs of compute capability 8.0 or newer, fp16 on older GPUs, off on
    CPU), fp16, bf16 (refused on CUDA GPUs below 8.0), off."""
    backend: Backend = option("auto", help="auto, smddp, nccl, gloo")
    """process-group backend: auto (smddp under SageMaker's SMDDP launch on 2+ ml.p4d/p4de nodes with the
    library, else nccl on CUDA, gloo on CPU; docs/CLUSTER.md), smddp, nccl, gloo."""
    channels_last: bool = option(True, help="channels_last memory format")
    """use the channels_last memory format for the model and the input batch (faster convolutions with
    AMP on GPUs and with oneDNN on CPUs: yolov5n b8@320 CPU step 435 vs 458 ms fp32; `false` to disable)."""
    compile: bool = option(False, help="torch.compile the model")
    """wrap the model in torch.compile."""
    log_every: int = option(50, help="metric line every N steps")
    """print a metric line (the only time losses are read back from the device) every N micro-steps."""
    project: str = option("runs/train", help="run folders go under this folder (default runs/train)")
    """the folder of run folders (the release's --project); relative to the working folder."""
    name: str = option("exp", help="run folder name: PROJECT/NAME, NAME2, NAME3 ... (default exp)")
    """the run folder is project/name, or name2, name3 ... when it exists (unless --exist-ok); it holds
    model/, output/ and checkpoints/ for each of --model-dir/--output-dir/--checkpoint-dir not given."""
    exist_ok: bool = option(
        False,
        help="reuse PROJECT/NAME (and a given --checkpoint-dir) and start afresh there: its checkpoints are "
        "overwritten, not resumed",
    )
    """reuse project/name as it is instead of the next free name; a last.pt in the checkpoint folder is
    not resumed (the run starts afresh and overwrites it)."""
    model_dir: str | None = option(None)
    """final weights, resolved config and metrics.json (default: the run folder's model/)."""
    output_dir: str | None = option(None)
    """results.csv and plots (default: the run folder's output/)."""
    checkpoint_dir: str | None = option(None)
    """last/best training checkpoints (default: the run folder's checkpoints/); a valid `last.pt` in a
    given --checkpoint-dir is resumed automatically (SageMaker restarts), unless --exist-ok."""
    cache_dir: str | None = option(
        None,
        help="label caches and the embedded dataset (default $XDG_CACHE_HOME/yolov5-smddp, else "
        "~/.cache/yolov5-smddp; on SageMaker the warm-pool cache or /tmp/yolov5-smddp-cache); "
        "nothing is ever written under a dataset",
    )
    """label caches and the embedded dataset (nothing is ever written under a dataset); None →
    $XDG_CACHE_HOME/yolov5-smddp or ~/.cache/yolov5-smddp; on SageMaker the warm-pool cache, else
    /tmp/yolov5-smddp-cache."""
    tensorboard_dir: str | None = option(None)
    """TensorBoard event files (optional; needs the tensorboard package)."""
    run_name: str | None = option(None, help="MLflow run name (SageMaker: the job name)")
    """the MLflow run's name (mlflow_log); on SageMaker the driver passes the training job's name."""
    dist_timeout: float = option(1800.0, help="collective timeout in seconds")
    """collective timeout in seconds."""
    val_conf: float = option(0.001)
    """validation confidence threshold."""
    val_iou: float = option(0.6)
    """validation NMS IoU threshold."""
    max_det: int = option(300)
    """validation maximum detections per image."""
    noval: bool = option(False, help="validate only after the final epoch")
    """validate only after the final epoch."""
    noplots: bool = option(False, help="write no plots to the output folder")
    """write no plots (results.png, PR/F1/P/R curves, confusion matrix, labels.jpg, train/val batch images)."""
    max_nonfinite_steps: int = option(25, help="stop after N consecutive non-finite steps")
    """stop the run after this many consecutive optimizer steps with a non-finite loss or gradient."""
    inject_nonfinite_step: int | None = option(None, hidden=True)
    """test hook (hidden from --help): make the loss NaN from this micro-step on."""
    inject_epoch_seconds: float | None = option(None, hidden=True)
    """test hook (hidden from --help): with --time, every epoch counts this many seconds (budget.py)."""
    given: frozenset[str] = field(default=frozenset(), repr=False, compare=False, metadata={"cli": None})
    """the fields given on the command line (`config_from_namespace`); a resume keeps the run's value of
    every other. Not an option, not recorded."""

    def __post_init__(self) -> None:
        _check(self.epochs >= 1, "--epochs", self.epochs, "must be >= 1")
        _check(
            self.time is None or (math.isfinite(self.time) and self.time > 0),
            "--time",
            self.time,
            "must be a positive number of hours (e.g. --time 1.5)",
        )
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
        _check(
            self.save_period == -1 or self.save_period >= 1,
            "--save-period",
            self.save_period,
            "must be >= 1 or -1",
        )
        _check(all(i >= 0 for i in self.freeze), "--freeze", self.freeze, "layer indices must be >= 0")
        _check(
            self.cache in (None, *CACHE_MODES),
            "--cache",
            self.cache,
            "must be 'ram', 'disk' or absent",
        )
        _check(
            self.mosaic_partners in MOSAIC_PARTNERS,
            "--mosaic-partners",
            self.mosaic_partners,
            f"must be one of {', '.join(MOSAIC_PARTNERS)}",
        )
        _check(
            self.color_aug in COLOR_AUG_MODES,
            "--color-aug",
            self.color_aug,
            f"must be one of {', '.join(COLOR_AUG_MODES)}",
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
        check_option_bounds(self)
        if len(self.freeze) == 1:  # the release's `--freeze 10`: the first 10 layers
            self.freeze = list(range(self.freeze[0]))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able copy of every option (what checkpoints and the model folder record)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "given"}


MAX_IMGSZ = 8192
"""--imgsz at most: one 8192 x 8192 RGB image is 201 MB as uint8 and 805 MB as the float input."""
MAX_SEED = 2**32 - 1
"""--seed in 0..MAX_SEED (numpy's seed range; each rank adds its rank)."""


def check_option_bounds(config: TrainConfig) -> None:
    """The upper bounds of the size-like options, and the seed's range: ConfigError naming the option
    and its limit (before anything is allocated)."""
    _check(config.imgsz <= MAX_IMGSZ, "--imgsz", config.imgsz, f"is over the limit of {MAX_IMGSZ}")
    _check(0 <= config.seed <= MAX_SEED, "--seed", config.seed, f"must be in 0..{MAX_SEED}")


def check_freeze(freeze: list[int], layer_count: int, model_name: str) -> None:
    """--freeze (layer indices, after `--freeze N` became 0..N-1) against the model it applies to:
    every index an existing layer, and the last layer (Detect) left to train."""
    if not freeze:
        return
    if max(freeze) >= layer_count:
        raise ConfigError(
            f"--freeze: layer {max(freeze)} does not exist: {model_name} has {layer_count} layers "
            f"(0..{layer_count - 1})"
        )
    if layer_count - 1 in freeze:
        raise ConfigError(
            f"--freeze: layer {layer_count - 1} is the Detect head of {model_name}; with it frozen nothing "
            f"learns the classes (freeze at most the first {layer_count - 1} layers)"
        )


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
        raise ConfigError(f"{source}: hyperparameter {key}={_short(value)} is not a number")
    low, high = HYP_RANGES[key]
    # an int beyond float's range (a 400-digit number) compares exactly, without math.isfinite's OverflowError
    if not ((isinstance(value, int) or math.isfinite(value)) and low <= value <= high):
        raise ConfigError(f"{source}: hyperparameter {key}={_short(value)} is out of range [{low}, {high}]")
    return float(value)


def _short(value: object, limit: int = 40) -> str:
    """repr(value), cut to `limit` characters (a 400-digit number in a message stays readable)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**limit else f"{str(value)[:20]}..."
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


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
    if not path.exists():  # a FIFO or a folder is named by load_yaml
        raise ConfigError(f"--hyp={name_or_path!r}: no such file, and not one of {', '.join(HYP_NAMES)}")
    loaded = load_yaml(path, ConfigError, origin=f"--hyp file {shown(path)}")
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


def _value_parser(hint: Any) -> Any:
    """The argparse `type` for a field's type hint."""
    optional = type(None) in get_args(hint)
    base = next((a for a in get_args(hint) if a is not type(None)), hint) if optional else hint
    if get_origin(base) is Literal:
        convert = _choice(get_args(base))
    elif base is str:
        convert = _string
    elif base in (int, float):
        convert = base
    else:
        raise TypeError(f"TrainConfig: no command-line parser for {hint!r}; give option(parse=...)")
    if not optional:
        return convert

    def optional_value(text: str):
        value = _optional_string(text)
        return None if value is None else convert(value)

    optional_value.__name__ = getattr(convert, "__name__", "value")
    return optional_value


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every TrainConfig field as an option, derived from the field, its type and `option(...)`
    (defaults stay None so the dataclass owns them)."""
    hints = get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        if f.metadata.get("cli") is None:  # `given`: not an option
            continue
        cli = dict(f.metadata["cli"])
        parse, flags = cli.pop("parse"), cli.pop("flags")
        if not flags:
            dashed = f.name.replace("_", "-")
            flags = (f"--{dashed}",) if dashed == f.name else (f"--{dashed}", f"--{f.name}")
        if hints[f.name] is bool and parse is None:
            kwargs = {"type": parse_bool, "nargs": "?", "const": True, "metavar": "BOOL"}
        else:
            kwargs = {"type": parse or _value_parser(hints[f.name])}
        parser.add_argument(*flags, dest=f.name, default=None, **kwargs, **cli)


def config_from_namespace(namespace: argparse.Namespace) -> TrainConfig:
    """Build a TrainConfig from parsed options; options left unset take the dataclass defaults."""
    names = {f.name for f in dataclasses.fields(TrainConfig) if f.name != "given"}
    given = {k: v for k, v in vars(namespace).items() if k in names and v is not None}
    return TrainConfig(**given, given=frozenset(given))


def parse_train_args(argv: list[str]) -> TrainConfig:
    """Parse command-line words (no shell strings) into a validated TrainConfig; ConfigError on any problem."""
    parser = ConfigArgumentParser(prog="yolov5-smddp train", allow_abbrev=False, add_help=False)
    add_train_arguments(parser)
    return config_from_namespace(parser.parse_args(list(argv)))


# ------------------------------------------------------------------------------------------ resume


def same_data(given: str | None, theirs: str | None) -> bool:
    """Whether the data option `given` names the run's dataset `theirs`: the same path, or a data.yaml of
    the same bytes elsewhere (a moved dataset, SageMaker's rebased copy under another cache folder), or
    the run's file no longer exists (the dataset moved: `given` is where it is now)."""
    if given == theirs:
        return True
    if given is None or theirs is None:
        return False
    mine, runs = Path(given), Path(theirs)
    if not runs.is_file():
        return mine.is_file()
    if not mine.is_file() or mine.stat().st_size != runs.stat().st_size or mine.stat().st_size > 1 << 24:
        return False
    return mine.read_bytes() == runs.read_bytes()


def resume_run(command: TrainConfig, saved: Mapping[str, Any], source: Path) -> TrainConfig:
    """The config of the run resumed from checkpoint `source`: the run's options as `saved` (the
    checkpoint's "config") records them, with RESUME_FROM_COMMAND's from `command`. ConfigError naming the
    option when `command` gives another one a value the run did not have (the data by `same_data`)."""
    known = {f.name for f in dataclasses.fields(TrainConfig) if f.name != "given"}
    values = {k: v for k, v in saved.items() if k in known}  # a field newer than the checkpoint: its default
    values.update({name: getattr(command, name) for name in RESUME_FROM_COMMAND})
    run = TrainConfig(**values, given=command.given)
    run.freeze = list(saved.get("freeze", run.freeze))  # recorded expanded: `--freeze 1` is [0], not [] again
    run.resume = str(source)
    for name in sorted(command.given - set(RESUME_FROM_COMMAND)):
        mine, theirs = getattr(command, name), getattr(run, name)
        if name == "data" and same_data(mine, theirs):
            run.data = mine
        elif mine != theirs:
            raise ConfigError(
                f"{_opt(name)} {_shown(mine)} contradicts the run being resumed ({source}: {_shown(theirs)}); "
                f"resume without {_opt(name)}, or start a new run from its weights with --weights {source}"
            )
    return run


def _shown(value: object) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "none"
    return "the default (none)" if value is None else str(value)


def resume_source(config: TrainConfig, cwd: Path) -> Path | None:
    """The checkpoint `--resume` names: its path, or for a bare `--resume` the newest last.pt in
    --checkpoint-dir or in the run folders under --project; None without --resume. ConfigError when there
    is none."""
    if config.resume is None:
        return None
    if config.resume:
        path = Path(config.resume)
        if not path.is_file():
            raise ConfigError(f"--resume {config.resume}: no such file")
        return path
    if config.checkpoint_dir:
        candidates = [Path(config.checkpoint_dir) / "last.pt"]
        where = f"--checkpoint-dir {config.checkpoint_dir}"
    else:
        candidates = list((cwd / config.project).glob("*/checkpoints/last.pt"))
        where = f"the run folders under {cwd / config.project}"
    found = [p for p in candidates if p.is_file()]
    if not found:
        raise ConfigError(f"--resume: no last.pt in {where}; give the checkpoint: --resume PATH/last.pt")
    return max(found, key=lambda p: p.stat().st_mtime_ns)


def run_folder(project: Path, name: str, exist_ok: bool) -> Path:
    """project/name, or with it taken (and not `exist_ok`) the first free of name2, name3, ... (the
    release's run folders)."""
    folder = project / name
    number = 2
    while not exist_ok and folder.exists():
        folder, number = project / f"{name}{number}", number + 1
    return folder


@dataclass(frozen=True, kw_only=True)
class OutputDirs:
    """The folders one training run writes to (see TrainConfig for what goes where)."""

    model_dir: Path
    output_dir: Path
    checkpoint_dir: Path
    cache_dir: Path
    tensorboard_dir: Path | None = None
    resume_from: Path | None = None
    """the checkpoint --resume names (`resume_source`); None without --resume."""


def resolve_output_dirs(
    config: TrainConfig, cwd: Path, environ: Mapping[str, str] | None = None, home: Path | None = None
) -> OutputDirs:
    """The folders a run writes to: the given ones, else model/, output/ and checkpoints/ of its run folder.
    The run folder: with --resume, the resumed run's (the checkpoint's folder's parent when that folder is
    `checkpoints`, else the checkpoint's folder); else `run_folder` of --project/--name under `cwd`. Every
    rank resolves it before the process group forms, so all of them find the same free name (rank 0 makes
    the folders later). The cache folder: `data.cache.choose_cache_dir` (--cache-dir, else the user's of
    `environ`, default os.environ, and `home`)."""
    from yolov5_smddp.data.cache import choose_cache_dir

    resumed = resume_source(config, cwd)
    if resumed is not None:
        checkpoints = resumed.parent
        run = checkpoints.parent if checkpoints.name == "checkpoints" else checkpoints
    else:
        run = run_folder(cwd / config.project, config.name, config.exist_ok)
        checkpoints = run / "checkpoints"

    def given_or(value: str | None, default: Path) -> Path:
        return Path(value) if value else default

    return OutputDirs(
        model_dir=given_or(config.model_dir, run / "model"),
        output_dir=given_or(config.output_dir, run / "output"),
        checkpoint_dir=given_or(config.checkpoint_dir, checkpoints),
        cache_dir=choose_cache_dir(config.cache_dir, environ=environ, home=home),
        tensorboard_dir=Path(config.tensorboard_dir) if config.tensorboard_dir else None,
        resume_from=resumed,
    )
