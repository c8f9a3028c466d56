"""A single-host SageMaker config for plain `docker run IMAGE train ...`, so the real toolkit's `train` runs.

The writer of input/config/*.json when nothing is mounted there (SageMaker, local mode and a mounted tree
bring their own, and are never touched).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from yolov5_smddp.errors import ConfigError
from yolov5_smddp.files.atomic import atomic_write
from yolov5_smddp.sagemaker.env import base_dir


def hyperparameters_from_cli(args: Sequence[str]) -> dict[str, str]:
    """`--epochs 3 --rect --cfg=s` -> {"epochs": "3", "rect": "true", "cfg": "\"s\""}, as SageMaker writes them.

    The values are stored as the JSON-encoded strings SageMaker writes. Raises ConfigError for a word that
    is not an option.
    """
    hps: dict[str, str] = {}
    i = 0
    while i < len(args):
        word = args[i]
        if not word.startswith("-") or word in ("-", "--"):
            raise ConfigError(f"argument {word!r}: expected an option like --epochs 3 after 'train'")
        key, eq, value = word.lstrip("-").partition("=")
        if not eq:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                value = args[i + 1]
                i += 1
            else:
                value = "true"
        hps[key] = json.dumps(value) if _needs_json_quotes(value) else value
        i += 1
    return hps


def _needs_json_quotes(value: str) -> bool:
    """A string that does not decode as JSON by itself gets quoted, as the SDK does for str values."""
    try:
        json.loads(value)
    except ValueError:
        return True
    return False


def _write_json(path: Path, obj: object) -> None:
    with atomic_write(path, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(obj, indent=1))


def write_local_config(environ: Mapping[str, str], cli_args: Sequence[str], *, hostname: str) -> Path | None:
    """Writes a single-host SageMaker config when none is mounted.

    Writes input/config/{resourceconfig,hyperparameters,inputdataconfig}.json under the base dir (channels =
    the folders mounted under input/data). Returns the config folder, or None when a resourceconfig.json
    already exists (SageMaker, local mode, a mounted tree): then nothing is touched. resourceconfig.json is
    written last: its presence means the config is complete.
    """
    base = base_dir(environ)
    config_dir = base / "input" / "config"
    if (config_dir / "resourceconfig.json").exists():
        return None
    hps = hyperparameters_from_cli(cli_args)
    data_root = base / "input" / "data"
    names = sorted(p.name for p in data_root.iterdir() if p.is_dir()) if data_root.is_dir() else []
    resource = {
        "current_host": hostname,
        "hosts": [hostname],
        "network_interface_name": "eth0",
        "current_group_name": "homogeneousCluster",
        "current_instance_type": "local",
        "instance_groups": [
            {"instance_group_name": "homogeneousCluster", "instance_type": "local", "hosts": [hostname]}
        ],
    }
    hp_path = config_dir / "hyperparameters.json"
    if not hp_path.exists() or hps:
        _write_json(hp_path, hps)
    data_path = config_dir / "inputdataconfig.json"
    if not data_path.exists():
        _write_json(
            data_path,
            {n: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"} for n in names},
        )
    _write_json(config_dir / "resourceconfig.json", resource)
    return config_dir
