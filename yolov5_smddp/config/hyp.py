"""The typed hyperparameters (`Hyp`) and the hyperparameter YAMLs (package data): reading, checking, overrides."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from yolov5_smddp.errors import ConfigError
from yolov5_smddp.files.bounded_read import shown
from yolov5_smddp.files.bounded_yaml import load_yaml

HYP_NAMES = ("scratch-low", "scratch-med", "scratch-high")


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
