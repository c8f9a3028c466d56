"""Restart-marker copies of the training JPEGs under the run's cache folder (`--jpeg-restart-cache`).

Why: a mosaic tile is decoded only where its warp reads it (`data.jpeg_roi`), but libjpeg must still
entropy-decode every row above the rectangle, and the top tiles of a mosaic show the bottom of their
images. A lossless copy with a restart marker after every MCU (`jpeg_roi.transcode_with_restarts`: the
same DCT coefficients, so the same pixels) lets a region decode start at the MCUs it shows
(`jpeg_roi.decode_region_restarts`). Measured in docs/PERFORMANCE.md ("Decoding only what a tile shows").

Each copy is named by a hash of the image's absolute path, size and modification time (and this
format's version), so an edited or replaced image gets a new copy and an old one is never read for it.
Copies are made lazily, the first time a tile of the image is region-decoded (from the original's
bytes, which that decode reads anyway; the tile is then decoded from the new copy), written to a
temporary name and renamed into place (ranks and workers of a node may write
the same copy at once; either is the same). A write that fails (disk full, read-only folder) turns the
copies off for this process with one warning: regions are then decoded from the originals, as before.
Nothing is ever written under the dataset.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from yolov5_smddp.files.atomic import atomic_write

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Bump when the copies change (restart spacing, Huffman tables): older copies are then never read."""
FOLDER = f"jpeg-restart-v{FORMAT_VERSION}"
SPACE_FACTOR = 1.2
"""Free space wanted: this times the training images' bytes (the copies are about their size) ..."""
SPACE_MARGIN = 1 << 30
"""... plus this margin (1 GiB), so the copies never fill the cache folder's disk."""


def copy_name(source: str, size: int, mtime_ns: int) -> str:
    """The copy's file name for an image at absolute path `source` with this size and mtime."""
    text = f"{FORMAT_VERSION}\0{source}\0{size}\0{mtime_ns}"
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest() + ".jpg"


def enough_space(free_bytes: int, image_bytes: int) -> bool:
    """Whether a folder with `free_bytes` free may hold copies of images of `image_bytes` in all."""
    return free_bytes >= SPACE_FACTOR * image_bytes + SPACE_MARGIN


def total_bytes(paths: Sequence[Path], sample: int = 2000) -> int:
    """The files' sizes summed (a file that cannot be stat'ed counts 0); for more than `sample` files,
    estimated from `sample` of them evenly spaced (each rank checks this before training: 118k stats on
    a network file system would cost seconds to decide about a margin)."""
    step = max(len(paths) / sample, 1.0)
    chosen = [paths[int(k * step)] for k in range(min(len(paths), sample))]
    total = 0
    for p in chosen:
        with contextlib.suppress(OSError):
            total += os.stat(p).st_size
    return round(total * len(paths) / len(chosen)) if chosen else 0


class RestartCache:
    """The copies under `root / FOLDER`; `enabled` turns False (for this process) after a failed write."""

    def __init__(self, root: Path) -> None:
        self.folder = Path(root) / FOLDER
        self.enabled = True

    def copy_path(self, image: Path) -> Path | None:
        """Where the copy of `image` as it is on disk now lives (whether written yet or not); None
        when the copies are off or the image cannot be stat'ed."""
        if not self.enabled:
            return None
        try:
            st = os.stat(image)
        except OSError:
            return None
        return self.folder / copy_name(os.path.abspath(image), st.st_size, st.st_mtime_ns)

    @staticmethod
    def read(path: Path, buffer: np.ndarray) -> np.ndarray | None:
        """The copy's bytes (uint8 [n]: a view of `buffer`, a contiguous uint8 [m] array, when they fit,
        else an array of their own), or None when it is not there (yet). Three system calls (open,
        one read, close): per tile they cost more than a Python file object's buffering saves."""
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        try:
            n = os.readv(fd, [buffer])
            if n < buffer.size:
                return buffer[:n]
            chunks = [buffer.tobytes()]  # a copy larger than the buffer: read the rest too
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return np.frombuffer(b"".join(chunks), np.uint8)
        except OSError:
            return None
        finally:
            os.close(fd)

    def write(self, path: Path, data: bytes) -> None:
        """Store a copy at `path` (from `copy_path`) atomically; a failed write turns the copies off for
        this process (one warning)."""
        if not self.enabled:
            return
        try:
            with atomic_write(path, fsync=False) as handle:
                handle.write(data)
        except OSError as exc:
            self.enabled = False
            log.warning(
                "--jpeg-restart-cache: cannot write %s (%s); this process decodes regions from the "
                "original files",
                path,
                exc.strerror or exc,
            )


def restart_cache_for(root: Path, images: list[Path]) -> tuple[RestartCache | None, str]:
    """The cache under `root` when its file system has room for copies of `images` (`enough_space`),
    with the log line saying so; (None, why not) otherwise."""
    cache = RestartCache(root)
    try:
        cache.folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(cache.folder).free
    except OSError as exc:
        return None, f"--jpeg-restart-cache off: cannot use {cache.folder} ({exc.strerror or exc})"
    need = total_bytes(images)
    if not enough_space(free, need):
        return None, (
            f"--jpeg-restart-cache off: {free / 1e9:.1f} GB free in {cache.folder}, the copies of "
            f"{need / 1e9:.1f} GB of training images want {SPACE_FACTOR}x that + 1 GiB"
        )
    return cache, f"--jpeg-restart-cache: copies of the JPEGs with restart markers in {cache.folder}"
