"""The collectives of yolov5_smddp.distributed.process_group put only float32 through all_gather / broadcast /
all_reduce(SUM) / barrier, and carry any dtype exactly; the strict SMDDP stand-in refuses the rest."""

import datetime
import multiprocessing
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from yolov5_smddp.commands.val import detection_json
from yolov5_smddp.distributed import collectives, process_group
from yolov5_smddp.distributed.collectives import decode_exact, encode_exact
from yolov5_smddp.models.autoanchor import AnchorCheck
from yolov5_smddp.train import autobatch

REPO = Path(__file__).resolve().parent.parent.parent
STANDIN = REPO / "tests" / "standin_smddp"
INT64_EDGES = [-(2**63), -1, 0, 1, 2**24 + 1, 2**53 + 1, 2**63 - 1]


@pytest.mark.parametrize(
    "tensor",
    [
        torch.tensor([INT64_EDGES, INT64_EDGES[::-1]], dtype=torch.int64),
        torch.tensor([[True, False, True]]),
        torch.tensor([[float("nan"), -0.0, 1e-310, 2.0**-1074, 1 / 3]], dtype=torch.float64),
        torch.tensor([[65504.0, -(2.0**-24)]], dtype=torch.float16),
        torch.tensor([[0, 255, 7]], dtype=torch.uint8),
        torch.zeros((0, 3, 2), dtype=torch.int32),
        torch.zeros((3, 0), dtype=torch.int64),
    ],
    ids=["int64", "bool", "float64", "float16", "uint8-odd", "no-rows", "empty-rows"],
)
def test_encode_exact_round_trips_bit_for_bit_in_float32(tensor):
    encoded = encode_exact(tensor)
    assert encoded.dtype == torch.float32 and encoded.shape[0] == tensor.shape[0]
    assert bool((encoded == encoded.round()).all()) and bool((encoded.abs() <= 32768).all())
    decoded = decode_exact(encoded.clone(), tensor.dtype, tuple(tensor.shape[1:]))
    assert decoded.dtype == tensor.dtype and decoded.shape == tensor.shape
    assert decoded.view(torch.uint8).tolist() == tensor.view(torch.uint8).tolist()  # NaN, -0.0 too


def test_encode_exact_values():
    # little-endian bytes read as int16 numbers: 1 -> [1, 0, 0, 0]; -2 -> [-2, -1, -1, -1]; 65536 -> [0, 1, ..]
    ints = torch.tensor([[1], [-2], [65536]], dtype=torch.int64)
    assert encode_exact(ints).tolist() == [
        [1.0, 0.0, 0.0, 0.0],
        [-2.0, -1.0, -1.0, -1.0],
        [0.0, 1.0, 0.0, 0.0],
    ]
    assert encode_exact(torch.tensor([[True, False, True]])).tolist() == [[1.0, 1.0]]  # bytes 1,0 | 1,pad
    floats = torch.tensor([[0.5, 2.0]])
    assert encode_exact(floats).data_ptr() == floats.data_ptr()  # float32 travels as it is, no copy
    with pytest.raises(ValueError, match="at least one dimension"):
        encode_exact(torch.tensor(3))


def test_alone_the_helpers_hand_back_their_input():
    assert not process_group.is_initialized()
    t = torch.tensor([[1, 2]], dtype=torch.int64)
    copy = collectives.broadcast_tensor(t)
    assert torch.equal(copy, t) and copy.data_ptr() != t.data_ptr()
    assert collectives.broadcast_ints((2**62, -1, True)) == (2**62, -1, 1)
    assert [g.tolist() for g in collectives.all_gather_rows(t)] == [[[1, 2]]]
    module = nn.Linear(2, 1)
    assert collectives.broadcast_module(module) is module


def test_anchor_check_vector_round_trip():
    anchors = np.array([[10, 13], [16.5, 30], [33, 23.25]], np.float32)
    check = AnchorCheck(0.912345678, 0.99, anchors, True, 2**40)
    vector = check.to_vector()
    assert vector.dtype == np.float64 and vector.tolist()[:4] == [0.912345678, 0.99, 1.0, 2.0**40]
    back = AnchorCheck.from_vector(vector)
    assert back.anchors_px.dtype == np.float32 and back.anchors_px.tolist() == anchors.tolist()
    assert (back.bpr_before, back.bpr_after, back.changed, back.boxes) == (0.912345678, 0.99, True, 2**40)


def test_detection_json_from_a_gathered_row():
    row = [2.0, 10.0, 20.0, 15.5, 30.0, 0.75, 1.0]
    assert detection_json(row, [7, 8, 9], [1, 3]) == {
        "image_id": 9,
        "category_id": 3,
        "bbox": [10.0, 20.0, 5.5, 10.0],
        "score": 0.75,
    }


# ------------------------------------------------------------------ two ranks under the strict stand-in


def _refusals() -> dict[str, str]:
    import torch.distributed as dist

    attempts = {
        "broadcast_object_list": lambda: dist.broadcast_object_list([1], src=0),
        "all_gather_object": lambda: dist.all_gather_object([None, None], 1),
        "gather": lambda: dist.gather(torch.ones(1), None, dst=0),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.ones(1), torch.ones(2)),
        "new_group": lambda: dist.new_group([0, 1]),
        "avg": lambda: dist.all_reduce(torch.ones(1), op=dist.ReduceOp.AVG),
        "int64 all_reduce": lambda: dist.all_reduce(torch.ones(1, dtype=torch.int64)),
        "float64 broadcast": lambda: dist.broadcast(torch.ones(1, dtype=torch.float64), src=0),
        "int64 all_gather": lambda: dist.all_gather([torch.ones(1)] * 2, torch.ones(1, dtype=torch.int64)),
        "barrier device_ids": lambda: dist.barrier(device_ids=[0]),
    }
    seen = {}
    for name, attempt in attempts.items():
        try:
            attempt()
            seen[name] = "ran"
        except RuntimeError as exc:
            seen[name] = f"{type(exc).__name__}: {exc}"
    return seen


def _worker(rank: int, folder: str, queue) -> None:
    sys.path.insert(0, str(STANDIN))
    import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401 - registers the strict "smddp"
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.FileStore(f"{folder}/store", 2)
    timeout = datetime.timedelta(seconds=30)  # a collective that should have been refused may hang: bounded
    dist.init_process_group("smddp", store=store, rank=rank, world_size=2, timeout=timeout)
    process_group._state.update(rank=rank, world_size=2, device=torch.device("cpu"))
    try:
        big = torch.tensor([INT64_EDGES] * (3 - 2 * rank), dtype=torch.int64) + rank  # 3 rows, then 1
        rows = [g.tolist() for g in collectives.all_gather_rows(big)]
        empty = [tuple(g.shape) for g in collectives.all_gather_rows(torch.zeros((2 * rank, 5)))]
        ints = collectives.broadcast_ints((2**53 + 1 + rank, -rank, rank == 0))
        torch.manual_seed(rank)
        module = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
        module[1].running_mean.uniform_()
        module[1].num_batches_tracked.fill_(2**40 + rank)
        broadcasts = []
        original = dist.broadcast

        def counting(*args, **kwargs):
            broadcasts.append(args[0].dtype)
            return original(*args, **kwargs)

        dist.broadcast = counting
        collectives.broadcast_module(module)
        dist.broadcast = original
        state = {k: v.tolist() for k, v in module.state_dict().items()}
        agreed = autobatch.agree_smallest((37, 23)[rank])  # --batch-size -1: SMDDP has no MIN all_reduce
        queue.put((rank, rows, empty, ints, state, [str(d) for d in broadcasts], _refusals(), agreed))
        process_group.barrier()
    except Exception as exc:  # reported to the test at once, rather than by its timeout
        queue.put((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        process_group.destroy()


def test_two_ranks_under_the_strict_standin(tmp_path):
    ctx = multiprocessing.get_context("spawn")  # fork from a threaded pytest may deadlock
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, str(tmp_path), queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    try:
        results = {r[0]: r[1:] for r in (queue.get(timeout=180) for _ in procs)}
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    failed = {rank: result[0] for rank, result in results.items() if len(result) == 1}
    assert not failed and [proc.exitcode for proc in procs] == [0, 0]
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    reference[1].running_mean.uniform_()
    for rank in (0, 1):
        rows, empty, ints, state, broadcasts, refusals, agreed = results[rank]
        assert agreed == 23  # AutoBatch: every rank takes the smallest batch
        # uneven row counts, int64 edges exactly (rank 1's values +1 wrap at the top: int64 arithmetic)
        assert rows == [[INT64_EDGES] * 3, [(torch.tensor(INT64_EDGES) + 1).tolist()]]
        assert empty == [(0, 5), (2, 5)]
        assert ints == (2**53 + 1, 0, 1)
        # rank 0's module everywhere, the int64 buffer too, in ONE float32 broadcast
        assert broadcasts == ["torch.float32"]
        assert state["1.num_batches_tracked"] == 2**40
        assert {k: v for k, v in state.items() if k != "1.num_batches_tracked"} == {
            k: v.tolist() for k, v in reference.state_dict().items() if k != "1.num_batches_tracked"
        }
        assert set(refusals) == {
            "broadcast_object_list",
            "all_gather_object",
            "gather",
            "reduce_scatter_tensor",
            "new_group",
            "avg",
            "int64 all_reduce",
            "float64 broadcast",
            "int64 all_gather",
            "barrier device_ids",
        }
        for name, outcome in refusals.items():
            assert outcome.startswith("SmddpUnsupported: smddp stand-in: "), (name, outcome)
        assert "broadcast_object_list is not supported by SMDDP" in refusals["broadcast_object_list"]
        assert "torch.int64" in refusals["int64 all_reduce"] and "AVG" in refusals["avg"]
