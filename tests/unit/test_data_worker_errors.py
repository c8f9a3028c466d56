"""A dead loader worker ends with a message naming --workers, /dev/shm and the memory figures; a training
set smaller than one batch per rank is a clear error, not 0 steps per epoch."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from datatree import watch

from yolov5_smddp.data.dataset import YoloDataset
from yolov5_smddp.data.labels import build_label_index
from yolov5_smddp.data.loader import build_dataloader, check_batch_fits, steps_per_epoch
from yolov5_smddp.data.synthetic import make_default_dataset
from yolov5_smddp.data.worker_errors import (
    LoaderContext,
    LoaderWorkerDied,
    Resources,
    dead_workers,
    describe,
    explain_worker_failure,
    parse_meminfo,
    worker_death_error,
)
from yolov5_smddp.errors import DataError

GIB, MIB = 2**30, 2**20
FIGURES = Resources(
    shm_total=64 * MIB,
    shm_free=MIB // 2,
    mem_total=16 * GIB,
    mem_available=GIB,
    limit=8 * GIB,
    in_use=8 * GIB - MIB,
    peak=8 * GIB,
    oom_kills=1,
)
CONTEXT = LoaderContext(rank=3, workers=8, batch_size=32)
ADVICE = (
    "This loader ran 8 worker process(es) with a batch of 32 per rank. Lower --workers (the maximum per rank) "
    "or the batch per GPU, or drop --cache ram; with docker run give a larger --shm-size (e.g. --shm-size 16g); "
    "on SageMaker choose an instance type with more memory per GPU."
)
FIGURES_TEXT = (
    "/dev/shm: 64.0 MiB total, 0.5 MiB free. Memory: 16.0 GiB total, 1.0 GiB available; container limit "
    "8.0 GiB, 8.0 GiB in use, peak 8.0 GiB; the out-of-memory killer has stopped 1 process(es) in this container."
)


def test_figures_are_described_exactly():
    assert describe(FIGURES) == FIGURES_TEXT
    assert (
        describe(Resources())
        == "/dev/shm: unknown total, unknown free. Memory: unknown total, unknown available."
    )
    meminfo = "MemTotal:       24576000 kB\nMemFree:         100 kB\nMemAvailable:    2048000 kB\n"
    assert parse_meminfo(meminfo) == (24576000 * 1024, 2048000 * 1024)


def test_a_killed_worker_is_explained():
    error = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
    explained = explain_worker_failure(error, CONTEXT, FIGURES)
    assert isinstance(explained, LoaderWorkerDied)
    assert str(explained) == (
        "a DataLoader worker of rank 3 failed: DataLoader worker (pid 4242) is killed by signal: Killed. "
        "A worker killed with SIGKILL was most likely stopped by the out-of-memory killer. "
        f"{FIGURES_TEXT} {ADVICE}"
    )


class _Worker:
    def __init__(self, pid: int, exitcode: int | None) -> None:
        self.pid, self.exitcode = pid, exitcode


class _Iterator:
    def __init__(self, *workers: _Worker) -> None:
        self._workers = list(workers)


def test_a_worker_killed_while_handing_a_batch_over_is_read_as_a_death():
    # the trainer sees EOFError from the fd-passing socket; the worker list tells what happened
    dead = dead_workers(_Iterator(_Worker(11, None), _Worker(12, -signal.SIGKILL)), wait_s=0)
    assert dead == [(12, -signal.SIGKILL)]
    error = worker_death_error(dead)
    assert str(error) == "DataLoader worker (pid 12) is killed by signal: Killed."
    explained = explain_worker_failure(error, CONTEXT, FIGURES)
    assert isinstance(explained, LoaderWorkerDied)
    assert "A worker killed with SIGKILL was most likely stopped by the out-of-memory killer." in str(
        explained
    )
    assert (
        str(worker_death_error([(13, 3)]))
        == "DataLoader worker (pid 13) exited unexpectedly with exit code 3."
    )
    assert dead_workers(_Iterator(_Worker(11, None), _Worker(12, 0)), wait_s=0) == []
    assert dead_workers(None, wait_s=0) == []


def test_a_full_dev_shm_in_a_worker_is_explained():
    reraised = RuntimeError(
        "Caught RuntimeError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/dist-packages/torch/storage.py", line 525, in _share_fd_cpu_\n'
        "RuntimeError: unable to write to file </torch_10_19_0>: No space left on device (28)\n"
    )
    explained = explain_worker_failure(reraised, CONTEXT, FIGURES)
    assert str(explained).startswith(
        "a DataLoader worker of rank 3 failed: RuntimeError: unable to write to file </torch_10_19_0>: No space "
        "left on device (28) Bus errors and 'No space left on device' mean /dev/shm, which carries every batch "
        "from the workers, is full. /dev/shm: 64.0 MiB total"
    )


def test_user_errors_from_workers_keep_their_own_message_and_others_pass():
    reraised = DataError(
        "Caught DataError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\nyolov5_smddp.errors.DataError: no image of the dataset can be decoded\n'
    )
    explained = explain_worker_failure(reraised, CONTEXT, FIGURES)
    assert type(explained) is DataError and str(explained) == "no image of the dataset can be decoded"
    assert explain_worker_failure(ValueError("a bug"), CONTEXT, FIGURES) is None
    assert explain_worker_failure(RuntimeError("CUDA error"), CONTEXT, FIGURES) is None


def _two_worker_loader(tmp_path, n_train: int):
    """A training loader of 2 persistent workers, batch 2, over n_train generated 96 px images."""
    root = tmp_path / "data"
    make_default_dataset(root, n_train=n_train, n_val=0, imgsz=96)
    watch(root)
    index = build_label_index(
        [root / "images" / "train"], nc=3, root=root, cache_dir=tmp_path / "c", workers=1
    )
    ds = YoloDataset(index, 64, augment=True, hyp=None)
    return build_dataloader(
        ds, batch_size=2, rank=0, world_size=1, workers=2, shuffle=True, seed=0, drop_last=True
    )


def test_a_worker_killed_with_sigkill_ends_the_pass_with_the_explanation(tmp_path):
    loader = _two_worker_loader(tmp_path, n_train=40)
    batches = iter(loader)
    next(batches)
    victim = loader._iterator._workers[0].pid
    # the death surfaces from next() or, via torch's SIGCHLD handler, wherever the main thread is
    with pytest.raises(LoaderWorkerDied) as died:
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            next(batches)
    message = str(died.value)
    assert f"DataLoader worker (pid {victim}) is killed by signal: Killed" in message or (
        f"DataLoader worker (pid(s) {victim}) exited unexpectedly" in message
    )
    assert "--workers" in message and "2 worker process(es) with a batch of 2" in message
    assert (
        "/dev/shm: " in message and " total, " in message and "Memory: " in message and "available" in message
    )


def test_a_worker_ended_by_sigterm_is_a_stop_not_a_memory_problem():
    error = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Terminated. ")
    explained = explain_worker_failure(error, CONTEXT, FIGURES)
    assert isinstance(explained, LoaderWorkerDied)
    assert str(explained) == (
        "a DataLoader worker of rank 3 was ended by SIGTERM from outside the trainer: DataLoader worker "
        "(pid 4242) is killed by signal: Terminated. The job is being stopped (docker stop, StopTrainingJob, "
        "a spot interruption) or another process sent it; this is not a memory problem."
    )


def test_loader_workers_outlive_a_sigterm_from_outside(tmp_path):
    """A stop sends SIGTERM to every process (the container's PID 1, torch's launchers): the workers
    ignore it and the pass goes on; the trainer, which got it too, ends them itself."""
    loader = _two_worker_loader(tmp_path, n_train=24)
    batches = iter(loader)
    # batches 0 and 1 come from workers 0 and 1: both have run their worker_init (where SIGTERM is
    # taken over); a signal before that would hit a worker still starting up (a busy machine's race)
    next(batches), next(batches)
    workers = list(loader._iterator._workers)
    # sent by another process, as docker/entry.py sends it (torch's worker handler tells its parent apart)
    subprocess.run(["kill", "-TERM", *(str(w.pid) for w in workers)], check=True)
    time.sleep(1.0)  # time for a signal that were not ignored to end them
    assert len(list(batches)) == 10  # the rest of the pass
    assert [w.exitcode for w in workers] == [None, None]  # alive (persistent workers)
    assert len(list(loader)) == 12  # and the next pass
    # the trainer's own SIGTERM (multiprocessing's terminate(), torch's and Python's last resort at exit)
    # still ends them at once
    for w in workers:
        w.terminate()
        w.join(timeout=60)
    assert [w.exitcode for w in workers] == [0, 0]


@pytest.mark.parametrize(
    ("n", "batch", "world", "steps"),
    [
        (16, 16, 1, 1),
        (17, 16, 1, 2),
        (33, 4, 2, 5),
        (31, 16, 2, 1),
        (7, 1, 8, 1),
        (64, 8, 8, 1),
        (65, 8, 8, 2),
    ],
)
def test_steps_per_epoch_keeps_the_incomplete_last_batch(n, batch, world, steps):
    assert steps_per_epoch(n, batch, world) == steps


def test_a_training_set_smaller_than_one_batch_per_rank_is_an_error():
    check_batch_fits(16, 16, 1)
    with pytest.raises(DataError) as small:
        check_batch_fits(10, 16, 1)
    assert str(small.value) == (
        "the training set has 10 usable images: with 1 rank(s) each rank gets 10, fewer than its batch of 16, so "
        "every step would train on fewer images than the batch asked for; use "
        "--batch-per-gpu 10 or less (--batch-size 10), or add images"
    )
    with pytest.raises(
        DataError, match=r"each rank gets 12, .* --batch-per-gpu 12 or less \(--batch-size 24\)"
    ):
        check_batch_fits(25, 16, 2)
    with pytest.raises(DataError, match=r"with 8 rank\(s\) each rank gets 0, .*use at most 7 rank\(s\)"):
        check_batch_fits(7, 1, 8)
