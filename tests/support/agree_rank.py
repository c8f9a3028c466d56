"""One rank of a 2-process Gloo group for tests/unit/test_autobatch.py (a light module: the spawned child
imports only this, torch and yolov5_smddp.train.autobatch)."""

from __future__ import annotations

import datetime

import torch

from yolov5_smddp.distributed import process_group
from yolov5_smddp.train import autobatch


def agree(rank: int, folder: str, batches: tuple[int, int], queue) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.FileStore(f"{folder}/store", 2)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60)
    )
    process_group._state.update(rank=rank, world_size=2, device=torch.device("cpu"))
    try:
        queue.put((rank, autobatch.agree_smallest(batches[rank])))
    except Exception as exc:  # reported at once rather than by the timeout
        queue.put((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        process_group.destroy()
