"""Everything distributed: where this process sits (rank/world from torchrun or Open MPI), which backend
to use (smddp / nccl / gloo), process-group init and teardown, and the few collectives the trainer needs.

This is the ONLY module that imports `smdistributed` or reads RANK / LOCAL_RANK / WORLD_SIZE / OMPI_*.
Rules kept for SMDDP's sake everywhere: `barrier()` never takes `device_ids`, and no sub-group is ever
created (`new_group` breaks SMDDP); every collective runs on the default group.
"""

from __future__ import annotations

import datetime
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from yolov5_smddp.dlc import SMDDP_DLCS
from yolov5_smddp.errors import ConfigError

SMDDP_MODULE = "smdistributed.dataparallel.torch.torch_smddp"
DEFAULT_MASTER_PORT = 7777  # the port the SageMaker PyTorch toolkit exports


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits. `launcher` is "torchrun" (RANK/WORLD_SIZE set), "mpirun"
    (OMPI_COMM_WORLD_*) or "none" (a single process)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    launcher: str
    agent_store: bool = False
    """torchrun's agent already serves the TCPStore at master_addr:master_port (workers are clients)."""
    use_libuv: bool = True
    """TCPStore transport; USE_LIBUV=0 for torch builds without libuv (Debian's)."""

    @property
    def distributed(self) -> bool:
        return self.launcher != "none"

    @property
    def prefer_smddp(self) -> bool:
        """Started by mpirun (SageMaker's SMDDP distribution): backend auto means smddp when it imports."""
        return self.launcher == "mpirun"

    @property
    def nnodes(self) -> int:
        """Hosts in the job (homogeneous: every host runs `local_world_size` ranks)."""
        return max(self.world_size // max(self.local_world_size, 1), 1)


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = environ.get(name)
    if value is None or value == "":
        if default is None:
            raise ConfigError(f"environment variable {name} is missing (set by the launcher)")
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from exc


def detect_dist_info(
    environ: Mapping[str, str],
    default_master: Callable[[], str | None] | str | None = None,
    *,
    hosts_in_job: int | None = None,
) -> DistInfo:
    """Where this process sits: torchrun's variables, else Open MPI's, else a single process. The one
    reader of RANK / LOCAL_RANK / WORLD_SIZE / GROUP_RANK / OMPI_* / MASTER_ADDR / MASTER_PORT.

    Open MPI exports OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}; its OMPI_COMM_WORLD_NODE_RANK is a
    per-node rank across all jobs, not a node index. mpirun (the SageMaker toolkit's `--host algo-1:N,...`)
    places ranks host by host, N per host, so the node index is rank // local size and the host count
    size // local size (homogeneous hosts, as SageMaker jobs are).

    `hosts_in_job` (the caller's count of the job's hosts, e.g. SageMaker's) replaces Open MPI's local size
    under mpirun: the SageMaker toolkit's mpirun forwards its own environment and, in the local stand-in,
    Open MPI counts both ranks of a 2 x 1 job as local (LOCAL_SIZE=2, LOCAL_RANK=1 on algo-2), so
    local size = size // hosts and local rank = rank % local size there.

    MASTER_ADDR may be absent (mpirun ranks, or no launcher at all): `default_master` (a host name, or a
    callable returning one, e.g. the first SageMaker host) supplies it; the caller owns where that comes
    from, this module never reads /opt/ml.
    """
    if "RANK" in environ and "WORLD_SIZE" in environ:
        rank, world = _int(environ, "RANK"), _int(environ, "WORLD_SIZE")
        local_rank = _int(environ, "LOCAL_RANK", rank)
        local_world = _int(environ, "LOCAL_WORLD_SIZE", world)
        node_rank = _int(environ, "GROUP_RANK", rank // max(local_world, 1))
        launcher = "torchrun"
    elif "OMPI_COMM_WORLD_RANK" in environ:
        rank, world = _int(environ, "OMPI_COMM_WORLD_RANK"), _int(environ, "OMPI_COMM_WORLD_SIZE")
        local_rank = _int(environ, "OMPI_COMM_WORLD_LOCAL_RANK", rank)
        local_world = _int(environ, "OMPI_COMM_WORLD_LOCAL_SIZE", world)
        if hosts_in_job and world % hosts_in_job == 0:
            local_world = world // hosts_in_job
            local_rank = rank % local_world
        node_rank = rank // max(local_world, 1)
        launcher = "mpirun"
    else:
        rank, world, local_rank, local_world, node_rank, launcher = 0, 1, 0, 1, 0, "none"
    if not (0 <= rank < world and 0 <= local_rank < local_world):
        raise ConfigError(
            f"inconsistent {launcher} environment: rank {rank}/{world}, local rank {local_rank}/{local_world}"
        )
    master = environ.get("MASTER_ADDR") or None
    if master is None:
        master = default_master() if callable(default_master) else default_master
    if master is None:
        if world > local_world:
            raise ConfigError(
                f"MASTER_ADDR is not set and no default master host is known for {world} ranks on several nodes"
            )
        master = "127.0.0.1"
    port = _int(environ, "MASTER_PORT", DEFAULT_MASTER_PORT)
    if not 1 <= port <= 65535:
        raise ConfigError(f"environment variable MASTER_PORT={port} must be a port number (1..65535)")
    agent_store = launcher == "torchrun" and environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    use_libuv = environ.get("USE_LIBUV", "1") == "1"
    return DistInfo(
        rank, local_rank, world, local_world, node_rank, master, port, launcher, agent_store, use_libuv
    )


def smddp_importable() -> bool:
    """Import SMDDP's torch module (which registers the "smddp" backend); False when it is absent."""
    try:
        importlib.import_module(SMDDP_MODULE)
    except ImportError:
        return False
    return True


def resolve(
    requested: str,
    cuda_available: bool,
    smddp_available: bool | Callable[[], bool],
    *,
    prefer_smddp: bool = False,
) -> tuple[str, str]:
    """The one decision of backend and device type: (backend, "cuda" | "cpu").

    auto → smddp when SMDDP imports and CUDA is present, else nccl on CUDA, else gloo; under mpirun
    (`prefer_smddp`: SageMaker's SMDDP distribution) auto → smddp whenever SMDDP imports (the CPU stand-in
    too). The device is CUDA for nccl/smddp on a CUDA machine, else the CPU. `smddp_available` may be a
    callable (e.g. `smddp_importable`): it is called only when the answer matters.
    """
    if requested not in ("auto", "smddp", "nccl", "gloo"):
        raise ConfigError(f"--backend={requested!r} must be one of auto, smddp, nccl, gloo")
    wants_smddp = requested == "smddp" or (requested == "auto" and (cuda_available or prefer_smddp))
    smddp = (smddp_available() if callable(smddp_available) else smddp_available) if wants_smddp else False
    if requested == "auto":
        backend = "smddp" if smddp else "nccl" if cuda_available else "gloo"
    elif requested == "smddp" and not smddp:
        raise ConfigError(
            f"--backend smddp: the SMDDP library ({SMDDP_MODULE}) is not installed in this image. "
            f"It ships only in {SMDDP_DLCS}. Use --backend nccl (or auto) on other images."
        )
    elif requested == "nccl" and not cuda_available:
        raise ConfigError("--backend nccl needs CUDA GPUs; none is visible here (use gloo or auto)")
    else:
        backend = requested
    device_type = "cuda" if cuda_available and backend in ("nccl", "smddp") else "cpu"
    return backend, device_type


# ------------------------------------------------------------------------------------- process state

_state: dict[str, Any] = {"rank": 0, "world_size": 1, "backend": None, "device": None}


def init(info: DistInfo, backend: str, device_type: str, timeout_s: float) -> Any:
    """Select the device and, when launched by torchrun/mpirun, join the default process group.

    `backend` and `device_type` come from `resolve`. Returns the torch.device for this rank:
    cuda:local_rank for "cuda", else the CPU (the smddp test stand-in runs on CPU).
    """
    import torch
    import torch.distributed as dist

    if device_type == "cuda":
        torch.cuda.set_device(info.local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    _state.update(rank=info.rank, world_size=info.world_size, backend=backend, device=device)
    if not info.distributed:
        return device
    if backend == "smddp":
        smddp_importable()  # registers the backend
    # Our own TCPStore: SMDDP's mpirun launcher exports neither RANK nor MASTER_*, and torch's env://
    # client ignores USE_LIBUV under torchrun. Rank 0 hosts the store unless torchrun's agent does.
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(
        info.master_addr,
        info.master_port,
        info.world_size,
        is_master=info.rank == 0 and not info.agent_store,
        timeout=timeout,
        use_libuv=info.use_libuv,
    )
    dist.init_process_group(
        backend=backend, store=store, rank=info.rank, world_size=info.world_size, timeout=timeout
    )
    return device


def is_initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return int(_state["rank"])


def world_size() -> int:
    return int(_state["world_size"])


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    """Wait for every rank (no device_ids: SMDDP rejects them)."""
    if is_initialized():
        import torch.distributed as dist

        dist.barrier()


def all_reduce_sum(tensor: Any) -> Any:
    """In-place sum over ranks; returns the tensor."""
    if is_initialized():
        import torch.distributed as dist

        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_mean(tensor: Any) -> Any:
    """In-place mean over ranks (sum then divide: SMDDP and Gloo lack ReduceOp.AVG); returns the tensor."""
    if is_initialized():
        all_reduce_sum(tensor)
        tensor.div_(world_size())
    return tensor


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s picklable object on every rank (trusted: it comes from our own rank 0)."""
    if not is_initialized():
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src, device=_state["device"])
    return box[0]


def destroy() -> None:
    if is_initialized():
        import torch.distributed as dist

        dist.destroy_process_group()
    _state.update(rank=0, world_size=1, backend=None, device=None)


# ------------------------------------------------------------------------------- sharded validation


def all_gather_rows(tensor: Any) -> list[Any]:
    """Every rank's `tensor` [n_r, ...] (n_r may differ between ranks; the other dimensions and the dtype
    may not), in rank order, on every rank, on the CPU.

    Two all_gathers on the default group (what SMDDP supports): the row counts, then the tensors zero-padded
    to the longest. Runs on this rank's device (CUDA for nccl/smddp). Not initialized → [tensor].
    """
    if not is_initialized():
        return [tensor.cpu()]
    import torch
    import torch.distributed as dist

    device = _state["device"] or torch.device("cpu")
    count = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=device)
    counts = [torch.zeros_like(count) for _ in range(world_size())]
    dist.all_gather(counts, count)
    sizes = [int(c.item()) for c in counts]
    padded = torch.zeros((max(sizes), *tensor.shape[1:]), dtype=tensor.dtype, device=device)
    padded[: tensor.shape[0]] = tensor.to(device)
    gathered = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(gathered, padded)
    return [g[:n].cpu() for g, n in zip(gathered, sizes)]


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is true on any rank (one all_reduce; plain `flag` when alone)."""
    if not is_initialized():
        return flag
    import torch

    value = torch.tensor([1.0 if flag else 0.0], device=_state["device"] or torch.device("cpu"))
    return bool(all_reduce_sum(value).item() > 0)


def broadcast_module(module: Any, src: int = 0) -> Any:
    """Copy rank `src`'s parameters and buffers into `module` on every rank, in place (module on this
    rank's device; same architecture everywhere). Returns the module."""
    if not is_initialized():
        return module
    import torch.distributed as dist

    for tensor in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(tensor.data, src=src)
    return module


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's picklable `obj`, in rank order, on every rank (trusted: our own ranks' objects).
    torch's all_gather_object: an all_gather of the sizes, then of the padded bytes. Alone → [obj]."""
    if not is_initialized():
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out
