"""Host memory allocator settings for training processes.

glibc's malloc serves large blocks (activations, gradients, decoded images) from fresh mmap()s and hands
them back to the kernel when they are freed, adjusting its thresholds as it goes. A CPU training step then
page-faults its working set in again every step: yolov5n, batch 8 at 320 px, took ~32,000 minor faults
per step (≈130 MB of fresh pages) and 275–290 ms; with a fixed mmap threshold of 32 MiB (glibc's largest
dynamic value) and a trim threshold of 256 MiB, freed blocks stay in the heap for the next step: ~0–200
faults and 167–210 ms per step on the same machine (docs/PERFORMANCE.md).

`tune_malloc()` sets both with mallopt(3) at process start. It does nothing when the user chose otherwise
(`YOLOV5_SMDDP_MALLOC=default`, or malloc tunables in GLIBC_TUNABLES) or when the C library is not glibc.
Forked DataLoader workers inherit the settings; the workers' init calls it too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping

M_TRIM_THRESHOLD = -1  # mallopt parameter numbers from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 256 * 2**20
OPT_OUT_VARIABLE = "YOLOV5_SMDDP_MALLOC"

_applied = False


def wanted(environ: Mapping[str, str]) -> bool:
    """False when the user opted out or configured glibc's malloc tunables themselves."""
    if environ.get(OPT_OUT_VARIABLE, "").strip().lower() == "default":
        return False
    return "glibc.malloc." not in environ.get("GLIBC_TUNABLES", "")


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None  # musl and others: leave their allocator alone
    return libc


def tune_malloc(environ: Mapping[str, str] | None = None) -> bool:
    """Fix glibc's mmap and trim thresholds (see the module doc). True when they are set (now or by an
    earlier call in this process); idempotent."""
    global _applied
    if _applied:
        return True
    if not wanted(os.environ if environ is None else environ):
        return False
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    ok = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    _applied = ok
    return ok
