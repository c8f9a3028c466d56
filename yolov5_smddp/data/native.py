"""The loader's small C library (native.c): loaded once per process with ctypes, or None.

`pip install` builds it into this package (setup.py; the image installs the package the same way), so the
library this process loads (`library_path()`) is, in order: $YOLOV5_SMDDP_NATIVE_LIB; the one beside this
file (an installed package, or an in-place build); the installed package's, found on sys.path (a source
checkout on PYTHONPATH in front of an installed package, as the test image runs); `LEGACY_LIBRARY`, where
images built before the package built it hold it. Every user of it checks its pixels against OpenCV once
per process before relying on it (`jpeg_roi.region_decoder`, `augment.color_lut`) and falls back to OpenCV
otherwise, so an install without the library (YOLOV5_SMDDP_NO_NATIVE=1 at install time), or with a libjpeg
other than OpenCV's, trains on the same pixels, only slower.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

LIBRARY_NAME = "libyolov5_smddp_native.so"  # setup.py builds it beside this file
PACKAGE_LIBRARY = Path(__file__).resolve().parent / LIBRARY_NAME
LEGACY_LIBRARY = Path("/opt/yolov5-smddp/lib") / LIBRARY_NAME  # the Dockerfile's own build, before setup.py
LIBRARY_ENV = "YOLOV5_SMDDP_NATIVE_LIB"
ABI = 3

_loaded: dict[str, object] = {}  # "lib": the library or None, "why": the reason it is None


def library_candidates(search_path: Sequence[str]) -> list[Path]:
    """Where the library may be, in the order `library_path()` tries them: beside this file, in each
    `search_path` entry's yolov5_smddp/data/ (an installed package behind a source checkout), then
    `LEGACY_LIBRARY`."""
    installed = [
        Path(entry or ".").resolve() / "yolov5_smddp" / "data" / LIBRARY_NAME for entry in search_path
    ]
    return list(dict.fromkeys([PACKAGE_LIBRARY, *installed, LEGACY_LIBRARY]))


def library_path() -> Path:
    """The library this process loads: $YOLOV5_SMDDP_NATIVE_LIB, else the first of `library_candidates`
    that exists, else the package's own (absent: the reason `why_not()` gives names it)."""
    named = os.environ.get(LIBRARY_ENV)
    if named:
        return Path(named)
    return next((p for p in library_candidates(sys.path) if p.is_file()), PACKAGE_LIBRARY)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    c_int, c_long, c_void_p = ctypes.c_int, ctypes.c_long, ctypes.c_void_p
    lib.yv5_roi_abi.restype, lib.yv5_roi_abi.argtypes = c_int, []
    lib.yv5_roi_decode.restype = c_int
    lib.yv5_roi_decode.argtypes = [
        ctypes.c_char_p,
        ctypes.c_ulong,
        c_int,
        c_int,
        ctypes.POINTER(c_int),
        c_void_p,
        c_long,
    ]
    lib.yv5_rst_transcode.restype = c_int
    lib.yv5_rst_transcode.argtypes = [
        ctypes.c_char_p,
        ctypes.c_ulong,
        c_int,
        c_int,
        ctypes.POINTER(c_void_p),
        ctypes.POINTER(ctypes.c_ulong),
    ]
    lib.yv5_rst_decode.restype = c_int
    lib.yv5_rst_decode.argtypes = [
        c_void_p,
        ctypes.c_ulong,
        c_int,
        c_int,
        ctypes.POINTER(c_int),
        c_void_p,
        c_long,
        c_void_p,
        ctypes.c_ulong,
    ]
    lib.yv5_free.restype, lib.yv5_free.argtypes = None, [c_void_p]
    lib.yv5_lut3_flip.restype = c_int
    lib.yv5_lut3_flip.argtypes = [c_void_p, c_long, c_void_p, c_long, c_int, c_int, c_void_p, c_int, c_int]
    return lib


def _open(path: Path) -> ctypes.CDLL:
    """ctypes.CDLL(path): a plain dlopen. The library carries its own static libjpeg-turbo with the symbols
    hidden (setup.py), so whatever libjpeg the process already holds (pip's torchvision bundles an older
    libjpeg.so.62) is never bound to it, and no second libc is mapped: one link-map namespace."""
    return ctypes.CDLL(str(path))


def _not_built_because() -> str:
    if os.environ.get(LIBRARY_ENV):
        return f"named by ${LIBRARY_ENV}"
    return (
        "nor in an installed yolov5_smddp on sys.path: installed with YOLOV5_SMDDP_NO_NATIVE=1, "
        "or a source checkout, where `pip install .` builds it"
    )


def library() -> ctypes.CDLL | None:
    """The loaded library, or None (the reason in `why_not()`); loaded on the first call."""
    if "lib" not in _loaded:
        path = library_path()
        try:
            if not path.exists():
                raise OSError(f"{path} not found ({_not_built_because()})")
            lib = _declare(_open(path))
            abi = lib.yv5_roi_abi()
            if abi != ABI:
                raise OSError(f"{path}: ABI {abi}, this code expects {ABI}")
            _loaded.update(lib=lib, why="")
        except (OSError, AttributeError) as exc:  # OSError names the file
            _loaded.update(lib=None, why=f"cannot load the library: {exc}")
    return _loaded["lib"]  # type: ignore[return-value]


def why_not() -> str:
    """Why `library()` is None ("" when it loaded)."""
    library()
    return str(_loaded["why"])


def checked(
    state: dict,
    key: str,
    check: Callable[[ctypes.CDLL], str | None],
    off: str,
    logger: logging.Logger,
    base: Callable[[], ctypes.CDLL | None] | None = None,
) -> ctypes.CDLL | None:
    """The library for one use of it, decided once per process and kept in `state[key]`: `base()` (default:
    `library()`) when `check(lib)` returns None (its pixels are OpenCV's), else None with one log line,
    `off` formatted with the reason, on the caller's `logger` (a check that raises is a failed check; no library: `why_not()`;
    a `base` that gave None has said why itself)."""
    if key in state:
        return state[key]
    lib = (base or library)()
    if lib is None:
        problem = why_not() if base is None else None
    else:
        try:
            problem = check(lib)
        except Exception as exc:  # an OpenCV without a flag a check uses, a library that crashes: off
            problem = f"self-check failed: {type(exc).__name__}: {exc}"
        if problem is not None:
            lib = None
    if problem:
        logger.info(off, problem)
    state[key] = lib
    return lib


def lut3_flip(lib: ctypes.CDLL, src, dst, table, flip_lr: bool, flip_ud: bool) -> None:
    """dst = cv2.LUT(src, table), flipped left-right and/or up-down, in one pass (`yv5_lut3_flip`).

    src, dst: uint8 [h, w, 3] of the same shape with packed pixels (rows may be strided), not
    overlapping; table: uint8 [256, 1, 3] (cv2.LUT's 3-channel table), C-contiguous."""
    import numpy as np

    for name, a in (("src", src), ("dst", dst)):
        if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3 or a.strides[1:] != (3, 1):
            raise ValueError(f"{name} must be uint8 [h, w, 3] with packed pixels, got {a.dtype} {a.strides}")
    if src.shape != dst.shape:
        raise ValueError(f"src {src.shape} and dst {dst.shape} differ")
    if table.dtype != np.uint8 or table.size != 768 or not table.flags.c_contiguous:
        raise ValueError("table must be a C-contiguous uint8 [256, 1, 3] array")
    if np.shares_memory(src, dst):
        raise ValueError("src and dst overlap")
    h, w = src.shape[:2]
    lib.yv5_lut3_flip(
        src.ctypes.data,
        src.strides[0],
        dst.ctypes.data,
        dst.strides[0],
        h,
        w,
        table.ctypes.data,
        flip_lr,
        flip_ud,
    )
