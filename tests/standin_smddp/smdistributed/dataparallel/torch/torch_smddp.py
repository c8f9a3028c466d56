"""Test stand-in for `smdistributed.dataparallel.torch.torch_smddp`.

Importing the real module registers the "smddp" process-group backend. This stand-in registers a
backend of the same name that delegates to Gloo, so that `torch.distributed.init_process_group("smddp")`
and everything after it (DDP, all_reduce, broadcast, barrier) runs for real in tests, on CPU. Put
`tests/standin_smddp` on PYTHONPATH to use it.

It is STRICT: while the default process group's backend is "smddp", torch.distributed's Python
collectives accept only what AWS lists for SMDDP — all_reduce (ReduceOp.SUM), broadcast, all_gather,
all_to_all_single and barrier (without device_ids), on the default group, on dense float tensors
(float32, float16, bfloat16) — and raise `SmddpUnsupported` for anything else: the `*_object`
collectives, gather/scatter/reduce/reduce_scatter, all_gather_into_tensor, point-to-point, new_group,
ReduceOp.AVG (and every op but SUM), integer/bool/float64 tensors. The wrappers replace the functions in
both `torch.distributed` and `torch.distributed.distributed_c10d` (torch's own object collectives call
the latter's), and pass everything through untouched under any other backend.

The backend itself (issue 52) is `StrictGroup`, a Python `ProcessGroup` around a Gloo group: torch uses a
Python ProcessGroup returned by a registered creator as the process group itself, so EVERY collective it
is asked for goes through its methods, DDP's C++ ones included (the parameter-shape check and parameter
broadcast at construction, the reducer's gradient all-reduce and its one bucket rebuild, the per-forward
buffer broadcast when broadcast_buffers=True). On the wire it allows float32 only, and DDP's own
bookkeeping, which AWS's "keep DDP unchanged" covers: int64 inside DDP's constructor (parameter shapes and
strides gathered once) and int32 in the reducer's one bucket rebuild (bucket indices broadcast from rank 0
before the second forward). Anything else raises `SmddpUnsupported`. Every call is recorded in `SEEN` as
(collective, dtype, context: "construction", "bucket rebuild" or "") for the tests.
"""

from __future__ import annotations

import functools
import linecache
import sys
import threading

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel

# torch calls the creator once per device type listed in `devices`; both must share one Gloo group.
_groups: dict[int, object] = {}

SUPPORTED = ("all_reduce", "broadcast", "all_gather", "all_to_all_single", "barrier")
REFUSED = (
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
    "gather",
    "scatter",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "all_reduce_coalesced",
    "all_to_all",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "monitored_barrier",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "_reduce_scatter_base",
    "_all_gather_base",
)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class SmddpUnsupported(RuntimeError):
    """A collective, an argument or a dtype that SMDDP does not support (as AWS documents it)."""


WIRE_DTYPES = (torch.float32,)
"""What may cross the wire outside DDP's bookkeeping (yolov5_smddp.distributed.process_group encodes everything else)."""
BOOKKEEPING_DTYPES = {
    "construction": (torch.float32, torch.int64),  # parameter metadata (shapes, strides)
    "bucket rebuild": (torch.float32, torch.int32),  # the reducer's bucket indices and sizes
}
SEEN: list[tuple[str, str, str]] = []
"""(collective, dtype, DDP bookkeeping context or "") for every tensor the process group was given."""
_ddp_init = threading.local()


def _ddp_context() -> str:
    """ "construction" inside DDP's constructor; "bucket rebuild" while DDP's forward runs the reducer's
    `_rebuild_buckets()` (a C++ call: the Python frame that made it is on that line); else ""."""
    if getattr(_ddp_init, "depth", 0) > 0:
        return "construction"
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.endswith("distributed.py") and "_rebuild_buckets(" in linecache.getline(name, frame.f_lineno):
            return "bucket rebuild"
        frame = frame.f_back
    return ""


class StrictGroup(dist.ProcessGroup):
    """The "smddp" process group: every collective checked and recorded, then run by Gloo."""

    def __init__(self, gloo, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self._gloo = gloo

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "smddp"

    def _check(self, name: str, tensors) -> None:
        context = _ddp_context()
        allowed = BOOKKEEPING_DTYPES.get(context, WIRE_DTYPES)
        for tensor in tensors:
            SEEN.append((name, str(tensor.dtype), context))
            if tensor.layout != torch.strided or tensor.dtype not in allowed:
                where = f"in DDP's {context}" if context else "outside DDP's own bookkeeping"
                raise SmddpUnsupported(
                    f"smddp stand-in: the process group was asked for {name} on a {tensor.dtype} tensor "
                    f"{where}; only {', '.join(str(d) for d in allowed)} may cross the wire there"
                )

    def allreduce(self, tensors, opts=None):
        if opts is not None and opts.reduceOp != dist.ReduceOp.SUM:
            raise SmddpUnsupported(f"smddp stand-in: allreduce with {opts.reduceOp} (only SUM)")
        self._check("allreduce", tensors)
        return self._gloo.allreduce(tensors, opts) if opts is not None else self._gloo.allreduce(tensors)

    def broadcast(self, tensors, opts=None):
        self._check("broadcast", tensors)
        return self._gloo.broadcast(tensors, opts) if opts is not None else self._gloo.broadcast(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        self._check("allgather", [*input_tensors, *(t for row in output_tensors for t in row)])
        if opts is None:
            return self._gloo.allgather(output_tensors, input_tensors)
        return self._gloo.allgather(output_tensors, input_tensors, opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        self._check("alltoall_base", [output, input])
        args = (output, input, output_split_sizes, input_split_sizes)
        return self._gloo.alltoall_base(*args, opts) if opts is not None else self._gloo.alltoall_base(*args)

    def barrier(self, opts=None):
        SEEN.append(("barrier", "", _ddp_context()))
        return self._gloo.barrier(opts) if opts is not None else self._gloo.barrier()

    def _refuse(self, name: str):
        raise SmddpUnsupported(f"smddp stand-in: the process group was asked for {name} (not SMDDP's)")

    def allreduce_coalesced(self, *args, **kwargs):
        self._refuse("allreduce_coalesced")

    def allgather_into_tensor_coalesced(self, *args, **kwargs):
        self._refuse("allgather_into_tensor_coalesced")

    def reduce_scatter(self, *args, **kwargs):
        self._refuse("reduce_scatter")

    def send(self, *args, **kwargs):
        self._refuse("send")

    def recv(self, *args, **kwargs):
        self._refuse("recv")


def _create_gloo_backend(store, group_rank, group_size, timeout):
    """Creator with torch's plain (non-extended) signature: (store, rank, world_size, timedelta). torch
    takes the returned Python ProcessGroup as the process group itself (all devices)."""
    key = id(store)
    if key not in _groups:
        gloo = dist.ProcessGroupGloo(store, group_rank, group_size, timeout)
        _groups[key] = StrictGroup(gloo, group_rank, group_size)
    return _groups[key]


def _mark_ddp_construction() -> None:
    """DDP's constructor, marked while it runs (its int64 metadata is allowed there only)."""
    init = DistributedDataParallel.__init__
    if getattr(init, "__smddp_standin__", False):
        return

    @functools.wraps(init)
    def marked(self, *args, **kwargs):
        _ddp_init.depth = getattr(_ddp_init, "depth", 0) + 1
        try:
            init(self, *args, **kwargs)
        finally:
            _ddp_init.depth -= 1

    marked.__smddp_standin__ = True
    DistributedDataParallel.__init__ = marked


def _smddp_active() -> bool:
    return dist.is_initialized() and dist.get_backend() == "smddp"


def _check_group(name: str, group) -> None:
    if group is not None and group is not dist.GroupMember.WORLD and group is not c10d._get_default_group():
        raise SmddpUnsupported(f"smddp stand-in: {name} on a sub-group (SMDDP has no new_group)")


def _check_tensors(name: str, tensors) -> None:
    for tensor in tensors:
        if tensor.layout != torch.strided or tensor.dtype not in FLOAT_DTYPES:
            raise SmddpUnsupported(
                f"smddp stand-in: {name} on a {tensor.dtype} {tensor.layout} tensor; SMDDP is given dense "
                f"float tensors only ({', '.join(str(d) for d in FLOAT_DTYPES)})"
            )


def _all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    _check_group("all_reduce", group)
    _check_tensors("all_reduce", [tensor])
    if op != dist.ReduceOp.SUM:
        raise SmddpUnsupported(f"smddp stand-in: all_reduce with {op} (SMDDP: no AVG; only SUM is used here)")
    return _ORIGINAL["all_reduce"](tensor, op=op, group=group, async_op=async_op)


def _broadcast(tensor, src, group=None, async_op=False):
    _check_group("broadcast", group)
    _check_tensors("broadcast", [tensor])
    return _ORIGINAL["broadcast"](tensor, src, group=group, async_op=async_op)


def _all_gather(tensor_list, tensor, group=None, async_op=False):
    _check_group("all_gather", group)
    _check_tensors("all_gather", [tensor, *tensor_list])
    return _ORIGINAL["all_gather"](tensor_list, tensor, group=group, async_op=async_op)


def _all_to_all_single(
    output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False
):
    _check_group("all_to_all_single", group)
    _check_tensors("all_to_all_single", [output, input])
    return _ORIGINAL["all_to_all_single"](
        output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op
    )


def _barrier(group=dist.GroupMember.WORLD, async_op=False, device_ids=None):
    _check_group("barrier", group)
    if device_ids is not None:
        raise SmddpUnsupported("smddp stand-in: barrier(device_ids=...) (SMDDP rejects device_ids)")
    return _ORIGINAL["barrier"](group=group, async_op=async_op)


_CHECKED = {
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "all_gather": _all_gather,
    "all_to_all_single": _all_to_all_single,
    "barrier": _barrier,
}
_ORIGINAL: dict[str, object] = {}


def _refusing(name: str):
    def refuse(*args, **kwargs):
        raise SmddpUnsupported(
            f"smddp stand-in: torch.distributed.{name} is not supported by SMDDP (AWS lists "
            f"{', '.join(SUPPORTED)}); use yolov5_smddp.distributed.process_group's float32 helpers"
        )

    return refuse


def _strict(name: str, original, checked):
    @functools.wraps(original)
    def call(*args, **kwargs):
        return checked(*args, **kwargs) if _smddp_active() else original(*args, **kwargs)

    call.__smddp_standin__ = True
    return call


def _install() -> None:
    """Wrap torch.distributed's collectives once per process (idempotent)."""
    if getattr(c10d.broadcast, "__smddp_standin__", False):
        return
    for name in (*SUPPORTED, *REFUSED):
        original = getattr(c10d, name, None)
        if original is None:  # not in this torch version
            continue
        _ORIGINAL[name] = original
        wrapper = _strict(name, original, _CHECKED.get(name) or _refusing(name))
        setattr(c10d, name, wrapper)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapper)


if "smddp" not in dist.Backend.backend_list:
    dist.Backend.register_backend("smddp", _create_gloo_backend, devices=["cpu", "cuda"])
_install()
_mark_ddp_construction()
