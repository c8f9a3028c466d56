"""Our label cache, and the release's foreign one.

Ours is an NPZ of plain arrays (no object arrays; read with allow_pickle=False). Paths in it are
RELATIVE to the dataset root, so a cache built on a laptop stays valid when the data is mounted
elsewhere. It is valid only when the format version, the relative image paths, every image's size in
bytes and a content hash of every label file all match; anything else rejects it with one reason.

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from yolov5_smddp.atomic import atomic_write
from yolov5_smddp.data.safe_pickle import UnsafePickle, inspect_pickle

CACHE_VERSION = 1
CACHE_SUFFIX = ".labelcache.npz"
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


def label_hash(data: bytes) -> str:
    """Content hash of a label file (16 hex digits)."""
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _example(items: list[str]) -> str:
    return f"{len(items)} (e.g. {items[0]})"


def stale_reason(
    cached: ScanTable, images: list[str], image_bytes: np.ndarray, label_hashes: list[str]
) -> str | None:
    """Why `cached` does not describe the current files (relative paths, sizes, label hashes), or None."""
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
            )
    except CacheRejected:
        raise
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        raise CacheRejected(f"unreadable ({type(exc).__name__}: {exc})") from None


def cache_file_name(rel_sources: list[str], salt: str = "") -> str:
    """A file name from the sources relative to the root (so it survives relocation) plus `salt`
    (the absolute root for the machine-local cache folder, where unrelated datasets meet)."""
    digest = hashlib.blake2b("\n".join([salt, *rel_sources]).encode(), digest_size=6).hexdigest()
    return f"yolov5-smddp-{digest}{CACHE_SUFFIX}"


def is_writable_dir(folder: Path) -> bool:
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


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
