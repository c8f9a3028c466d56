"""The validation plots under sharded validation: every rank records its shard, `gather()` gives rank 0
the confusion matrix and curve statistics of all images (2 real Gloo processes), equal to one recorder."""

import multiprocessing
import socket

import numpy as np
import torch

from yolov5_smddp.distributed import process_group
from yolov5_smddp.plots import ValidationPlots

IMAGES = [f"/d/{i}.jpg" for i in range(6)]
SHAPES = np.array([[60, 80]] * 6, np.int32)  # (h, w)
LABELS = [np.array([[i % 2, 0.5, 0.5, 0.5, 0.5]], np.float32) for i in range(6)]  # x 20..60, y 15..45


def _detections(i: int) -> torch.Tensor:
    """Image i: a hit on its label (conf rising with i, the class wrong for i = 4) and a stray box."""
    cls = (i % 2) if i != 4 else 1 - (i % 2)
    return torch.tensor(
        [[20, 15, 60, 45, 0.3 + 0.1 * i, cls], [0, 0, 9, 9, 0.35 + 0.05 * i, 1]], dtype=torch.float32
    )


def _record(recorder: ValidationPlots, indices) -> ValidationPlots:
    for i in indices:
        recorder.on_image(IMAGES[i], _detections(i))
    return recorder


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, port: int, queue) -> None:
    torch.set_num_threads(1)
    info = process_group.DistInfo(rank, rank, 2, 2, 0, "127.0.0.1", port, "torchrun", use_libuv=False)
    process_group.init(info, "gloo", "cpu", 60.0)
    try:
        mine = range(0, 4) if rank == 0 else range(4, 6)  # uneven shards
        recorder = _record(ValidationPlots(IMAGES, SHAPES, LABELS, nc=2, keep_first=rank == 0), mine)
        recorder.gather()
        curves = recorder.curves()
        queue.put(
            (
                rank,
                recorder.confusion.matrix.tolist(),
                curves.classes.tolist(),
                curves.ap50.tolist(),
                curves.f1.tolist(),
                [path for path, _, _ in recorder.first],
            )
        )
    finally:
        process_group.destroy()


def test_two_gloo_ranks_gather_equal_one_recorder():
    alone = _record(ValidationPlots(IMAGES, SHAPES, LABELS, nc=2), range(6))
    curves = alone.curves()
    ctx = multiprocessing.get_context("spawn")  # fork from a threaded pytest may deadlock
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    results = {r[0]: r[1:] for r in (queue.get(timeout=120) for _ in procs)}
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    matrix, classes, ap50, f1, first = results[0]
    assert matrix == alone.confusion.matrix.tolist()
    assert sum(map(sum, matrix)) == 12  # 6 labels + 6 stray boxes counted once each
    assert classes == curves.classes.tolist() == [0, 1]
    assert ap50 == curves.ap50.tolist() and f1 == curves.f1.tolist()
    assert first == IMAGES[:4]  # val_batch0: rank 0's own images only
    assert results[1][-1] == []  # keep_first=False
    assert results[1][0] != matrix  # the other ranks keep their own shard
