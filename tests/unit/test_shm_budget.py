"""Loader workers fit /dev/shm, decided up front (issue 50 item 4): all fit, fewer, or none, each said in
one line naming --shm-size; a real 64 MB /dev/shm (a private tmpfs mount) is measured as such."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from child_python import REPO

from yolov5_smddp.data.shm_budget import batch_bytes, plan_workers

MB = 2**20


def test_workers_that_fit_are_kept_without_a_line():
    plan = plan_workers(4, per_rank=16, imgsz=640, local_ranks=1, shm_free=8 * 2**30)
    assert (plan.workers, plan.line) == (4, None)


def test_dockers_default_64mb_lowers_the_workers_in_one_line_naming_shm_size():
    per_worker = 2 * batch_bytes(4, 640)  # prefetch 2 of validation's batch of 8 at 640 px: 24.6 MB
    plan = plan_workers(8, per_rank=4, imgsz=640, local_ranks=1, shm_free=64 * MB)
    assert plan.workers == 64 * MB // per_worker == 2
    assert "--shm-size 1g" in plan.line and "\n" not in plan.line
    assert f"using {plan.workers} worker(s) per rank" in plan.line


def test_no_room_for_one_worker_loads_in_the_main_process_and_says_so():
    plan = plan_workers(4, per_rank=16, imgsz=640, local_ranks=8, shm_free=64 * MB)
    assert plan.workers == 0
    assert "loading in the main process" in plan.line and "--shm-size 3g" in plan.line


def test_every_local_rank_shares_one_dev_shm():
    alone = plan_workers(4, per_rank=8, imgsz=640, local_ranks=1, shm_free=200 * MB)
    shared = plan_workers(4, per_rank=8, imgsz=640, local_ranks=4, shm_free=200 * MB)
    assert shared.workers < alone.workers


def test_unknown_free_space_or_no_workers_change_nothing():
    assert plan_workers(3, per_rank=16, imgsz=640, local_ranks=1, shm_free=None).workers == 3
    assert plan_workers(0, per_rank=16, imgsz=640, local_ranks=1, shm_free=1).workers == 0


_MEASURE = (
    "from yolov5_smddp.data.shm_budget import plan_workers, shm_free_bytes;"
    "p = plan_workers(8, per_rank=16, imgsz=640, local_ranks=1, shm_free=shm_free_bytes());"
    "print(p.workers); print(p.line)"
)


@pytest.mark.skipif(
    shutil.which("unshare") is None,
    reason="cannot mount a tmpfs in a private mount namespace here: no unshare",
)
def test_a_real_64mb_dev_shm_is_measured_and_lowers_the_workers():
    script = f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} -c '{_MEASURE}'"
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
    )
    if done.returncode != 0 and not done.stdout.strip():  # unshare or mount refused: no python ran
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stderr[-2000:]
    workers, line = done.stdout.strip().splitlines()
    assert workers == "0"  # a validation batch of 32 at 640 px is 49 MB: two need more than 64 MB
    assert line.startswith("/dev/shm has 64 MB free") and "--shm-size" in line


def test_the_training_loaders_take_the_workers_that_fit_and_log_one_line(monkeypatch, caplog):
    import logging

    from yolov5_smddp.data import shm_budget
    from yolov5_smddp.distributed.process_group import DistInfo
    from yolov5_smddp.train import data_wiring

    monkeypatch.setattr(shm_budget, "shm_free_bytes", lambda path=shm_budget.SHM_PATH: 64 * MB)
    info = DistInfo(0, 0, 1, 1, 0, "127.0.0.1", 29500, "single")
    with caplog.at_level(logging.WARNING, logger="yolov5_smddp"):
        assert data_wiring.shm_workers(8, 4, 640, info) == 2
    [line] = [r.getMessage() for r in caplog.records if "/dev/shm" in r.getMessage()]
    assert "using 2 worker(s) per rank" in line and "--shm-size 1g" in line
