"""The command-line machinery of `TrainConfig`: an argparse that raises `ConfigError`, value parsers, `option`."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import field
from typing import Any, Literal, get_args, get_origin

from yolov5_smddp.config.hyp import _short
from yolov5_smddp.errors import ConfigError


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
