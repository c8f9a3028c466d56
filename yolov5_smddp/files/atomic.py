"""Atomic file writes: a reader (another rank, a spot restart, SageMaker's S3 sync) sees the old file or
the complete new one, never a partial one. A write that fails for want of space or permission (a full
disk, a read-only folder, a file where a folder should be) raises errors.OutputError naming the folder and
the cause, and leaves no temporary file behind."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from yolov5_smddp.errors import output_error
from yolov5_smddp.files import claimed_dir

FILE_MODE = 0o666
"""Mode a new file is created with before the umask, as `open()` does: 0644 under the usual umask 022."""


def make_folder(folder: str | os.PathLike) -> Path:
    """`mkdir -p folder`; OutputError (one line: the folder and the cause) when it cannot be made."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise (output_error(exc, folder, creating=True) or exc) from exc
    return folder


def _create_temporary(path: Path, staging: Path | None = None) -> tuple[int, Path]:
    """A new, unique, empty file in `staging` (next to `path` without one) (O_EXCL), mode FILE_MODE minus
    the process umask (the kernel applies it; `tempfile.mkstemp` would make it 0600, unreadable to anyone
    else)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    folder = path.parent if staging is None else Path(staging)
    while True:
        tmp = folder / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, flags, FILE_MODE), tmp
        except FileExistsError:
            continue


@contextmanager
def atomic_write(
    path: str | os.PathLike,
    mode: str = "wb",
    *,
    fsync: bool = True,
    staging: str | os.PathLike | None = None,
    **open_kwargs,
) -> Iterator[IO]:
    """Open a unique temporary file next to `path` for writing (in `staging`, a folder on the same file
    system, when given; in the claimed folder's staging folder for a folder a run has claimed:
    claimed_dir.py); on a clean exit flush, fsync and
    `os.replace` it onto `path` (atomic on POSIX file systems); on an exception remove it. The file gets
    the permissions a plain `open(path, "w")` would give a new file (0644 under umask 022).

    A failure to write (OSError for a full disk, a read-only folder, ...; torch.save's "unexpected pos"
    RuntimeError) becomes errors.OutputError; any other exception propagates unchanged.

    Several writers racing on the same path each replace it with a complete file (the last one wins).
    `fsync=False` for a cache's entries: no wait for the disk (a file lost to a crash is made again).
    """
    path = Path(path)
    make_folder(path.parent)
    if staging is None:
        staging = claimed_dir.staging_for(path.parent)
    try:
        fd, tmp = _create_temporary(path, staging)
    except OSError as exc:
        raise (output_error(exc, path) or exc) from exc
    try:
        with os.fdopen(fd, mode, **open_kwargs) as handle:
            yield handle
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        failed_write = output_error(exc, path) if isinstance(exc, Exception) else None
        if failed_write is None or failed_write is exc:
            raise
        raise failed_write from exc


def atomic_copy(source: str | os.PathLike, target: str | os.PathLike, **kwargs) -> Path:
    """Copy `source` onto `target` as atomic_write writes (a kill leaves the old target or the whole copy,
    never a part of it under the final name); `kwargs` go to atomic_write (staging). Returns `target`."""
    target = Path(target)
    with open(source, "rb") as src, atomic_write(target, **kwargs) as out:
        shutil.copyfileobj(src, out, 1 << 20)
    return target
