"""Image size from the file header, a cheap integrity check, and the pixel limit.

Headers read: JPEG (the first SOF marker, the EXIF orientation — OpenCV's imread rotates by it, so
sizes here are as decoded — and the end-of-image marker, which a truncated file lacks), PNG (IHDR, and
IEND at the end), BMP, TIFF (the first image directory), WebP (VP8, VP8L, VP8X) and PFM.

The size a header claims is checked against a pixel limit BEFORE anything is decoded: a PNG of a few KB
can claim 40000 x 40000 pixels (4.8 GB as BGR), and OpenCV itself refuses only above 2^30 pixels, with
an exception. JPEG and PNG are not decoded here; other formats are decoded once, after the limit check,
to verify them (a file whose header is not understood is decoded under OpenCV's own limit).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from yolov5_smddp.data.decode import ImageProblem, decode_image
from yolov5_smddp.files.bounded_read import UnreadableFile, open_regular

if TYPE_CHECKING:
    import numpy as np

MIN_SIDE = 10
"""Images with a side shorter than this many pixels are rejected by the label scan."""
DEFAULT_MAX_PIXELS = 2**27
"""134,217,728 pixels (e.g. 16384 x 8192): 384 MiB as a decoded BGR array, which every loader worker of
every rank may hold at once. Larger photos than this are rare in detection datasets (a 100 MP camera
frame passes; PIL's own bomb limit is 178,956,970), and OpenCV's hard limit is 2^30."""

_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_TIFF_SIGNATURES = (b"II*\x00", b"MM\x00*")
_FIRST_READ = 4096
_HEAD_BYTES = 64 * 1024
_TIFF_WIDTH, _TIFF_LENGTH = 256, 257
_TIFF_MAX_ENTRIES = 4096
_NOT_DECODED = ("jpeg", "png")  # formats whose header checks stand in for a decode


@dataclass(frozen=True)
class ImageHeader:
    """What the first bytes of a file say, without decoding it."""

    format: str
    """"jpeg", "png", "bmp", "tiff", "webp", "pfm", or "" when not recognised."""
    shape: tuple[int, int] | None
    """(h, w) the header claims (EXIF-rotated for JPEG); None when it cannot be read from the header."""
    size_bytes: int


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


def _png_size(head: bytes, tail: bytes) -> tuple[int, int]:
    if b"IEND" not in tail:
        raise ImageProblem("corrupt PNG (truncated: no IEND chunk)")
    if head[12:16] != b"IHDR" or len(head) < 24:
        raise ImageProblem("corrupt PNG (no IHDR chunk)")
    w, h = struct.unpack(">II", head[16:24])
    return h, w


def _bmp_size(head: bytes) -> tuple[int, int]:
    (dib_size,) = struct.unpack("<I", head[14:18])
    if dib_size == 12:  # OS/2 BITMAPCOREHEADER: 16-bit sides
        w, h = struct.unpack("<HH", head[18:22])
    else:
        w, h = struct.unpack("<ii", head[18:26])  # negative height: rows stored top-down
    return abs(h), abs(w)


def _tiff_size(f: BinaryIO, head: bytes) -> tuple[int, int] | None:
    """(h, w) of the first image directory (classic TIFF); None when a side tag is missing."""
    endian = "<" if head[:2] == b"II" else ">"
    (offset,) = struct.unpack(endian + "I", head[4:8])
    f.seek(offset)
    (count,) = struct.unpack(endian + "H", f.read(2))
    entries = f.read(12 * min(count, _TIFF_MAX_ENTRIES))
    sides: dict[int, int] = {}
    for start in range(0, len(entries) - 11, 12):
        tag, kind = struct.unpack(endian + "HH", entries[start : start + 4])
        if tag in (_TIFF_WIDTH, _TIFF_LENGTH) and kind in (3, 4):  # SHORT or LONG
            value_format = endian + ("H" if kind == 3 else "I")
            (sides[tag],) = struct.unpack_from(value_format, entries, start + 8)
    if len(sides) < 2:
        return None
    return sides[_TIFF_LENGTH], sides[_TIFF_WIDTH]


def _webp_size(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8 ":  # lossy: 14-bit sides after the key-frame start code
        w, h = struct.unpack("<HH", head[26:30])
        return h & 0x3FFF, w & 0x3FFF
    if chunk == b"VP8L":  # lossless: (w - 1) and (h - 1) in 14 bits each after the 0x2F signature
        (bits,) = struct.unpack("<I", head[21:25])
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    if chunk == b"VP8X":  # extended: 24-bit (canvas side - 1)
        w = int.from_bytes(head[24:27], "little") + 1
        h = int.from_bytes(head[27:30], "little") + 1
        return h, w
    return None


def _pfm_size(head: bytes) -> tuple[int, int] | None:
    fields = head[2:64].split()
    if len(fields) < 2:
        return None
    return int(fields[1]), int(fields[0])


def _parse(f: BinaryIO, head: bytes, tail: bytes) -> tuple[str, tuple[int, int] | None]:
    if head[:2] == b"\xff\xd8":
        if not tail.endswith(b"\xff\xd9"):
            raise ImageProblem("corrupt JPEG (truncated: no end-of-image marker)")
        shape = _jpeg_size(head)
        if shape is None and len(head) == _FIRST_READ:  # a large EXIF block before the frame header
            shape = _jpeg_size(head + f.read(_HEAD_BYTES))
        return "jpeg", shape
    if head[:8] == _PNG_SIGNATURE:
        return "png", _png_size(head, tail)
    if head[:2] == b"BM" and len(head) >= 26:
        return "bmp", _bmp_size(head)
    if head[:4] in _TIFF_SIGNATURES:
        return "tiff", _tiff_size(f, head)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp", _webp_size(head)
    if head[:2] in (b"PF", b"Pf") and head[2:3].isspace():
        return "pfm", _pfm_size(head)
    return "", None


def read_header(path: Path | str) -> ImageHeader:
    """The format and claimed size of `path` from its first bytes (and its last, for truncation).
    Raises ImageProblem for an empty, unreadable, truncated JPEG/PNG or malformed header."""
    try:
        with open_regular(path) as f:
            size_bytes = f.seek(0, 2)
            if size_bytes == 0:
                raise ImageProblem("empty file (0 bytes)")
            f.seek(max(size_bytes - 12, 0))
            tail = f.read(12)
            f.seek(0)
            head = f.read(_FIRST_READ)
            kind, shape = _parse(f, head, tail)
    except UnreadableFile as exc:
        raise ImageProblem(str(exc)) from None
    except OSError as exc:
        raise ImageProblem(f"cannot be read: {exc.strerror or exc}") from exc
    except (struct.error, ValueError) as exc:
        raise ImageProblem(f"corrupt image header ({exc})") from None
    return ImageHeader(kind, shape, size_bytes)


def check_pixels(shape: tuple[int, int], max_pixels: int) -> None:
    """Raise ImageProblem naming the claimed size when h * w exceeds `max_pixels`."""
    h, w = shape
    if h * w > max_pixels:
        raise ImageProblem(
            f"its header claims {w}x{h} px ({h * w:,} pixels), over the limit of {max_pixels:,} "
            f"(--max-image-pixels); not decoded"
        )


def read_image_info(path: Path | str, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[tuple[int, int], int]:
    """((h, w) as decoded, size in bytes) for the label scan. Raises ImageProblem with the reason when
    the image is unusable: unreadable, truncated, over `max_pixels`, undecodable or too small."""
    header = read_header(path)
    shape = header.shape
    if shape is not None:
        check_pixels(shape, max_pixels)
    if shape is None or header.format not in _NOT_DECODED:
        shape = decode_image(path).shape[:2]
        check_pixels(shape, max_pixels)  # a header not understood: the limit still decides, after the fact
    h, w = int(shape[0]), int(shape[1])
    if min(h, w) < MIN_SIDE:
        raise ImageProblem(f"too small ({w}x{h} px, sides must be >= {MIN_SIDE})")
    return (h, w), header.size_bytes


def decode_checked(path: Path | str, max_pixels: int, flag: int | None = None) -> np.ndarray:
    """BGR uint8 [h, w, 3] of `path`, its header checked against `max_pixels` first (predict, val).
    Raises ImageProblem with the reason instead of any decoder error."""
    header = read_header(path)
    if header.shape is not None:
        check_pixels(header.shape, max_pixels)
    return decode_image(path, flag)
