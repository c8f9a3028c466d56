"""The one place a user's image file is decoded: every decoder failure becomes an ImageProblem.

The file is read into memory in one call and decoded with `cv2.imdecode`, not `cv2.imread`: the same
pixels (EXIF orientation applied the same way, also at reduced DCT scale; tests/unit/test_data_decode.py)
and ~6% less time per 640x480 JPEG, since `imread` opens the file twice and libjpeg then reads it through
stdio in 4 KB chunks (docs/PERFORMANCE.md, "Decode"). The release decodes the same way (its `cv2.imread`
is `imdecode` of the file's bytes).

OpenCV reports a bad file in two ways: `imdecode` returns None (unknown format, corrupt data), or it
raises `cv2.error` (e.g. `pixels <= CV_IO_MAX_IMAGE_PIXELS` for a header that claims more than 2^30
pixels, or an allocation failure). Both, and a MemoryError, become `ImageProblem(reason)`, so a caller
can say "skipped: <path>: <reason>" and go on with the next file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from yolov5_smddp.files.bounded_read import UnreadableFile, open_regular

if TYPE_CHECKING:
    import cv2
    import numpy as np


class ImageProblem(Exception):
    """An image that cannot be used; the message is the reason."""


def _opencv_reason(exc: cv2.error) -> str:
    """The useful part of an OpenCV error: "(-215:Assertion failed) pixels <= ... in function '...'"."""
    text = " ".join(str(exc).split())
    _, found, tail = text.partition(" error: ")
    return tail if found else text


def read_bytes(path: Path | str) -> bytes:
    """The whole file in one read. Raises ImageProblem when it cannot be read, is empty or is not a regular
    file (a FIFO or a device is never opened)."""
    try:
        with open_regular(path) as f:
            data = f.read()
    except UnreadableFile as exc:
        raise ImageProblem(str(exc)) from None
    except OSError as exc:
        raise ImageProblem(f"cannot read the file: {exc.strerror or exc}") from None
    if not data:
        raise ImageProblem("empty file (0 bytes)")
    return data


def decode_image(path: Path | str, flag: int | None = None) -> np.ndarray:
    """BGR uint8 [h, w, 3] of `path` decoded with the cv2.IMREAD_* `flag` (a colour flag: IMREAD_COLOR,
    the default, or IMREAD_REDUCED_COLOR_*). Raises ImageProblem with the reason when the file cannot be
    decoded."""
    import cv2  # here, not at the top: importing OpenCV takes seconds and `--help` paths import this module
    import numpy as np

    flag = cv2.IMREAD_COLOR if flag is None else flag
    data = read_bytes(path)
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    except cv2.error as exc:
        raise ImageProblem(f"decoder error: {_opencv_reason(exc)}") from None
    except MemoryError:
        raise ImageProblem("out of memory while decoding") from None
    if img is None:
        raise ImageProblem("unreadable image (OpenCV cannot decode it)")
    if img.dtype != "uint8" or img.ndim != 3 or img.shape[2] != 3:
        raise ImageProblem(f"decoded to an unexpected array ({img.dtype}, shape {img.shape})")
    return img
