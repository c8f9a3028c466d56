"""A last.pt that does not load (a spot reclaim mid-write on a file system without atomic rename, a
truncated upload) no longer ends every restart: the newest checkpoint that loads is resumed (epochN.pt, then
best.pt when it carries run state), with one line naming what was skipped and why."""

from __future__ import annotations

import logging
import shutil

import pytest

from tests.unit.test_resume import _checkpoint, _dirs
from yolov5_smddp.config.train_config import parse_train_args
from yolov5_smddp.errors import WeightsError
from yolov5_smddp.train import checkpoint, resumption


def _folder(tmp_path):
    """job/last.pt after epoch 3, with epoch2.pt (a copy after epoch 2) and best.pt (epoch 1) beside it."""
    argv = ["--cfg", "yolov5n", "--epochs", "5"]
    _checkpoint(tmp_path, argv, epoch=1, folder="job")
    folder = tmp_path / "job" / "checkpoints"
    shutil.copyfile(folder / "last.pt", folder / "best.pt")
    _checkpoint(tmp_path, argv, epoch=2, folder="job")
    shutil.copyfile(folder / "last.pt", folder / "epoch2.pt")
    last = _checkpoint(tmp_path, argv, epoch=3, folder="job")
    return folder, last, ["--checkpoint-dir", str(folder), *argv]


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_a_truncated_last_pt_resumes_from_the_newest_epoch_copy_with_one_line(tmp_path, caplog):
    folder, last, argv = _folder(tmp_path)
    assert checkpoint.load_resumable(folder)[::2] == (last, [])  # a good last.pt: resumed as before
    _truncate(last)
    (folder / "epoch1.pt").write_bytes(b"not a checkpoint")  # older: never tried before epoch2.pt
    with caplog.at_level(logging.INFO, logger="yolov5_smddp"):
        _, path, saved = resumption.resumable_checkpoint(parse_train_args(argv), _dirs(tmp_path, argv), True)
    assert path == folder / "epoch2.pt" and saved["epoch"] == 2
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resume:")]
    assert len(lines) == 1
    assert (
        lines[0].startswith("resume: last.pt skipped: last.pt (")
        and f"resuming from {path} (epoch 2)" in lines[0]
    )


def test_best_pt_with_run_state_when_no_copy_loads_and_the_error_when_nothing_does(tmp_path):
    folder, last, argv = _folder(tmp_path)
    _truncate(last)
    _truncate(folder / "epoch2.pt", 0.3)
    _, path, saved = resumption.resumable_checkpoint(parse_train_args(argv), _dirs(tmp_path, argv), True)
    assert path == folder / "best.pt" and saved["epoch"] == 1
    _truncate(folder / "best.pt")
    with pytest.raises(WeightsError, match="last.pt cannot be read safely"):
        resumption.resumable_checkpoint(parse_train_args(argv), _dirs(tmp_path, argv), True)
