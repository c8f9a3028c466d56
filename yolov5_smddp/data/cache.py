"""Our label cache, and the release's foreign one.

Ours is an NPZ of plain arrays (no object arrays; read with allow_pickle=False) and lives ONLY in the
cache folder (`default_cache_dir()` or --cache-dir; never under a dataset). Paths in it are RELATIVE to
the dataset root and its file name is keyed by content, `yolov5-smddp-<sources>-<content>.labelcache.npz`:
<sources> digests the image sources relative to the root, <content> the relative image paths, every
image's size in bytes and content mark (data/content_mark: its size and both ends), a hash of every label file, the class count, the pixel limit and the format
version. So a cache built on a laptop is found again when the data is mounted elsewhere, two datasets
never share a file, and an edited dataset gets a new file (the one it replaces is reported as stale and
removed when it was built for the same root). A loaded cache is still checked against the files.

Concurrency: a cache is written to a unique temporary file in the target folder and moved into place
with os.replace, which is atomic on POSIX file systems. Several ranks or nodes building at once each
write a complete file and the last rename wins; a reader sees an old complete file or a new complete
one, never a mix, and any of them is equally valid for the same data.

The release's cache (`<labels folder>.cache` or `<list file>.cache`) is a pickled dict written with
np.save: it is never unpickled normally. It is only inspected with the allow-listed unpickler in
`safe_pickle` to say which absolute paths it was built for, then ignored.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from yolov5_smddp.data.safe_pickle import UnsafePickle, inspect_pickle
from yolov5_smddp.files.atomic import atomic_write

CACHE_VERSION = 4  # 2: pixel limit and header checks for BMP/TIFF/WebP/PFM; 3: zero-area boxes dropped;
# 4: each image's content mark
CACHE_SUFFIX = ".labelcache.npz"
CACHE_FOLDER_NAME = "yolov5-smddp"
_META_KEY = "meta"


@dataclass(kw_only=True)
class ScanTable:
    """Per image/label pair scan results in columns (N pairs, M label rows in all) — what the cache holds."""

    images: list[str]
    """Image paths relative to the dataset root (posix separators)."""
    image_bytes: np.ndarray
    """int64 [N] image file sizes."""
    label_hashes: list[str]
    """[N] content hash of each label file; '' when the label file does not exist."""
    shapes: np.ndarray
    """int32 [N, 2] (h, w) as decoded; (0, 0) for unusable images."""
    flags: np.ndarray
    """uint8 [N] bit set of PairFlag values."""
    reasons: list[str]
    """[N] why a pair is unusable or was changed ('' when neither); the file it is about is in flags."""
    counts: np.ndarray
    """int32 [N] number of label rows per pair."""
    labels: np.ndarray
    """float32 [M, 5] (cls, xc, yc, w, h) normalised, pairs' rows one after another."""
    image_marks: list[str] = field(default_factory=list)
    """[N] content mark of each image (data/content_mark); '' when it could not be read."""


def label_hash(data: bytes) -> str:
    """Content hash of a label file (16 hex digits)."""
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _example(items: list[str]) -> str:
    return f"{len(items)} (e.g. {items[0]})"


def stale_reason(
    cached: ScanTable,
    images: list[str],
    image_bytes: np.ndarray,
    label_hashes: list[str],
    image_marks: list[str] | None = None,
) -> str | None:
    """Why `cached` does not describe the current files (relative paths, sizes, label hashes, and the
    images' content marks when given), or None."""
    if cached.images != images:
        old, new = set(cached.images), set(images)
        added, removed = sorted(new - old), sorted(old - new)
        parts = []
        if added:
            parts.append(f"{_example(added)} images added")
        if removed:
            parts.append(f"{_example(removed)} images removed or moved")
        return ", ".join(parts) or "image order changed"
    resized = [images[i] for i in np.flatnonzero(cached.image_bytes != image_bytes)]
    if resized:
        return f"{_example(resized)} images changed size"
    if image_marks is not None:
        old_marks = cached.image_marks if len(cached.image_marks) == len(images) else [None] * len(images)
        changed = [images[i] for i, (a, b) in enumerate(zip(old_marks, image_marks)) if a != b]
        if changed:
            return f"{_example(changed)} images changed content"
    edited = [images[i] for i, (a, b) in enumerate(zip(cached.label_hashes, label_hashes)) if a != b]
    if edited:
        return f"labels of {_example(edited)} images edited, added or removed"
    return None


def save_cache(path: Path, table: ScanTable, *, root: Path) -> None:
    """Write `table` to `path` atomically (unique temp file in the same folder + os.replace)."""
    meta = {"format": "yolov5-smddp-labels", "version": CACHE_VERSION, "built_under": str(root)}
    with atomic_write(path) as f:
        np.savez(
            f,
            meta=np.array(json.dumps(meta)),
            images=np.array(table.images, dtype=str),
            image_bytes=table.image_bytes.astype(np.int64),
            label_hashes=np.array(table.label_hashes, dtype=str),
            shapes=table.shapes.astype(np.int32),
            flags=table.flags.astype(np.uint8),
            reasons=np.array(table.reasons, dtype=str),
            counts=table.counts.astype(np.int32),
            labels=table.labels.astype(np.float32).reshape(-1, 5),
            image_marks=np.array(table.image_marks, dtype=str),
        )


class CacheRejected(Exception):
    """Our cache exists but cannot be used; the message is the one-line reason."""


def load_cache(path: Path) -> ScanTable:
    """Read our cache (allow_pickle=False). Raises CacheRejected when unreadable or another version."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(str(npz[_META_KEY]))
            if meta.get("format") != "yolov5-smddp-labels" or meta.get("version") != CACHE_VERSION:
                raise CacheRejected(
                    f"format version {meta.get('version')!r}, this build reads {CACHE_VERSION}"
                )
            return ScanTable(
                images=npz["images"].tolist(),
                image_bytes=npz["image_bytes"],
                label_hashes=npz["label_hashes"].tolist(),
                shapes=npz["shapes"],
                flags=npz["flags"],
                reasons=npz["reasons"].tolist(),
                counts=npz["counts"],
                labels=npz["labels"].reshape(-1, 5),
                image_marks=npz["image_marks"].tolist(),
            )
    except CacheRejected:
        raise
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        raise CacheRejected(f"unreadable ({type(exc).__name__}: {exc})") from None


def default_cache_dir(environ: Mapping[str, str], home: Path) -> Path:
    """The host's cache folder: $XDG_CACHE_HOME/yolov5-smddp when XDG_CACHE_HOME is an absolute path
    (the XDG rule: a relative one is ignored), else <home>/.cache/yolov5-smddp."""
    xdg = environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else home / ".cache"
    return base / CACHE_FOLDER_NAME


def choose_cache_dir(
    given: str | Path | None,
    *,
    job_default: Path | None = None,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> Path:
    """THE choice of the cache folder (label and COCO caches, the embedded dataset, the pixel and
    restart-marker caches, the rebased data.yaml): `given` (--cache-dir) when set; else `job_default` (a
    SageMaker job's: its warm-pool cache or local temporary folder, `SageMakerEnv.cache_dir`); else the
    user's (`default_cache_dir` of `environ`, default os.environ, and `home`, default the user's home)."""
    if given:
        return Path(given)
    if job_default is not None:
        return job_default
    return default_cache_dir(os.environ if environ is None else environ, home or Path.home())


def sources_digest(rel_sources: list[str]) -> str:
    """12 hex digits naming a dataset split by its sources relative to the root (survives relocation)."""
    return hashlib.blake2b(
        "\n".join(rel_sources).encode("utf-8", "surrogateescape"), digest_size=6
    ).hexdigest()


def content_digest(
    images: list[str],
    image_bytes: np.ndarray,
    label_hashes: list[str],
    *,
    nc: int,
    max_pixels: int,
    image_marks: list[str] | None = None,
) -> str:
    """16 hex digits over everything a scan result depends on (see the module docstring)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"v{CACHE_VERSION} nc={nc} max_pixels={max_pixels}\n".encode())
    h.update("\n".join(images).encode("utf-8", "surrogateescape"))
    h.update(np.ascontiguousarray(image_bytes, dtype="<i8").tobytes())
    h.update("\n".join(label_hashes).encode())
    if image_marks is not None:
        h.update(("\n" + "\n".join(image_marks)).encode())
    return h.hexdigest()


def cache_file_name(sources: str, content: str) -> str:
    return f"yolov5-smddp-{sources}-{content}{CACHE_SUFFIX}"


def sibling_caches(folder: Path, sources: str, *, exclude: Path) -> list[Path]:
    """Our other caches in `folder` for the same sources (older contents, or another dataset laid out
    the same way), excluding `exclude`."""
    return sorted(p for p in folder.glob(cache_file_name(sources, "*")) if p != exclude)


def built_under(path: Path) -> str | None:
    """The absolute root a cache of ours was built under, None when it is unreadable."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            return json.loads(str(npz[_META_KEY])).get("built_under")
    except (OSError, ValueError, KeyError, AttributeError, json.JSONDecodeError):
        return None


def describe_foreign_cache(path: Path) -> str:
    """One line about a release-format cache: what it was built for, inspected without executing it."""
    try:
        data = path.read_bytes()
        payload = _npy_payload(data)
        obj = inspect_pickle(payload)
        if isinstance(obj, np.ndarray) and obj.dtype == object and obj.shape == ():
            obj = obj.item()  # np.save wraps the dict in a 0-d object array
    except (OSError, ValueError, UnsafePickle) as exc:
        return f"{path}: release-format label cache ignored (never unpickled); it could not be inspected safely: {exc}"
    if not isinstance(obj, dict):
        return f"{path}: release-format label cache ignored (never unpickled); not a dict"
    image_keys = [k for k in obj if isinstance(k, str) and k not in ("hash", "version", "msgs", "results")]
    built_for = os.path.commonpath(image_keys) if image_keys else "no images"
    if image_keys and len(image_keys) == 1:
        built_for = os.path.dirname(built_for)
    return (
        f"{path}: release-format label cache ignored (it is a pickle, never loaded); built for {built_for} "
        f"({len(image_keys)} images, version {obj.get('version')!r}); this run verifies the labels itself"
    )


def _npy_payload(data: bytes) -> bytes:
    """The bytes after an .npy header (np.save of a pickled object keeps the pickle there)."""
    stream = io.BytesIO(data)
    major, _minor = npy_format.read_magic(stream)
    if major == 1:
        npy_format.read_array_header_1_0(stream)
    else:
        npy_format.read_array_header_2_0(stream)
    return data[stream.tell() :]
