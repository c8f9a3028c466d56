"""native.library() loads the library whatever was imported first: pip's torchvision (the DLC's) brings an
older libjpeg.so.62 that the dynamic linker would hand to our library (no jpeg_skip_scanlines), so the
region decoder was off in every process that imported torchvision first."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from yolov5_smddp.data import native

REPO = Path(__file__).resolve().parent.parent.parent

_AFTER_TORCHVISION = """
import json, torchvision
from yolov5_smddp.data import jpeg_roi, native
print(json.dumps({"why_not": native.why_not(), "region": jpeg_roi.region_decoder() is not None,
                  "restarts": jpeg_roi.restart_decoder() is not None}))
"""


def test_the_library_loads_and_passes_its_checks_after_torchvision(tmp_path):
    if not native.library_path().exists():
        pytest.skip(f"native library not built ({native.library_path()}): the Dockerfile builds it")
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
    }


def test_other_load_errors_are_not_retried(tmp_path):
    broken = tmp_path / "not_a_library.so"
    broken.write_bytes(b"not an ELF file")
    with pytest.raises(OSError, match="not_a_library.so"):
        native._open(broken)
