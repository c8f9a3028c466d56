"""The run's output folders: the run folder, checkpoints and the resume source."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from yolov5_smddp.config.resume import resume_source
from yolov5_smddp.config.train_config import TrainConfig


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
