"""The tests of the loader's native library (yolov5_smddp/data/native.c) take its checked parts through
`required`: a part that is None fails when the library file is there (it does not load or fails its
self-check) and skips only when the library was not built (the Dockerfile builds it)."""

from __future__ import annotations

import pytest

from yolov5_smddp.data import native


def required(found):
    """`found` (a checked native part, or None), or fail / skip as the module docstring says."""
    if found is None and native.library_path().exists():
        pytest.fail(f"{native.library_path()} is there but fails to load or its self-check (see the log)")
    if found is None:
        pytest.skip(f"native library not built ({native.library_path()}): the Dockerfile builds it")
    return found
