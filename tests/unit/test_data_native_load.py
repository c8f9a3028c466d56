"""native.library() loads the library that `pip install` built into the package (setup.py), found beside
native.py or in the installed package behind a source checkout, and loads it whatever was imported first:
pip's torchvision (the DLC's) brings an older libjpeg.so.62 that the dynamic linker would hand to a library
linked to the system's (no jpeg_skip_scanlines), so ours carries a static libjpeg-turbo of its own and the
process keeps one libc (the dlmopen fallback it replaces mapped a second one)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from native_part import installed_library

from yolov5_smddp.data import native

REPO = Path(__file__).resolve().parent.parent.parent

_AFTER_TORCHVISION = """
import json, os
import torchvision.io  # torchvision's image library (and the libjpeg it bundles) loaded, as in a training
from yolov5_smddp.data import jpeg_roi, native
libcs = [line.split()[-1] for line in open("/proc/self/maps") if line.split()[1][2] == "x"
         and os.path.basename(line.split()[-1]).startswith(("libc.so", "libc-"))]
print(json.dumps({"why_not": native.why_not(), "region": jpeg_roi.region_decoder() is not None,
                  "restarts": jpeg_roi.restart_decoder() is not None, "executable libc mappings": len(libcs)}))
"""


def test_the_library_loads_and_passes_its_checks_after_torchvision(tmp_path):
    installed_library()
    proc = subprocess.run(
        [sys.executable, "-c", _AFTER_TORCHVISION],
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "why_not": "",
        "region": True,
        "restarts": True,
        "executable libc mappings": 1,
    }


def test_other_load_errors_are_not_retried(tmp_path):
    broken = tmp_path / "not_a_library.so"
    broken.write_bytes(b"not an ELF file")
    with pytest.raises(OSError, match="not_a_library.so"):
        native._open(broken)


_INSTALLED_ONLY = """
import json, yolov5_smddp
from yolov5_smddp.data import native
print(json.dumps({"package": yolov5_smddp.__file__, "library": str(native.library_path()),
                  "why_not": native.why_not()}))
"""


def test_the_installed_package_loads_its_own_library(tmp_path):
    """A plain install (no source checkout on the path): the library is the package's own file."""
    expected = installed_library()
    proc = subprocess.run(
        [sys.executable, "-c", _INSTALLED_ONLY],
        env={"PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    package_dir = Path(got["package"]).resolve().parent
    assert Path(got["library"]) == package_dir / "data" / native.LIBRARY_NAME == expected
    assert got["why_not"] == ""


def test_a_source_checkout_loads_the_installed_packages_library(monkeypatch):
    """This process (the source checkout first on sys.path, as the test image runs) loads the installed
    package's file: the library the install built, not one a Dockerfile put elsewhere."""
    expected = installed_library()
    monkeypatch.delenv(native.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(native, "_loaded", {})
    assert native.library_path() == expected
    assert native.library() is not None and native.why_not() == ""


def test_candidates_in_order(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "PACKAGE_LIBRARY", tmp_path / "pkg" / native.LIBRARY_NAME)
    monkeypatch.setattr(native, "LEGACY_LIBRARY", tmp_path / "opt" / native.LIBRARY_NAME)
    site = [str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "a")]
    assert native.library_candidates(site) == [
        tmp_path / "pkg" / native.LIBRARY_NAME,
        tmp_path / "a" / "yolov5_smddp" / "data" / native.LIBRARY_NAME,
        tmp_path / "b" / "yolov5_smddp" / "data" / native.LIBRARY_NAME,
        tmp_path / "opt" / native.LIBRARY_NAME,
    ]


def test_the_first_existing_candidate_is_loaded_and_the_variable_wins(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "PACKAGE_LIBRARY", tmp_path / "pkg" / native.LIBRARY_NAME)
    monkeypatch.setattr(native, "LEGACY_LIBRARY", tmp_path / "opt" / native.LIBRARY_NAME)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "a"), str(tmp_path / "b")])
    monkeypatch.delenv(native.LIBRARY_ENV, raising=False)
    assert native.library_path() == tmp_path / "pkg" / native.LIBRARY_NAME  # none exists: the package's
    legacy = tmp_path / "opt" / native.LIBRARY_NAME
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(b"")
    assert native.library_path() == legacy
    installed = tmp_path / "b" / "yolov5_smddp" / "data" / native.LIBRARY_NAME
    installed.parent.mkdir(parents=True)
    installed.write_bytes(b"")
    assert native.library_path() == installed
    monkeypatch.setenv(native.LIBRARY_ENV, str(tmp_path / "named.so"))
    assert native.library_path() == tmp_path / "named.so"


def test_no_library_anywhere_says_how_to_get_one(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "PACKAGE_LIBRARY", tmp_path / "pkg" / native.LIBRARY_NAME)
    monkeypatch.setattr(native, "LEGACY_LIBRARY", tmp_path / "opt" / native.LIBRARY_NAME)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "a")])
    monkeypatch.delenv(native.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(native, "_loaded", {})
    assert native.library() is None
    assert native.why_not() == (
        f"cannot load the library: {tmp_path / 'pkg' / native.LIBRARY_NAME} not found (nor in an installed "
        "yolov5_smddp on sys.path: installed with YOLOV5_SMDDP_NO_NATIVE=1, or a source checkout, where "
        "`pip install .` builds it)"
    )
