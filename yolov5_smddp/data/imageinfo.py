"""Image size and a cheap integrity check without a full decode.

JPEG: the frame size from the first SOF marker, the EXIF orientation (OpenCV's imread rotates by it, so
sizes here are as decoded), and the end-of-image marker (a truncated file lacks it). PNG: the IHDR chunk
and the IEND chunk at the end. Other formats fall back to a full cv2 decode.
"""

from __future__ import annotations

import struct
from pathlib import Path

MIN_SIDE = 10
"""Images with a side shorter than this many pixels are rejected."""

_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_FIRST_READ = 4096
_HEAD_BYTES = 64 * 1024


class ImageProblem(Exception):
    """An image that cannot be used; the message is the reason."""


def _exif_orientation(app1: bytes) -> int:
    """Orientation tag (1..8) from an APP1 payload, 1 when absent or unreadable."""
    if not app1.startswith(b"Exif\x00\x00") or len(app1) < 14:
        return 1
    tiff = app1[6:]
    endian = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if endian is None:
        return 1
    try:
        (ifd_offset,) = struct.unpack(endian + "I", tiff[4:8])
        (count,) = struct.unpack(endian + "H", tiff[ifd_offset : ifd_offset + 2])
        for i in range(count):
            start = ifd_offset + 2 + 12 * i
            tag, _type, _n, value = struct.unpack(endian + "HHIH", tiff[start : start + 10])
            if tag == 0x0112:
                return value if 1 <= value <= 8 else 1
    except struct.error:
        return 1
    return 1


def _jpeg_size(head: bytes) -> tuple[int, int] | None:
    """(h, w) as OpenCV decodes it (EXIF-rotated), None when the header is not within `head`."""
    pos, orientation = 2, 1
    while pos + 4 <= len(head):
        if head[pos] != 0xFF:
            raise ImageProblem("corrupt JPEG header (no marker where one is expected)")
        marker = head[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
            continue
        (length,) = struct.unpack(">H", head[pos + 2 : pos + 4])
        if marker in _JPEG_SOF:
            if pos + 9 > len(head):
                return None
            h, w = struct.unpack(">HH", head[pos + 5 : pos + 9])
            return (w, h) if orientation >= 5 else (h, w)
        if marker == 0xE1 and orientation == 1:
            orientation = _exif_orientation(head[pos + 4 : pos + 2 + length])
        if marker == 0xDA:  # start of scan before any frame header
            raise ImageProblem("corrupt JPEG header (scan data before the frame header)")
        pos += 2 + length
    return None


def _decode_size(path: Path) -> tuple[int, int]:
    import cv2

    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        raise ImageProblem("unreadable image (OpenCV cannot decode it)")
    return int(img.shape[0]), int(img.shape[1])


def read_image_info(path: Path) -> tuple[tuple[int, int], int]:
    """((h, w) as decoded, size in bytes). Raises ImageProblem with the reason when unusable."""
    shape: tuple[int, int] | None = None
    try:
        with open(path, "rb") as f:
            size_bytes = f.seek(0, 2)
            if size_bytes == 0:
                raise ImageProblem("empty file (0 bytes)")
            f.seek(max(size_bytes - 12, 0))
            tail = f.read(12)
            f.seek(0)
            head = f.read(_FIRST_READ)
            if head[:2] == b"\xff\xd8":
                if not tail.endswith(b"\xff\xd9"):
                    raise ImageProblem("corrupt JPEG (truncated: no end-of-image marker)")
                shape = _jpeg_size(head)
                if shape is None and len(head) == _FIRST_READ:  # a large EXIF block before the frame header
                    shape = _jpeg_size(head + f.read(_HEAD_BYTES))
    except OSError as exc:
        raise ImageProblem(f"cannot be read: {exc.strerror or exc}") from exc

    if head[:8] == _PNG_SIGNATURE:
        if b"IEND" not in tail:
            raise ImageProblem("corrupt PNG (truncated: no IEND chunk)")
        if head[12:16] != b"IHDR":
            raise ImageProblem("corrupt PNG (no IHDR chunk)")
        w, h = struct.unpack(">II", head[16:24])
        shape = (h, w)
    if shape is None:  # other formats, or a JPEG whose frame header is beyond the bytes read
        shape = _decode_size(path)
    if min(shape) < MIN_SIDE:
        raise ImageProblem(f"too small ({shape[1]}x{shape[0]} px, sides must be >= {MIN_SIDE})")
    return shape, size_bytes
