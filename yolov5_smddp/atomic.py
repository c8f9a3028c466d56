"""Atomic file writes: a reader (another rank, a spot restart, SageMaker's S3 sync) sees the old file or
the complete new one, never a partial one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", **open_kwargs) -> Iterator[IO]:
    """Open a unique temporary file next to `path` for writing; on a clean exit flush, fsync and
    `os.replace` it onto `path` (atomic on POSIX file systems); on an exception remove it.

    Several writers racing on the same path each replace it with a complete file (the last one wins).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **open_kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
