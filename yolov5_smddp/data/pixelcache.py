"""Decoded, resized images on local disk (`--cache disk`): one file of raw BGR pixels per image under the
run's cache folder (never under the dataset).

Why: decoding the four JPEGs of a mosaic sample is most of a loader worker's time. A cached image costs a
stat, an open and one read (a copy out of the page cache: after the first epoch the files sit there, ONE
copy per node shared by every rank and worker; `--cache ram` holds one per rank). The pixels are exactly
the decoded-and-resized ones (what the model sees does not change). Raw pixels need no parsing: the shape
comes from the dataset and a file of any other size is a miss (np.load's header parsing and memory map
cost more than the read: 0.4-0.8 ms an image here).

Each file is named by a hash of the image's absolute path, size and modification time, in a folder per
image size and resize rule (training: INTER_LINEAR; validation: INTER_AREA when shrinking), so an edited
or replaced image gets a new entry and an old entry is never read for it. Files are written to a
temporary name and renamed into place (ranks and workers of a node may write the same entry at once;
either copy is the same). A write that fails (disk full, read-only folder) turns writing off for this process with one warning; the
run goes on decoding.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from yolov5_smddp.errors import DataError
from yolov5_smddp.files.atomic import atomic_write

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Bump when the decode or resize rule changes: older entries are then never read."""
SUFFIX = ".bgr"  # raw uint8 rows of BGR pixels; the shape comes from the dataset (the file size must match)
_SPACE_MARGIN = 1.05


class DiskPixelCache:
    """The entries of one resize rule (`img_size`, `augment`) under `folder`."""

    def __init__(self, folder: Path, img_size: int, augment: bool) -> None:
        self.root = Path(folder)
        self.folder = self.root / f"v{FORMAT_VERSION}-{int(img_size)}-{'train' if augment else 'val'}"
        self.writable = True

    def key(self, image: Path) -> str | None:
        """The entry name for `image` as it is now on disk; None when it cannot be stat'ed."""
        try:
            st = os.stat(image)
        except OSError:
            return None
        text = f"{Path(image).absolute()}\0{st.st_size}\0{st.st_mtime_ns}"
        return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}{SUFFIX}"

    def get(self, key: str | None, shape_hw: tuple[int, int]) -> np.ndarray | None:
        """The cached uint8 [h, w, 3] BGR image, or None on a miss (no entry, or one of another size)."""
        if key is None:
            return None
        img = np.empty((*shape_hw, 3), np.uint8)
        try:
            with open(self._path(key), "rb", buffering=0) as handle:
                if os.fstat(handle.fileno()).st_size != img.nbytes:
                    return None
                read = handle.readinto(memoryview(img).cast("B"))
        except OSError:
            return None
        return img if read == img.nbytes else None

    def put(self, key: str | None, img: np.ndarray) -> None:
        """Store `img` (uint8 [h, w, 3]) under `key`; a failed write turns writing off (one warning)."""
        if key is None or not self.writable:
            return
        path = self._path(key)
        try:
            with atomic_write(path, fsync=False) as handle:
                handle.write(memoryview(np.ascontiguousarray(img, dtype=np.uint8)).cast("B"))
        except OSError as exc:
            self.writable = False
            log.warning(
                "--cache disk: cannot write %s (%s); this process decodes the images it has not cached",
                path,
                exc.strerror or exc,
            )

    def cached_bytes(self) -> int:
        """Bytes of the entries already in this cache's folder."""
        total = 0
        if not self.folder.is_dir():
            return 0
        for sub in os.scandir(self.folder):
            if sub.is_dir():
                total += sum(e.stat().st_size for e in os.scandir(sub.path) if e.name.endswith(SUFFIX))
        return total


def entry_bytes(shapes_hw: Iterable[tuple[int, int]]) -> int:
    """Bytes the entries of images of these resized (h, w) take."""
    return sum(int(h) * int(w) * 3 for h, w in shapes_hw)


def check_space(caches: list[tuple[DiskPixelCache, int]]) -> str:
    """DataError when the folder cannot hold what is not cached yet (`caches`: each cache with the bytes
    its images need); else the log line: how much is cached and how much will be written."""
    needed = sum(b for _, b in caches)
    have = sum(c.cached_bytes() for c, _ in caches)
    root = caches[0][0].root
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    missing = max(needed - have, 0)
    if missing * _SPACE_MARGIN > free:
        raise DataError(
            f"--cache disk: the decoded images need {needed / 1e9:.1f} GB in {root} "
            f"({have / 1e9:.1f} GB cached already) and only {free / 1e9:.1f} GB is free there; free "
            f"space, give --cache-dir on a larger volume, or drop --cache disk"
        )
    return (
        f"--cache disk: decoded images in {root}: {needed / 1e9:.2f} GB in all, {have / 1e9:.2f} GB cached "
        f"already, {free / 1e9:.1f} GB free"
    )
