"""The tests of the loader's native library (yolov5_smddp/data/native.c) take its checked parts through
`required`, and the installed package's library through `installed_library`. `pip install .` builds the
library into the package (setup.py), so wherever yolov5-smddp is installed a part that is None fails: the
library is missing from the install, does not load, or fails its self-check. They skip only where no
installed yolov5-smddp carries the library: an install made with YOLOV5_SMDDP_NO_NATIVE=1, or a source
checkout on PYTHONPATH that was never installed (CI runs neither: tests/skip_policy.py)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from yolov5_smddp.data import native

DISTRIBUTION = "yolov5-smddp"


def installed_libraries() -> tuple[list[Path], list[str]]:
    """(the library files that the installed yolov5-smddp distributions on sys.path list in their records,
    where each of those distributions is)."""
    libraries, where = [], []
    for dist in metadata.distributions(name=DISTRIBUTION):
        where.append(str(dist.locate_file("")))
        for file in dist.files or ():
            if file.name == native.LIBRARY_NAME:
                libraries.append(Path(dist.locate_file(file)).resolve())
    return libraries, where


def installed_library() -> Path:
    """The installed package's library file (it must exist), or skip as the module docstring says."""
    libraries, where = installed_libraries()
    if not libraries and where:
        pytest.skip(
            f"{DISTRIBUTION} is installed without its native library ({', '.join(where)}): installed with "
            "YOLOV5_SMDDP_NO_NATIVE=1"
        )
    if not libraries:
        pytest.skip(
            f"{DISTRIBUTION} is not installed (a source checkout): `pip install .` builds its native library"
        )
    missing = [str(p) for p in libraries if not p.is_file()]
    if missing:
        pytest.fail(f"the installed {DISTRIBUTION} lists {', '.join(missing)}, which is not there")
    return libraries[0]


def required(found):
    """`found` (a checked native part, or None), or fail / skip as the module docstring says."""
    if found is None and native.library_path().exists():
        pytest.fail(f"{native.library_path()} is there but fails to load or its self-check (see the log)")
    if found is None:
        installed_library()  # skips when nothing installed carries the library
        pytest.fail(f"the installed library is not found: native.library_path() is {native.library_path()}")
    return found
