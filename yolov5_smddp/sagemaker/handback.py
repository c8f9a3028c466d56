"""Outputs a person can open after a plain `docker run`: the container runs as root (the SageMaker toolkit
needs it), so what it writes into mounted folders would belong to root on the host. With
`-e YOLOV5_SMDDP_OWNER=$(id -u):$(id -g)` (`./build.sh run` passes it) the ENTRYPOINT hands the output
folders (model/, output/, checkpoints/ under /opt/ml) back to that user when the job ends.

Only what the container's own user owns is handed back (never files that belong to someone else), links are
changed themselves and never followed. Without the variable (SageMaker, local mode) nothing happens.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from yolov5_smddp.errors import ConfigError
from yolov5_smddp.sagemaker.env import base_dir

OWNER_ENV = "YOLOV5_SMDDP_OWNER"
OUTPUT_FOLDERS = ("model", "output", "checkpoints")
"""The folders under /opt/ml a job writes to."""


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int


def requested_owner(environ: Mapping[str, str]) -> Owner | None:
    """The owner named by $YOLOV5_SMDDP_OWNER ("UID:GID", e.g. "1000:1000"), None when unset or empty;
    ConfigError naming the variable and the value when it is not two non-negative integers."""
    text = environ.get(OWNER_ENV, "").strip()
    if not text:
        return None
    uid, sep, gid = text.partition(":")
    if not (sep and uid.isdigit() and gid.isdigit()):
        raise ConfigError(
            f"{OWNER_ENV}={text!r}: expected UID:GID as two non-negative numbers, "
            f'e.g. -e {OWNER_ENV}="$(id -u):$(id -g)"'
        )
    return Owner(int(uid), int(gid))


def output_folders(environ: Mapping[str, str]) -> list[Path]:
    """/opt/ml/{model,output,checkpoints} (SAGEMAKER_BASE_DIR moves /opt/ml)."""
    root = base_dir(environ)
    return [root / name for name in OUTPUT_FOLDERS]


def hand_back(folders: Iterable[Path], owner: Owner, *, from_uid: int | None = None) -> tuple[int, int]:
    """Give every file, link and folder in `folders` (the folders themselves included) owned by
    `from_uid` (default: this process's user) to `owner`; links are not followed. Returns (changed,
    failed); a folder that does not exist is skipped."""
    from_uid = os.geteuid() if from_uid is None else from_uid
    changed = failed = 0

    def give(path: str) -> None:
        nonlocal changed, failed
        try:
            if os.lstat(path).st_uid != from_uid:
                return
            os.chown(path, owner.uid, owner.gid, follow_symlinks=False)
            changed += 1
        except OSError:
            failed += 1

    for folder in folders:
        if not folder.is_dir() or folder.is_symlink():
            continue
        give(str(folder))
        for parent, dirs, files in os.walk(folder):
            for name in dirs + files:
                give(os.path.join(parent, name))
    return changed, failed
