"""Per-key hyperparameter options, `--hyp-<key> VALUE`, for SageMaker Automatic Model Tuning.

AMT tunes whole hyperparameters, one number each, but our YOLOv5 hyperparameters (lr0, mosaic, ...) live in
one option, `--hyp-override key=value,...`. So a tuning job names one hyperparameter per key, `hyp-lr0`,
`hyp-mosaic` (`yolov5_smddp.client.job.tuner_kwargs` builds those names), and the SageMaker entrypoint calls
`fold_hyp_options()` on its arguments before parsing them: every `--hyp-<key> VALUE` becomes part of a single
`--hyp-override`. The key is a hyperparameter YAML key (`weight_decay`; `hyp-weight-decay` works too).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from yolov5_smddp.config.hyp import check_hyp_value
from yolov5_smddp.config.parsing import parse_overrides
from yolov5_smddp.errors import ConfigError

PREFIX = "hyp-"
_OVERRIDE_FLAGS = ("hyp-override", "hyp-overrides")


def hyp_option(key: str) -> str:
    """The hyperparameter (option) name that tunes one key: "lr0" -> "hyp-lr0"."""
    return PREFIX + key


def hyp_key(name: str) -> str | None:
    """The key a per-key name tunes ("hyp-lr0", "hyp_weight-decay" -> "lr0", "weight_decay"), else None.

    `hyp-override` and its spellings are not per-key names. The key is not checked here.
    """
    normal = name.replace("_", "-")
    if not normal.startswith(PREFIX) or normal in _OVERRIDE_FLAGS or normal == PREFIX:
        return None
    return normal[len(PREFIX) :].replace("-", "_")


def fold_hyp_options(args: Sequence[str]) -> list[str]:
    """Command-line words with every `--hyp-<key> V` (or `--hyp-<key>=V`) folded into one `--hyp-override`.

    `["--epochs", "3", "--hyp-lr0", "0.02", "--hyp-override", "mosaic=0"]` ->
    `["--epochs", "3", "--hyp-override", "mosaic=0.0,lr0=0.02"]`. Without per-key options the words come back
    unchanged. Raises ConfigError for an unknown key, a value that is not a number or out of its range, a
    missing value, or a key given twice (per-key and in --hyp-override, or per-key twice).
    """
    kept: list[str] = []
    per_key: dict[str, str] = {}
    override_text: str | None = None
    i = 0
    while i < len(args):
        word = args[i]
        flag, eq, inline = word.partition("=")
        name = flag[2:] if flag.startswith("--") else None
        key = hyp_key(name) if name else None
        is_override = name is not None and name.replace("_", "-") in _OVERRIDE_FLAGS
        if key is None and not is_override:
            kept.append(word)
            i += 1
            continue
        if eq:
            value, i = inline, i + 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value, i = args[i + 1], i + 2
        else:
            raise ConfigError(f"{flag} needs a value")
        if is_override:
            override_text = value
            continue
        try:
            number = float(value)
        except ValueError:
            number = value  # check_hyp_value names it as "not a number"
        check_hyp_value(key, number, source=flag)
        if key in per_key:
            raise ConfigError(f"{flag}: hyperparameter {key} is given twice ({per_key[key]} and {value})")
        per_key[key] = value
    if not per_key:
        return list(args)
    merged: dict[str, str] = {}
    if override_text is not None:
        try:
            overrides = parse_overrides(override_text)
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"--hyp-override: {exc}") from exc
        for key, number in overrides.items():
            if key in per_key:
                raise ConfigError(
                    f"hyperparameter {key} is given twice: in --hyp-override ({number}) and as "
                    f"--{hyp_option(key)} ({per_key[key]}); give it once"
                )
            merged[key] = repr(number)
    merged.update(per_key)
    return [*kept, "--hyp-override", ",".join(f"{k}={v}" for k, v in merged.items())]
