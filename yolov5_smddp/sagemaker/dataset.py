"""The inputs as the job's channels give them: data.yaml rebased onto the `training` channel (and a
`validation` channel), one label scan of both splits before any worker starts, and the pretrained weights
of a `weights` (or `model`) channel."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import yaml

from yolov5_smddp.data.cache import choose_cache_dir
from yolov5_smddp.data.config import load_data_config
from yolov5_smddp.data.labels import scan_workers
from yolov5_smddp.errors import ConfigError, DataError
from yolov5_smddp.files.atomic import atomic_write
from yolov5_smddp.sagemaker.env import TRAIN_CHANNELS, VAL_CHANNELS, WEIGHTS_CHANNELS, SageMakerEnv, channel
from yolov5_smddp.train.data_wiring import scan_split

log = logging.getLogger(__name__)


def channel_not_a_folder(kind: str, folder: Path) -> str:
    """Why a channel is not a folder: Pipe mode (the channel arrives as a FIFO, `<folder>_0`, or is one)
    named with what to use instead; else "is the channel mounted?"."""
    fifos = [p for p in (folder, folder.with_name(f"{folder.name}_0")) if p.is_fifo()]
    if fifos:
        return (
            f"{kind} channel {folder} arrives in Pipe input mode (a FIFO: {fifos[0]}), which streams the channel "
            "once, in order, and cannot hold a folder of images and labels read in random order: start the job "
            "with input_mode 'FastFile' (files streamed from S3 on first read) or 'File' (the channel copied "
            "before training)"
        )
    return f"{kind} channel {folder} is not a folder (is the channel mounted?)"


def prepare_data_yaml(env: SageMakerEnv, data: str | None, cache_dir: Path | None = None) -> Path | None:
    """The data.yaml the workers read, rebased onto the training channel; None = the embedded dataset.

    With a `training`/`train` channel: `data` (default data.yaml; without one, the channel's only top-level
    .json, a COCO instances file beside its images) is relative to the channel, its `path`
    is replaced by the channel folder, and a `validation`/`val` channel replaces `val` (with the channel's
    one top-level .json when it has exactly one: a COCO JSON beside its images). The rebased copy is
    written to the cache folder (channels are read-only; output/ is uploaded): `cache_dir` (--cache-dir),
    else the job's (`data.cache.choose_cache_dir`). Without a channel, `data` is used as given. Raises
    DataError naming the channel for a missing or invalid data.yaml.
    """
    train_channel = channel(env, TRAIN_CHANNELS)
    val_channel = channel(env, VAL_CHANNELS)
    if train_channel is None:
        if val_channel is not None:
            raise DataError(f"a validation channel ({val_channel}) was given without a 'training' channel")
        return Path(data) if data else None
    if not train_channel.is_dir():
        raise DataError(channel_not_a_folder("training", train_channel))
    yaml_path = train_channel / (data or "data.yaml")
    jsons = sorted(train_channel.glob("*.json"))
    if data is None and not yaml_path.is_file() and len(jsons) == 1:  # images + one COCO JSON
        yaml_path = jsons[0]
        log.info("data: no data.yaml in channel %s; reading its COCO JSON %s", train_channel, yaml_path.name)
    if yaml_path.is_symlink() and not yaml_path.exists():  # a loop or a dangling link: not "not found"
        raise DataError(
            f"training channel {train_channel}: {yaml_path.name} is a symbolic link that cannot be followed "
            f"(a link loop or a dangling link: {os.readlink(yaml_path)!r})"
        )
    if not yaml_path.is_file():
        found = sorted(p.name for p in train_channel.glob("*.yaml"))
        hint = (
            f" (YAML files there: {', '.join(found)}; pass --data NAME)"
            if found
            else " (put a data.yaml with train/val/names at the channel's top level, or pass --data PATH relative to it)"
        )
        raise DataError(f"training channel {train_channel}: {yaml_path.name} not found{hint}")
    cache_dir = choose_cache_dir(cache_dir, job_default=env.cache_dir)
    config = load_data_config(yaml_path, root_override=train_channel, cache_dir=cache_dir)
    val = [str(p) for p in config.val]
    if val_channel is not None:
        if not val_channel.is_dir():
            raise DataError(channel_not_a_folder("validation", val_channel))
        jsons = sorted(val_channel.glob("*.json"))  # a channel of images + one COCO JSON
        val = [str(jsons[0])] if len(jsons) == 1 else [str(val_channel)]
    rebased = {
        "path": str(config.root),
        "train": [str(p) for p in config.train],
        "val": val,
        "names": list(config.names),
        "nc": config.nc,
    }
    if config.test:
        rebased["test"] = [str(p) for p in config.test]
    for split, folder in config.image_dirs.items():  # COCO JSON splits' image folders
        if split != "val" or val_channel is None:
            rebased[f"{split}_images"] = str(folder)
    out = cache_dir / "data" / "data.yaml"
    with atomic_write(out, "w", encoding="utf-8") as handle:
        handle.write(yaml.safe_dump(rebased, sort_keys=False))
    log.info("data: %s rebased onto channel %s -> %s", yaml_path, train_channel, out)
    return out


def check_dataset(data_yaml: Path, env: SageMakerEnv, *, cache_dir: Path, max_pixels: int) -> None:
    """Scan train and val labels once before any worker starts, as the workers will (stale/foreign caches
    are reported and ignored, our cache is written to `cache_dir`, so the workers load it). Raises
    DataError when a split has no usable image; the message names the folder."""
    config = load_data_config(data_yaml, cache_dir=cache_dir)
    for split in ("train", "val"):
        index = scan_split(
            config, split, cache_dir=cache_dir, workers=scan_workers(env.num_cpus), max_pixels=max_pixels
        )
        r = index.report
        log.info(
            "dataset check %s (%s): %d images, %d usable, %d missing labels, %d empty, %d bad, %d boxes; "
            "cache %s",
            split,
            ", ".join(str(s) for s in getattr(config, split)),
            r.found,
            r.usable,
            r.missing_labels,
            r.empty_labels,
            r.bad,
            r.boxes,
            r.cache,
        )


def weights_from_channel(env: SageMakerEnv, weights: str | None) -> Path | None:
    """The --weights the workers get from a `weights`/`model` channel; None when the job has no such
    channel (`weights` then stays as given: a path in the image, or none).

    A relative `weights` (`yolov5s.pt`) is a file in the channel; without `weights`, the channel's only
    top-level `.pt`. The file is read once here (safely: models.weights), so a file that is not usable
    weights stops the job before any worker starts. ConfigError naming the channel and the files it holds,
    WeightsError naming the file."""
    folder = channel(env, WEIGHTS_CHANNELS)
    if folder is None:
        return None
    if not folder.is_dir():
        raise ConfigError(channel_not_a_folder("weights", folder))
    held = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    pts = [name for name in held if name.endswith(".pt")]
    if weights is not None and Path(weights).is_absolute():
        return None  # a path in the image or another channel, as given
    if weights is not None:
        path = folder / weights
        if not path.is_file():
            raise ConfigError(
                f"--weights {weights}: not in the weights channel {folder} (it holds: {', '.join(held) or 'nothing'})"
            )
    elif len(pts) == 1:
        path = folder / pts[0]
    else:
        raise ConfigError(
            f"weights channel {folder} holds {len(pts)} .pt files ({', '.join(pts) or 'none'}"
            + (f"; other files: {', '.join(n for n in held if n not in pts)}" if len(held) > len(pts) else "")
            + "): put one .pt there, or pass --weights NAME"
        )
    from yolov5_smddp.models.weights import load_weights  # torch: only for a job with a weights channel

    loaded = load_weights(path)  # WeightsError naming the file when it is not usable weights
    log.info("weights: %s from channel %s (%s)", path.name, folder, loaded.source)
    return path
