"""Folders a run owns while it writes them: the checkpoint folder (SageMaker mirrors /opt/ml/checkpoints to
S3 as files appear) and the model folder (packed into model.tar.gz). A claimed folder only ever holds
complete files under their final names:

- temporary files are staged in a sibling folder on the same file system (`.<name>.staging` beside it)
  and renamed in (atomic.atomic_write looks the staging folder up here); when the folder is a mount point
  of its own (a bind mount, an EFS/FSx mount), a rename from outside it would cross file systems, so a
  hidden `.staging` subfolder inside it is used instead, said in one line;
- temporary files a killed run left (in the folder or its staging folder) are removed at the claim, in one
  line;
- one run owns a folder at a time (an flock in the staging folder): a second run on the same checkpoint
  folder is refused with the folder and the owner's pid instead of both writing last.pt;
- the staging folder is removed when the run gives the folder back.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from yolov5_smddp.errors import OutputError, output_error

log = logging.getLogger("yolov5_smddp")

TEMPORARY = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")
"""The names atomic_write gives its temporary files (`.last.pt.0123456789ab.tmp`)."""
LOCK = ".lock"
SUBFOLDER = ".staging"

_claimed: dict[Path, Path] = {}
"""claimed folder (resolved) -> its staging folder, for atomic_write."""


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_points(mountinfo: str | os.PathLike = "/proc/self/mountinfo") -> set[Path]:
    """The mount points this process sees (field 5 of /proc/self/mountinfo); empty when unreadable."""
    try:
        text = Path(mountinfo).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return set()
    points = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.add(Path(_unescape(fields[4])))
    return points


def is_mount_point(folder: Path, mountinfo: str | os.PathLike = "/proc/self/mountinfo") -> bool:
    """Whether `folder` is a mount point: mountinfo's list, else a device change from its parent."""
    folder = Path(folder).resolve()
    points = mount_points(mountinfo)
    if points:
        return folder in points
    return os.path.ismount(folder)


def staging_dir_for(folder: Path, mountinfo: str | os.PathLike = "/proc/self/mountinfo") -> Path:
    """Where `folder`'s temporary files are written: `.<name>.staging` beside it, or `.staging` inside it
    when it is a mount point (a rename from the sibling would cross file systems)."""
    folder = Path(folder).resolve()
    if is_mount_point(folder, mountinfo) or folder.parent == folder:
        return folder / SUBFOLDER
    return folder.parent / f".{folder.name}.staging"


def staging_for(folder: Path) -> Path | None:
    """The staging folder of a claimed `folder`, None for any other folder."""
    if not _claimed:
        return None
    try:
        return _claimed.get(Path(folder).resolve())
    except OSError:
        return None


def sweep(folder: Path, staging: Path) -> list[str]:
    """Remove the temporary files a killed run left in `folder` and everything in `staging` (but its
    lock); the names removed."""
    removed = []
    for entry in sorted(Path(folder).iterdir()) if Path(folder).is_dir() else []:
        if TEMPORARY.match(entry.name) and (entry.is_file() or entry.is_symlink()):
            entry.unlink(missing_ok=True)
            removed.append(entry.name)
    for entry in sorted(staging.iterdir()) if staging.is_dir() else []:
        if entry.name == LOCK:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(f"{staging.name}/{entry.name}")
    return removed


def _make(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise (output_error(exc, folder, creating=True) or exc) from exc


def _make_staging(folder: Path, staging: Path, what: str) -> Path | None:
    """`staging` made; inside `folder` when the sibling cannot be made (its parent is not writable); None,
    with one line, when neither can (temporary files then go beside their files)."""
    for candidate in dict.fromkeys((staging, folder / SUBFOLDER)):
        try:
            candidate.mkdir(exist_ok=True)
            return candidate
        except OSError as exc:
            error = exc
    log.info("%s %s: no staging folder (%s); temporary files go beside their files", what, folder, error)
    return None


def _lock(staging: Path, folder: Path, what: str) -> int | None:
    """An exclusive flock on staging/.lock, its fd; None where the file system has no locks."""
    path = staging / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        raise (output_error(exc, path) or exc) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            owner = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise OutputError(
                folder,
                folder,
                f"another run (pid {owner}) is writing this {what} now; give each run its own "
                f"--checkpoint-dir, or wait for that run to end",
                exc.errno,
            ) from None
        os.close(fd)  # ENOLCK / EOPNOTSUPP: a file system without locks; the claim goes on unlocked
        log.info(
            "%s %s: no file lock on this file system (%s); one run at a time is up to you", what, folder, exc
        )
        return None
    try:  # the owner's pid, for the message a second run gets; a full disk only loses the pid
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass
    return fd


@contextmanager
def claim(
    folder: str | os.PathLike,
    what: str = "checkpoint folder",
    mountinfo: str | os.PathLike = "/proc/self/mountinfo",
) -> Iterator[Path]:
    """Own `folder` for a `with` block: made if missing, locked, stale temporaries swept (one line), its
    writes staged outside it; the staging folder's path is yielded and removed at the end."""
    folder = Path(folder)
    _make(folder)
    folder = folder.resolve()
    staging = _make_staging(folder, staging_dir_for(folder, mountinfo), what)
    if staging is None:  # a full or read-only folder: its writes fail later, each named (atomic_write)
        yield folder
        return
    if staging.parent == folder:
        log.info(
            "%s %s is a mount point of its own: its temporary files are staged in %s inside it (renames do "
            "not cross file systems) and removed at the end of the run",
            what,
            folder,
            staging,
        )
    try:
        fd = _lock(staging, folder, what)
    except BaseException:
        _remove_empty(staging)
        raise
    try:
        removed = sweep(folder, staging)
        if removed:
            log.info(
                "%s %s: removed %d temporary file(s) a stopped run left: %s",
                what,
                folder,
                len(removed),
                ", ".join(removed[:5]) + (" ..." if len(removed) > 5 else ""),
            )
        _claimed[folder] = staging
        yield staging
    finally:
        _claimed.pop(folder, None)
        sweep(folder, staging)
        if fd is not None:
            (staging / LOCK).unlink(missing_ok=True)
            os.close(fd)
        _remove_empty(staging)


def _remove_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


@contextmanager
def claim_folders(folders: list[tuple[str | os.PathLike, str]]) -> Iterator[None]:
    """`claim` each (folder, what) for a `with` block; a folder named twice is claimed once."""
    with ExitStack() as stack:
        seen: set[Path] = set()
        for folder, what in folders:
            resolved = Path(folder).resolve()
            if resolved not in seen:
                seen.add(resolved)
                stack.enter_context(claim(folder, what))
        yield
