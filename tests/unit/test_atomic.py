"""atomic_write: the complete file or the old one, and the permissions a plain open() gives a new file
(the process umask applied to 0666), so a person other than the writer can read the outputs."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from yolov5_smddp.files.atomic import atomic_write


@pytest.fixture
def umask():
    """Set the umask for one test, restore it after."""
    previous = os.umask(0o022)
    yield lambda value: os.umask(value)
    os.umask(previous)


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600), (0, 0o666)])
def test_a_new_file_gets_the_umask_mode(tmp_path: Path, umask, mask: int, expected: int):
    umask(mask)
    target = tmp_path / "sub" / "metrics.json"
    with atomic_write(target, "w", encoding="utf-8") as handle:
        handle.write("{}\n")
    assert stat.S_IMODE(target.stat().st_mode) == expected
    assert target.read_text() == "{}\n"
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o777 & ~mask
    assert sorted(p.name for p in target.parent.iterdir()) == ["metrics.json"]  # no temporary left


def test_a_replaced_file_is_complete_and_a_failed_write_leaves_the_old_one(tmp_path: Path, umask):
    target = tmp_path / "best.pt"
    with atomic_write(target) as handle:
        handle.write(b"old")
    with pytest.raises(RuntimeError), atomic_write(target) as handle:
        handle.write(b"half of the new")
        raise RuntimeError("disk gone")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["best.pt"]
    with atomic_write(target) as handle:
        handle.write(b"new")
    assert target.read_bytes() == b"new" and stat.S_IMODE(target.stat().st_mode) == 0o644


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_another_user_can_read_what_root_wrote(umask):
    """As a person on the host would be: user 'nobody' (65534) reads a file root wrote with atomic_write."""
    folder = Path(tempfile.mkdtemp(prefix="atomic-"))
    try:
        folder.chmod(0o755)
        target = folder / "results.csv"
        with atomic_write(target, "w", encoding="utf-8") as handle:
            handle.write("epoch,mAP50\n1,0.5\n")
        reader = "import os, sys; os.setgid(65534); os.setuid(65534); print(open(sys.argv[1]).read(), end='')"
        done = subprocess.run([sys.executable, "-c", reader, str(target)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "epoch,mAP50\n1,0.5\n"
    finally:
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()
