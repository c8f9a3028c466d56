"""sagemaker/handback: after a plain `docker run` with YOLOV5_SMDDP_OWNER=UID:GID the output folders belong
to that host user; never files of someone else, never through a link; nothing without the variable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from yolov5_smddp.errors import ConfigError
from yolov5_smddp.sagemaker.handback import Owner, hand_back, output_folders, requested_owner


def test_the_owner_comes_from_the_variable():
    assert requested_owner({"YOLOV5_SMDDP_OWNER": "1000:1001"}) == Owner(1000, 1001)
    assert requested_owner({"YOLOV5_SMDDP_OWNER": " 0:0 "}) == Owner(0, 0)
    assert requested_owner({}) is None and requested_owner({"YOLOV5_SMDDP_OWNER": ""}) is None


@pytest.mark.parametrize("value", ["1000", "me:me", "1000:", ":1000", "-1:5", "1000:1000:1"])
def test_a_bad_owner_names_the_variable_and_the_value(value: str):
    with pytest.raises(ConfigError, match=f"YOLOV5_SMDDP_OWNER={value!r}: expected UID:GID"):
        requested_owner({"YOLOV5_SMDDP_OWNER": value})


def test_the_output_folders_follow_the_base_dir(tmp_path: Path):
    assert output_folders({}) == [Path("/opt/ml/model"), Path("/opt/ml/output"), Path("/opt/ml/checkpoints")]
    assert output_folders({"SAGEMAKER_BASE_DIR": str(tmp_path)})[1] == tmp_path / "output"


@pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root (as the container's ENTRYPOINT)")
def test_what_the_job_wrote_is_handed_back(tmp_path: Path):
    model, output = tmp_path / "model", tmp_path / "output"
    (model / "code").mkdir(parents=True)
    (output / "data").mkdir(parents=True)
    (model / "best.pt").write_bytes(b"w")
    (model / "code" / "inference.py").write_text("x")
    (output / "data" / "results.png").write_bytes(b"png")
    elsewhere = tmp_path / "elsewhere.txt"  # outside the folders, reached only through a link
    elsewhere.write_text("not ours to change")
    (output / "link").symlink_to(elsewhere)
    theirs = output / "someone-elses.txt"
    theirs.write_text("x")
    os.chown(theirs, 777, 777)
    changed, failed = hand_back([model, output, tmp_path / "checkpoints"], Owner(4321, 4322), from_uid=0)
    assert failed == 0 and changed == 8  # 2 folders, 2 sub-folders, 3 files, the link (not theirs)
    for path in (model, model / "code", model / "code" / "inference.py", model / "best.pt", output / "data"):
        assert (path.stat().st_uid, path.stat().st_gid) == (4321, 4322), path
    assert os.lstat(output / "link").st_uid == 4321
    assert elsewhere.stat().st_uid == 0  # the link was not followed
    assert theirs.stat().st_uid == 777  # someone else's file stays theirs
