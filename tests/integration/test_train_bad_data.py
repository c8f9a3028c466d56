"""Real CLI runs on bad data: a read-only dataset holding every kind of awkward image file trains,
validates and predicts with one "skipped: <path>: <why>" line per bad file and nothing written under
the dataset; a loader worker killed mid-training and a training set smaller than one batch end the job
with a clear message (exit code 2)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from child_env import child_env
from datatree import make_read_only, tree_state, write_bad_images
from tiny_training import tiny_training

from yolov5_smddp.data.synthetic import make_default_dataset

pytestmark = pytest.mark.slow
TIMEOUT = 600
OVER = "over the limit of 1,000,000 (--max-image-pixels); not decoded"
SCAN_SKIPS = {
    "bomb.png": f"its header claims 40000x40000 px (1,600,000,000 pixels), {OVER}",
    "bomb.jpg": f"its header claims 60000x60000 px (3,600,000,000 pixels), {OVER}",
    "huge.jpg": f"its header claims 1200x1000 px (1,200,000 pixels), {OVER}",
    "tiny.png": "too small (1x1 px, sides must be >= 10)",
    "truncated.jpg": "corrupt JPEG (truncated: no end-of-image marker)",
}
UNDECODABLE = "unreadable image (OpenCV cannot decode it) (it passed the label scan)"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "yolov5_smddp", *args]


def _train_args(out: Path, data_yaml: Path, *extra: str) -> list[str]:
    return _cli(
        "train", *tiny_training(out, data_yaml, "--log-every", "1", *extra, batch_size=4, workers=None)
    )


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd)


def test_read_only_dataset_with_every_kind_of_bad_file_trains_validates_and_predicts(tmp_path):
    data = tmp_path / "data"
    data_yaml = make_default_dataset(data, n_train=17, n_val=6, imgsz=96, seed=2)
    corpus = {
        split: write_bad_images(data / "images" / split, data / "labels" / split)
        for split in ("train", "val")
    }
    make_read_only(data)
    before = tree_state(data)

    train = _run(
        _train_args(tmp_path, data_yaml, "--epochs", "1", "--workers", "1", "--max-image-pixels", "1000000"),
        tmp_path,
    )
    log = train.stdout + train.stderr
    assert train.returncode == 0, log[-4000:]
    for split in ("train", "val"):
        for name, reason in SCAN_SKIPS.items():
            assert f"skipped: {corpus[split][name]}: {reason}" in log, (split, name)
    assert f"skipped: {corpus['train']['scrambled.jpg']}: {UNDECODABLE}; another image takes its place" in log
    assert (
        f"skipped: {corpus['val']['scrambled.jpg']}: {UNDECODABLE}; left out of the validation metrics" in log
    )
    assert "training sample(s) of this pass hit an image that could not be decoded" in log
    assert "validation left out 1 of 9 images that could not be decoded" in log
    assert (tmp_path / "model" / "best.pt").is_file() and "epoch=1 epochs=1" in log
    assert list((tmp_path / "cache").glob("yolov5-smddp-*.labelcache.npz"))

    weights = str(tmp_path / "model" / "best.pt")
    val = _run(
        _cli("val", "--weights", weights, "--data", str(data_yaml), "--imgsz", "64", "--workers", "1")
        + ["--cache-dir", str(tmp_path / "cache"), "--max-image-pixels", "1000000"],
        tmp_path,
    )
    assert val.returncode == 0, (val.stdout + val.stderr)[-4000:]
    assert "images=8 skipped=6 " in val.stdout  # 14 val images: 5 refused by the scan, 1 undecodable

    predictions = tmp_path / "predictions"
    predict = _run(
        _cli(
            "predict",
            "--weights",
            weights,
            "--source",
            str(data / "images" / "val"),
            "--out",
            str(predictions),
        )
        + ["--imgsz", "64", "--max-image-pixels", "1000000"],
        tmp_path,
    )
    assert predict.returncode == 0, (predict.stdout + predict.stderr)[-4000:]
    assert (
        f"skipped: {corpus['val']['scrambled.jpg']}: unreadable image (OpenCV cannot decode it)"
        in predict.stdout
    )
    assert len(list(predictions.glob("*.json"))) == 6 + 3  # the good images, cmyk.jpg, deep.tif, tiny.png

    assert tree_state(data) == before  # root may write anywhere: the tree itself proves nothing was


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` and whose command line is the parent's (forked loader workers)."""
    parent = Path(f"/proc/{pid}/cmdline").read_bytes()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and (entry / "cmdline").read_bytes() == parent:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def test_a_loader_worker_killed_mid_training_ends_the_job_with_the_explanation(tmp_path):
    data_yaml = make_default_dataset(tmp_path / "data", n_train=64, n_val=4, imgsz=96, seed=1)
    proc = subprocess.Popen(
        _train_args(tmp_path, data_yaml, "--epochs", "3", "--workers", "2"),
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        for line in proc.stdout:
            if line.startswith("epoch=1 step=1 "):
                break
        workers = _children(proc.pid)
        assert workers, "no loader worker found"
        os.kill(workers[0], signal.SIGKILL)
        _out, err = proc.communicate(timeout=TIMEOUT)  # a job that hangs instead of ending fails here
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err[-3000:]
    assert "error: a DataLoader worker of rank 0 failed: DataLoader worker (pid" in err
    assert "--workers" in err and "/dev/shm: " in err and "Memory: " in err


def test_a_training_set_smaller_than_one_batch_is_refused(tmp_path):
    data_yaml = make_default_dataset(tmp_path / "data", n_train=3, n_val=2, imgsz=96)
    proc = _run(_train_args(tmp_path, data_yaml, "--epochs", "1", "--workers", "0"), tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        "error: the training set has 3 usable images: with 1 rank(s) each rank gets 3, fewer than its batch of 4"
    ) in proc.stderr
    assert "--batch-per-gpu 3 or less (--batch-size 3)" in proc.stderr
    assert not (tmp_path / "model" / "best.pt").exists()
