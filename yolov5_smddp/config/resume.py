"""The resume rules: which run a `--resume` continues, and what a resumed run keeps of its saved config."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from yolov5_smddp.config.train_config import RESUME_FROM_COMMAND, TrainConfig, _opt
from yolov5_smddp.errors import ConfigError


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
