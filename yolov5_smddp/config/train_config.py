"""Training configuration: the typed `TrainConfig`, its command-line form and the hyperparameter YAMLs.

`parse_train_args(argv)` is the one way a list of command-line words becomes a validated `TrainConfig`.
Every problem is a `ConfigError` naming the option or hyperparameter key, raised before any work starts.
Option names accept both spellings (`--batch-size` and `--batch_size`, as SageMaker hyperparameters often
arrive); boolean options accept an optional value (`--rect`, `--rect True`, `--rect false`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_type_hints

from yolov5_smddp.config.hyp import check_hyp_value
from yolov5_smddp.config.parsing import (
    ConfigArgumentParser,
    _choice,
    _JoinLists,
    _layer_list,
    _optional_string,
    _resume_value,
    _value_parser,
    option,
    parse_bool,
    parse_overrides,
)
from yolov5_smddp.data.imageinfo import DEFAULT_MAX_PIXELS
from yolov5_smddp.errors import ConfigError

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
    batch_size: int | None = option(
        None,
        help="GLOBAL batch over all ranks (default 16); -1: AutoBatch, the per-GPU batch sized to the GPU",
    )
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
            auto = name == "batch_size" and value == -1  # AutoBatch (autobatch.py)
            _check(
                value is None or value >= 1 or auto, _opt(name), value, "must be >= 1 (--batch-size: or -1)"
            )
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


def _opt(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check(ok: bool, option: str, value: object, why: str) -> None:
    if not ok:
        raise ConfigError(f"{option}={value!r} {why}")


# ---------------------------------------------------------------------------------------------- batches


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
