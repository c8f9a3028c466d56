"""The parsed `TrainConfig` handed to the training workers: the SageMaker driver parses the hyperparameters
once (`config.parse_train_args`), fills in the job's folders, data and weights (`with_options`), and gives
the result to the worker in its own process as it is, or to the elastic launcher's workers as one JSON
argument (`to_json`) that each worker checks when it reads it back (`from_json`).

Nothing is parsed twice: a worker gets exactly the values the driver decided, and which options were
"given" (a resume keeps the run's value of every other, config.resume_run) travels with them.
"""

from __future__ import annotations

import dataclasses
import json
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from yolov5_smddp.config.train_config import TrainConfig
from yolov5_smddp.errors import ConfigError

FORMAT = "yolov5-smddp-train-config/1"
"""The tag of the JSON form; a worker refuses any other (a driver and workers of different versions)."""

_HINTS = get_type_hints(TrainConfig)
_OPTIONS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name != "given")


def with_options(config: TrainConfig, **values: Any) -> TrainConfig:
    """`config` with `values` set and counted as given on the command line (as the options the driver
    used to append to the workers' argv were), every value checked again by TrainConfig. `--freeze`,
    which TrainConfig expands once (`--freeze 3` → [0, 1, 2]), keeps its expanded list."""
    unknown = sorted(set(values) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"with_options: not TrainConfig options: {', '.join(unknown)}")
    out = dataclasses.replace(config, **values, given=config.given | frozenset(values))
    out.freeze = list(values.get("freeze", config.freeze))
    return out


def to_json(config: TrainConfig) -> str:
    """One line of JSON: every option's value and the names of the given ones."""
    document = {"format": FORMAT, "options": config.to_dict(), "given": sorted(config.given)}
    return json.dumps(document, sort_keys=True, allow_nan=False, separators=(",", ":"))


def from_json(text: str, *, source: str) -> TrainConfig:
    """The TrainConfig `to_json` wrote, checked: the format tag, exactly the known options, each value of
    its option's type, then TrainConfig's own checks. ConfigError naming `source` and the problem."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{source}: not a training config (bad JSON: {exc})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise ConfigError(f"{source}: not a training config of format {FORMAT!r} (found {found!r})")
    options, given = document.get("options"), document.get("given")
    if not isinstance(options, dict):
        raise ConfigError(f"{source}: 'options' must be an object")
    missing, unknown = sorted(set(_OPTIONS) - set(options)), sorted(set(options) - set(_OPTIONS))
    if missing or unknown:
        raise ConfigError(
            f"{source}: the options differ from this version's TrainConfig (missing: {', '.join(missing) or '-'}; "
            f"unknown: {', '.join(unknown) or '-'})"
        )
    if (
        not isinstance(given, list)
        or not set(given) <= set(_OPTIONS)
        or not all(isinstance(g, str) for g in given)
    ):
        raise ConfigError(f"{source}: 'given' must list option names, got {given!r}")
    for name, value in options.items():
        if not _matches(value, _HINTS[name]):
            raise ConfigError(f"{source}: option {name!r} has {value!r}, not a value of type {_HINTS[name]}")
    try:
        config = TrainConfig(**options, given=frozenset(given))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    config.freeze = list(options["freeze"])  # recorded expanded (see with_options)
    return config


def _matches(value: Any, hint: Any) -> bool:
    """Whether the JSON value `value` is a value of the field type `hint` (the types TrainConfig uses)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if origin is Literal:
        return any(value == arg and type(value) is type(arg) for arg in args)
    if origin is list:
        return isinstance(value, list) and all(_matches(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items()
        )
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    raise TypeError(f"worker_config: no JSON check for the TrainConfig type {hint!r}")
