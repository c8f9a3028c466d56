"""A cheap content mark of an image file for the label cache (issue 50): an image replaced after it was
cached (garbage of the same size, another photo) is re-checked before the next run trusts the cache.

The mark digests the file's size, its first and its last `EDGE_BYTES` bytes: two small reads per image
(~10-50 us from the page cache), where hashing whole images would read the dataset again on every run.
Its limit: an edit inside a file that keeps its size and both ends is not seen (JPEG, PNG and the other
formats this trainer reads keep their headers at the start and their end markers at the end, so a
replaced or truncated image changes an end).
"""

from __future__ import annotations

import hashlib
import os

EDGE_BYTES = 4096


def image_mark(path: str) -> str:
    """16 hex digits over the size and both ends of the file `path`; "" when it cannot be read (the scan
    reports that file on its own)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, EDGE_BYTES, 0)
        tail = os.pread(fd, EDGE_BYTES, max(size - EDGE_BYTES, 0)) if size > EDGE_BYTES else b""
    except OSError:
        return ""
    finally:
        os.close(fd)
    h = hashlib.blake2b(digest_size=8)
    h.update(size.to_bytes(8, "little", signed=True))
    h.update(head)
    h.update(tail)
    return h.hexdigest()


def image_marks(paths: list[str]) -> list[str]:
    return [image_mark(p) for p in paths]
