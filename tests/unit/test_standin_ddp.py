"""The strict SMDDP stand-in sees DDP's own collectives (issue 52, item 3).

Two ranks under "smddp" (the stand-in's Python ProcessGroup around Gloo) build the trainer's DDP
(optim_recipe.wrap_ddp) around a model with BatchNorm, then run two training micro-steps. Every collective
the process group was asked for, from Python or from DDP's C++ side, is recorded: int64 crosses only in
DDP's constructor (its parameter metadata), everything after it is float32 (no per-forward buffer
broadcast: broadcast_buffers=False) but for the int32 bucket indices of DDP's one bucket rebuild."""

from __future__ import annotations

import datetime
import multiprocessing
import sys
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parent.parent.parent
STANDIN = REPO / "tests" / "standin_smddp"


def _worker(rank: int, folder: str, queue) -> None:
    sys.path.insert(0, str(STANDIN))
    import torch.distributed as dist
    from smdistributed.dataparallel.torch import torch_smddp

    from yolov5_smddp.distributed import process_group
    from yolov5_smddp.train.optim_recipe import wrap_ddp

    torch.set_num_threads(1)
    store = dist.FileStore(f"{folder}/store", 2)
    dist.init_process_group(
        "smddp", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30)
    )
    process_group._state.update(rank=rank, world_size=2, device=torch.device("cpu"))
    try:
        torch.manual_seed(rank)  # different weights per rank: DDP's construction broadcast makes them equal
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
        ddp = wrap_ddp(model, torch.device("cpu"))
        for step in range(2):
            torch.manual_seed(10 * step + rank)
            ddp(torch.rand(2, 3, 8, 8)).square().sum().backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).tolist()
        weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
        queue.put((rank, sorted(set(torch_smddp.SEEN)), grads, weights, type(dist.group.WORLD).__name__))
        process_group.barrier()
    except Exception as exc:  # reported to the test at once, rather than by its timeout
        queue.put((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        process_group.destroy()


def test_ddp_own_collectives_pass_through_the_strict_standin(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, str(tmp_path), queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    try:
        results = {r[0]: r[1:] for r in (queue.get(timeout=120) for _ in procs)}
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    assert all(len(r) > 1 for r in results.values()), results
    seen0, grads0, weights0, group = results[0]
    seen1, grads1, weights1, _ = results[1]
    assert group == "StrictGroup"  # the stand-in's Python ProcessGroup is the default group
    for seen in (seen0, seen1):
        # DDP's C++ side, seen: int64 metadata gathered and float32 parameters broadcast at construction,
        # int32 bucket indices in its one bucket rebuild
        assert ("allgather", "torch.int64", "construction") in seen
        assert ("broadcast", "torch.float32", "construction") in seen
        assert ("broadcast", "torch.int32", "bucket rebuild") in seen
        # the reducer's gradient all-reduce, float32
        assert ("allreduce", "torch.float32", "") in seen
        # nothing but float32 outside DDP's bookkeeping (no per-forward int64 buffer broadcast)
        assert {dtype for _, dtype, context in seen if not context} <= {"torch.float32", ""}
    assert weights0 == weights1 and grads0 == grads1  # one model, all-reduced gradients
