"""Bounded reads of foreign files: only regular files are opened, never more than a stated limit is read.

A FIFO, a device (`/dev/zero`), a socket or a folder where a file is expected is refused by its `stat`
before anything opens it (opening a FIFO for reading blocks until a writer comes; reading /dev/zero never
ends). The file is then opened non-blocking and checked again through its descriptor, so a path swapped
for a FIFO in between cannot hang the read either.

`shown(path)` spells a path for a message: a name that is not valid UTF-8 (Python keeps its bytes as
surrogates) is shown with `\\xNN` escapes, so printing or logging it can never raise UnicodeEncodeError.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO


class UnreadableFile(Exception):
    """A file that is not read: not a regular file, over its size limit, or failing to open. The message
    is the reason, without the path (callers add it the way their messages name files)."""


def shown(path: Path | str) -> str:
    """`path` as text that any stream can print: undecodable bytes of its name as `\\xNN`."""
    return os.fsencode(str(path)).decode("utf-8", "backslashreplace")


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def not_regular_reason(path: Path | str) -> str | None:
    """Why `path` (links followed) is not a regular file, e.g. "a FIFO (named pipe), not a regular file";
    None when it is one. Raises OSError when it cannot be stat'ed (missing, a link loop, no permission)."""
    mode = os.stat(path).st_mode
    return None if stat.S_ISREG(mode) else f"{_kind(mode)}, not a regular file"


def open_regular(path: Path | str) -> BinaryIO:
    """`path` opened for binary reading, only if it is a regular file (checked by `stat` before opening,
    and through the descriptor after). Raises UnreadableFile naming the kind of file otherwise, or when it
    cannot be opened; FileNotFoundError passes through (callers treat a missing file on its own)."""
    try:
        reason = not_regular_reason(path)
        if reason:
            raise UnreadableFile(reason)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO swapped in after the stat: no blocking
    except (FileNotFoundError, UnreadableFile):
        raise
    except OSError as exc:
        raise UnreadableFile(f"cannot be read: {exc.strerror or exc}") from None
    f = os.fdopen(fd, "rb")
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        f.close()
        raise UnreadableFile(f"{_kind(mode)}, not a regular file")
    return f


def read_limited(path: Path | str, limit: int, *, what: str = "file") -> bytes:
    """The whole of the regular file `path`, at most `limit` bytes. Raises UnreadableFile when it is not a
    regular file, holds more than `limit` bytes ("a 104,857,600-byte label file, over the limit of
    1,048,576 bytes") or cannot be read; FileNotFoundError passes through."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise UnreadableFile(f"a {size:,}-byte {what}, over the limit of {limit:,} bytes")
        try:
            data = _read_chunks(f, limit)
        except OSError as exc:
            raise UnreadableFile(f"cannot be read: {exc.strerror or exc}") from None
    if data is None:
        raise UnreadableFile(f"a {what} of more than {limit:,} bytes, over the limit of {limit:,} bytes")
    return data


CHUNK_BYTES = 1024 * 1024
"""What one read asks for: memory grows with what the file holds, never with the limit (a 1 KB JSON under
COCO's 4 GiB limit reserves 1 MiB, not 4 GiB, so it reads under `ulimit -v` or strict overcommit)."""


def _read_chunks(f: BinaryIO, limit: int) -> bytes | None:
    """All of `f` in reads of at most CHUNK_BYTES, or None once it holds more than `limit` bytes (a file
    that grew since its fstat is still read no further than limit + 1)."""
    parts: list[bytes] = []
    total = 0
    while total <= limit:
        part = f.read(min(CHUNK_BYTES, limit + 1 - total))
        if not part:
            break
        parts.append(part)
        total += len(part)
    return None if total > limit else b"".join(parts)
