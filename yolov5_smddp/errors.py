"""Exceptions for bad input. Their messages are written for the user: they name the file or value and
say why it is wrong and what to do. The CLI and the SageMaker boundary print them without a traceback
(the traceback still goes to the log at debug level) and turn them into a non-zero exit."""

from __future__ import annotations

import errno
import os
from pathlib import Path

EXIT_INTERRUPTED = 143
"""128 + SIGTERM: the run wrote its checkpoint and stopped; the same command resumes it. The trainer
returns it; the elastic launcher and the SageMaker driver pass it on."""


class UserError(Exception):
    """Bad input from the user (a file, a value, a dataset, a checkpoint)."""


class ConfigError(UserError):
    """An invalid option, hyperparameter or YAML value. The message names the key."""


class DataError(UserError):
    """A dataset problem that makes training impossible (no usable labels, bad data.yaml, strict cache)."""


class WeightsError(UserError):
    """A checkpoint that cannot be read safely or does not fit the model."""


class OutputError(UserError, OSError):
    """A file or folder this program writes could not be written: a full disk, a read-only or
    unwritable folder, a file where a folder should be. `folder` is the folder named in the message,
    `cause` the short reason ("no space left on /opt/ml/model"), `errno` the OS error number (or None).

    Also an OSError: code that tolerates a failed write (a cache folder that cannot be written costs a log
    line, not the run) catches OSError, as it did before atomic_write raised this instead."""

    def __init__(
        self, path: Path, folder: Path, cause: str, errno: int | None, *, what: str = "write"
    ) -> None:
        super().__init__(f"cannot {what} {path}: {cause}")
        self.path, self.folder, self.cause, self.errno = path, folder, cause, errno


TORCH_WRITE_FAILURE_MARKS = ("inline_container.cc", "unexpected pos", "PytorchStreamWriter failed")
"""Texts of torch.save's RuntimeError when its writer could not write the whole file (a full disk)."""

_OUTPUT_ERRNOS = {
    errno.ENOSPC: "no space left on {folder}",
    errno.EDQUOT: "disk quota exceeded on {folder}",
    errno.EFBIG: "the file is too large for the file system of {folder}",
    errno.EROFS: "{folder} is on a read-only file system",
    errno.EACCES: "permission denied: {folder} is not writable by this user",
    errno.EPERM: "permission denied: {folder} is not writable by this user",
    errno.ENOTDIR: "{blocker} is a file where a folder should be",
    errno.EEXIST: "{blocker} is a file where a folder should be",
    errno.EISDIR: "{path} is a folder where a file should be",
    errno.ENAMETOOLONG: "the file name is too long",
    errno.EIO: "an I/O error on {folder}",
}
"""OS errors that mean "this output cannot be written here" (the user's folder or disk must change)."""


def _oserror_in_chain(exc: BaseException) -> OSError | None:
    """The first OSError among `exc`, its cause and its context (torch.save's RuntimeError carries the
    file object's OSError as its context)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _first_file_in_the_way(folder: Path) -> Path:
    """The deepest existing ancestor of `folder` (or `folder` itself) that is not a directory; `folder`
    when there is none."""
    for candidate in (folder, *folder.parents):
        if candidate.exists() or candidate.is_symlink():
            return folder if candidate.is_dir() else candidate
    return folder


def _is_torch_write_failure(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and any(mark in str(exc) for mark in TORCH_WRITE_FAILURE_MARKS)


def output_error(
    exc: BaseException, path: str | os.PathLike, *, creating: bool = False
) -> OutputError | None:
    """The OutputError that `exc`, raised while writing the file `path` (or making the folder `path`
    when `creating`), stands for; None when `exc` is no write failure (a bug, a bad value: it propagates as
    it is). Looks at the file system only to find which parent is a file."""
    if isinstance(exc, OutputError):
        return exc
    path = Path(path)
    what = "create the folder" if creating else "write"
    folder = path if creating else path.parent
    os_error = _oserror_in_chain(exc)
    code = os_error.errno if os_error is not None else None
    if code not in _OUTPUT_ERRNOS:
        if not _is_torch_write_failure(exc):
            return None
        cause = f"the write failed in {folder} ({' '.join(str(exc).split())})"
        return OutputError(path, folder, cause, code, what=what)
    # a folder being made: the cause lies with its deepest existing parent (read-only, not writable, full)
    named = next((p for p in (folder, *folder.parents) if p.exists()), folder) if creating else folder
    blocker = _first_file_in_the_way(folder)
    cause = _OUTPUT_ERRNOS[code].format(folder=named, blocker=blocker, path=path)
    return OutputError(path, folder, cause, code, what=what)


class WorkerFailed(RuntimeError):
    """A worker process failed; the message names its rank, exit code and error."""

    def __init__(self, message: str, exitcode: int) -> None:
        super().__init__(message)
        self.exitcode = exitcode
