"""Test support for data tests: snapshots of dataset trees (to prove nothing was written under them)
and a corpus of awkward image files generated on the fly (no binaries in the repository).

`pyproject.toml` puts this folder on the test path: `from datatree import watch, write_bad_images`.
A test (or fixture) calls `watch(root)` once its dataset is written; tests/unit/conftest.py then fails
the test when anything under a watched root differs at its end (`verify_watched`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np

LABEL = "0 0.5 0.5 0.5 0.5\n"
BOMB_SIDE_PNG = 40000
BOMB_SIDE_JPEG = 60000
HUGE_HW = (1000, 1200)
"""A valid image of 1.2 million pixels: over a lowered --max-image-pixels (e.g. 1,000,000)."""


def tree_state(root: Path) -> dict[str, tuple]:
    """Every entry under `root` (itself included): relative path -> ("dir", mtime_ns) or
    ("file", size, sha256, mtime_ns). Equal states mean nothing was created, removed, renamed or written."""
    root = Path(root)
    state: dict[str, tuple] = {".": ("dir", root.stat().st_mtime_ns)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            info = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISDIR(info.st_mode):
                state[rel] = ("dir", info.st_mtime_ns)
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                state[rel] = ("file", info.st_size, digest, info.st_mtime_ns)
    return state


_WATCHED: dict[Path, tuple[dict[str, tuple], bool]] = {}


def watch(root: Path, *, persistent: bool = False) -> Path:
    """Record `root`'s tree now; `persistent` for datasets that module fixtures share between tests."""
    root = Path(root)
    _WATCHED[root] = (tree_state(root), persistent)
    return root


def refresh_watched() -> None:
    """A test's baseline for the shared (persistent) datasets: their trees as the test starts."""
    for root, (_, persistent) in list(_WATCHED.items()):
        if persistent and root.exists():
            _WATCHED[root] = (tree_state(root), True)


def verify_watched() -> list[Path]:
    """The watched roots whose tree changed since they were recorded; forgets the non-persistent ones."""
    changed = [root for root, (state, _) in _WATCHED.items() if root.exists() and tree_state(root) != state]
    for root in [r for r, (_, persistent) in _WATCHED.items() if not persistent]:
        del _WATCHED[root]
    return changed


def make_read_only(root: Path) -> None:
    """chmod -R a-w (root in a container still may write: check with tree_state as well)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            path.chmod(path.stat().st_mode & ~0o222)
    Path(root).chmod(Path(root).stat().st_mode & ~0o222)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bomb_png(side: int = BOMB_SIDE_PNG) -> bytes:
    """A complete, tiny PNG whose IHDR claims side x side RGB pixels."""
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", idat)
        + _png_chunk(b"IEND", b"")
    )


def _small_jpeg() -> bytes:
    ok, buf = cv2.imencode(".jpg", np.full((24, 32, 3), 90, np.uint8))
    assert ok
    return buf.tobytes()


def _sof_end(data: bytes) -> tuple[int, int]:
    pos = data.index(b"\xff\xc0")
    return pos, pos + 2 + struct.unpack(">H", data[pos + 2 : pos + 4])[0]


def bomb_jpeg(side: int = BOMB_SIDE_JPEG) -> bytes:
    """A small valid JPEG whose frame header is patched to claim side x side pixels."""
    data = bytearray(_small_jpeg())
    pos, _ = _sof_end(bytes(data))
    data[pos + 5 : pos + 9] = struct.pack(">HH", side, side)
    return bytes(data)


def scrambled_jpeg() -> bytes:
    """A JPEG with a valid frame header and end marker (the label scan accepts it) whose next segment is
    a Huffman table with an impossible index, so every decoder refuses it."""
    data = _small_jpeg()
    _, end = _sof_end(data)
    bad_dht = b"\xff\xc4\x00\x13\x7f" + b"\x00" * 16
    return data[:end] + bad_dht + b"\xff\xd9"


def _gradient(h: int, w: int) -> np.ndarray:
    ys, xs = np.mgrid[0:h, 0:w]
    return np.stack([xs * 255 // max(w - 1, 1), ys * 255 // max(h - 1, 1), (xs + ys) % 256], -1).astype(
        np.uint8
    )


def write_bad_images(images: Path, labels: Path) -> dict[str, Path]:
    """Write the corpus into `images` (each with a one-box label in `labels`); name -> image path.

    bomb.png / bomb.jpg: headers claim 40000x40000 / 60000x60000 (a few hundred bytes each);
    huge.jpg: valid 1200x1000; tiny.png: 1x1; cmyk.jpg: a CMYK JPEG (48x64); deep.tif: 16-bit RGB TIFF
    (48x64); truncated.jpg: the first half of a JPEG; scrambled.jpg: passes the scan, fails to decode.
    """
    from PIL import Image

    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    out = {name: images / name for name in ("bomb.png", "bomb.jpg", "huge.jpg", "tiny.png", "cmyk.jpg")}
    out |= {name: images / name for name in ("deep.tif", "truncated.jpg", "scrambled.jpg")}
    out["bomb.png"].write_bytes(bomb_png())
    out["bomb.jpg"].write_bytes(bomb_jpeg())
    cv2.imwrite(str(out["huge.jpg"]), _gradient(*HUGE_HW))
    cv2.imwrite(str(out["tiny.png"]), np.full((1, 1, 3), 200, np.uint8))
    Image.new("CMYK", (64, 48), (30, 120, 200, 10)).save(out["cmyk.jpg"])
    rng = np.random.default_rng(0)
    cv2.imwrite(str(out["deep.tif"]), rng.integers(0, 65535, (48, 64, 3), dtype=np.uint16))
    whole = cv2.imencode(".jpg", rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))[1].tobytes()
    out["truncated.jpg"].write_bytes(whole[: len(whole) // 2])
    out["scrambled.jpg"].write_bytes(scrambled_jpeg())
    for path in out.values():
        (labels / path.with_suffix(".txt").name).write_text(LABEL)
    return out
