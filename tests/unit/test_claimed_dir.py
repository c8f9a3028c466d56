"""A claimed folder (the checkpoint folder SageMaker mirrors to S3, the model folder): temporaries staged
outside it, a killed run's temporaries swept with one line, one run at a time, the staging folder gone at
the end; atomic_copy leaves the old file or the whole copy."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from yolov5_smddp.errors import OutputError
from yolov5_smddp.files import atomic, claimed_dir
from yolov5_smddp.files.atomic import atomic_copy, atomic_write


def test_a_write_into_a_claimed_folder_is_staged_beside_it_and_never_appears_inside(tmp_path: Path):
    folder = tmp_path / "checkpoints"
    seen_inside = []
    with claimed_dir.claim(folder) as staging:
        assert staging == tmp_path / ".checkpoints.staging"
        with atomic_write(folder / "last.pt") as handle:
            handle.write(b"state")
            seen_inside = sorted(p.name for p in folder.iterdir())
            staged = [p.name for p in staging.iterdir() if p.name != claimed_dir.LOCK]
        assert (folder / "last.pt").read_bytes() == b"state"
    assert seen_inside == []  # nothing in the synced folder while the file is written
    assert len(staged) == 1 and claimed_dir.TEMPORARY.match(staged[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]  # staging folder gone
    with atomic_write(folder / "other.pt") as handle:  # unclaimed again: next to the target as before
        handle.write(b"x")
        assert any(claimed_dir.TEMPORARY.match(p.name) for p in folder.iterdir())


def test_stale_temporaries_are_swept_at_the_claim_with_one_line(tmp_path: Path, caplog):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / ".last.pt.0123456789ab.tmp").write_bytes(b"half")
    (folder / "last.pt").write_bytes(b"whole")
    (folder / "notes.tmp").write_bytes(b"the user's")  # not our name: kept
    staging = tmp_path / ".checkpoints.staging"
    staging.mkdir()
    (staging / ".best.pt.abcdefabcdef.tmp").write_bytes(b"half")
    with caplog.at_level(logging.INFO, logger="yolov5_smddp"), claimed_dir.claim(folder):
        pass
    assert sorted(p.name for p in folder.iterdir()) == ["last.pt", "notes.tmp"]
    lines = [r.getMessage() for r in caplog.records if "temporary file" in r.getMessage()]
    assert (
        len(lines) == 1
        and "removed 2 temporary file(s)" in lines[0]
        and ".last.pt.0123456789ab.tmp" in lines[0]
    )
    assert not staging.exists()


def test_a_mount_point_stages_inside_in_a_hidden_folder_and_says_so(tmp_path: Path, caplog):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
        f"99 22 0:50 / {str(folder.resolve()).replace(' ', chr(92) + '040')} rw - tmpfs tmpfs rw\n"
    )
    assert claimed_dir.is_mount_point(folder, mountinfo)
    with (
        caplog.at_level(logging.INFO, logger="yolov5_smddp"),
        claimed_dir.claim(folder, mountinfo=mountinfo) as s,
    ):
        assert s == folder.resolve() / claimed_dir.SUBFOLDER
        with atomic_write(folder / "last.pt") as handle:
            handle.write(b"x")
    assert any("mount point of its own" in r.getMessage() for r in caplog.records)
    assert sorted(p.name for p in folder.iterdir()) == ["last.pt"]


def test_a_second_run_on_the_same_folder_is_refused_naming_the_owner(tmp_path: Path):
    folder = tmp_path / "checkpoints"
    holder = textwrap.dedent(
        f"""
        import sys, time
        from yolov5_smddp.files import atomic, claimed_dir
        with claimed_dir.claim({str(folder)!r}):
            print("held", flush=True)
            sys.stdin.read()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(
            OutputError, match=rf"another run \(pid {proc.pid}\) is writing this checkpoint folder"
        ):
            with claimed_dir.claim(folder):
                pass
    finally:
        proc.communicate("", timeout=30)
    with claimed_dir.claim(folder):  # free again once that run ended
        pass


def test_the_same_folder_named_twice_is_claimed_once(tmp_path: Path):
    with claimed_dir.claim_folders(
        [(tmp_path / "out", "checkpoint folder"), (tmp_path / "out", "model folder")]
    ):
        assert claimed_dir.staging_for(tmp_path / "out") is not None


def test_atomic_copy_leaves_the_old_file_or_the_whole_copy(tmp_path: Path, monkeypatch):
    source = tmp_path / "last.pt"
    source.write_bytes(b"n" * 3_000_000)
    target = tmp_path / "epoch3.pt"
    target.write_bytes(b"old")

    def copy_dies_halfway(handle_in, handle_out, length=0):
        handle_out.write(handle_in.read(1000))
        raise KeyboardInterrupt  # a kill (SIGTERM turned exception, a spot reclaim) mid-copy

    monkeypatch.setattr(atomic.shutil, "copyfileobj", copy_dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        atomic_copy(source, target)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch3.pt", "last.pt"]
    monkeypatch.undo()
    atomic_copy(source, target)
    assert target.read_bytes() == source.read_bytes()
