"""Everything distributed: where this process sits (rank/world from torchrun or Open MPI), which backend
to use (smddp / nccl / gloo), process-group init and teardown; the collectives are in collectives.py.

This is the ONLY module that imports `smdistributed` or reads RANK / LOCAL_RANK / WORLD_SIZE / OMPI_* /
SMDATAPARALLEL_* / SAGEMAKER_INSTANCE_TYPE. The sources of the SMDDP facts used here are in docs/CLUSTER.md.
Rules kept for SMDDP's sake everywhere: `barrier()` never takes `device_ids`, and no sub-group is ever
created (`new_group` breaks SMDDP); every collective runs on the default group.
"""

from __future__ import annotations

import datetime
import faulthandler
import gc
import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from yolov5_smddp.dlc import SMDDP_DLCS, SMDDP_OPTIMISED_INSTANCE_TYPES
from yolov5_smddp.errors import ConfigError

SMDDP_MODULE = "smdistributed.dataparallel.torch.torch_smddp"
DEFAULT_MASTER_PORT = 7777  # the port the SageMaker PyTorch toolkit exports
SMDDP_LAUNCH_FLAGS = ("SMDATAPARALLEL_USE_SINGLENODE", "SMDATAPARALLEL_USE_HOMOGENEOUS")
"""The toolkit's SMDDP runner (distributions `smdistributed` and `pytorchddp`) exports one of these to every
rank it starts with mpirun + smddprun (one node: SINGLENODE, several: HOMOGENEOUS)."""
SMDDP_INSTANCE_TYPES = frozenset(SMDDP_OPTIMISED_INSTANCE_TYPES)
"""Where `--backend auto` picks SMDDP: the types AWS lists with SMDDP's optimisations (dlc.py holds the one
list). ml.p3dn.24xlarge runs SMDDP "without its optimisations" (so NCCL, with nothing to gain from SMDDP
there) and its V100s have no bf16."""

log = logging.getLogger(__name__)


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
    smddp_launch: bool = False
    """Started by the SageMaker toolkit's SMDDP runner (mpirun + smddprun: SMDATAPARALLEL_USE_* set)."""
    instance_type: str | None = None
    """The SageMaker instance type ("ml.p4d.24xlarge"), None when unknown (no SageMaker job)."""

    @property
    def distributed(self) -> bool:
        return self.launcher != "none"

    @property
    def launch(self) -> str:
        """How this process was started, as the backend decision sees it: "smddprun" (the SMDDP runner's
        mpirun), "mpirun" (any other mpirun), "torchrun" (torch's elastic agent: torchrun or our elastic
        launcher) or "none"."""
        return "smddprun" if self.smddp_launch else self.launcher

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
    instance_type: str | None = None,
) -> DistInfo:
    """Where this process sits: torch's elastic agent's variables, else Open MPI's, else a single process.
    The one reader of RANK / LOCAL_RANK / WORLD_SIZE / GROUP_RANK / OMPI_* / MASTER_ADDR / MASTER_PORT /
    SMDATAPARALLEL_* / SAGEMAKER_INSTANCE_TYPE.

    torch's agent (torchrun, our elastic launcher) marks its workers with TORCHELASTIC_RUN_ID: their
    RANK / LOCAL_RANK / LOCAL_WORLD_SIZE are authoritative (an outer mpirun's OMPI_* would be wrong for
    them). Otherwise Open MPI's variables win whenever present: smddprun may export RANK / WORLD_SIZE
    without LOCAL_*, and OMPI_COMM_WORLD_LOCAL_RANK / LOCAL_SIZE are then the local place (rank 9 of
    2 x 8 is local rank 1 of 8, not 9 of 16). RANK / WORLD_SIZE alone (no agent, no Open MPI) are read
    as torchrun's.

    Open MPI exports OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}; its OMPI_COMM_WORLD_NODE_RANK is a
    per-node rank across all jobs, not a node index. mpirun (the SageMaker toolkit's `--host algo-1:N,...`)
    places ranks host by host, N per host, so the node index is rank // local size and the host count
    size // local size (homogeneous hosts, as SageMaker jobs are).

    `hosts_in_job` (the caller's count of the job's hosts, e.g. SageMaker's) replaces Open MPI's local size
    under mpirun: the SageMaker toolkit's mpirun forwards its own environment and, in the local stand-in,
    Open MPI counts both ranks of a 2 x 1 job as local (LOCAL_SIZE=2, LOCAL_RANK=1 on algo-2), so
    local size = size // hosts and local rank = rank % local size there.

    The master: MASTER_ADDR, else SMDATAPARALLEL_SERVER_ADDR (the SMDDP runner's first host, exported to
    every rank of a multi-node job), else `default_master` (a host name, or a callable returning one, e.g.
    the first SageMaker host; the caller owns where that comes from, this module never reads /opt/ml).
    The port: MASTER_PORT, else 7777 on every rank. The toolkit exports MASTER_PORT=7777 only to the first
    host's ranks (mpirun forwards only its `-x` variables over ssh), so every rank must arrive at 7777 by
    itself; SMDDP's own server listens on SMDATAPARALLEL_SERVER_PORT (7592), clear of it.

    `instance_type`: the SageMaker instance type the caller knows (SM_CURRENT_INSTANCE_TYPE);
    SAGEMAKER_INSTANCE_TYPE, which the SMDDP runner exports to multi-node ranks, comes first.
    """
    ompi = "OMPI_COMM_WORLD_RANK" in environ
    torch_agent = "TORCHELASTIC_RUN_ID" in environ
    if "RANK" in environ and "WORLD_SIZE" in environ and (torch_agent or not ompi):
        rank, world = _int(environ, "RANK"), _int(environ, "WORLD_SIZE")
        local_rank = _int(environ, "LOCAL_RANK", rank)
        local_world = _int(environ, "LOCAL_WORLD_SIZE", world)
        node_rank = _int(environ, "GROUP_RANK", rank // max(local_world, 1))
        launcher = "torchrun"
    elif ompi:
        rank, world = _int(environ, "OMPI_COMM_WORLD_RANK"), _int(environ, "OMPI_COMM_WORLD_SIZE")
        for name, value in (("RANK", rank), ("WORLD_SIZE", world)):
            if name in environ and _int(environ, name) != value:
                raise ConfigError(
                    f"environment variable {name}={environ[name]} disagrees with Open MPI's "
                    f"OMPI_COMM_WORLD_{'RANK' if name == 'RANK' else 'SIZE'}={value}"
                )
        local_rank = _int(environ, "OMPI_COMM_WORLD_LOCAL_RANK", _int(environ, "LOCAL_RANK", rank))
        local_world = _int(environ, "OMPI_COMM_WORLD_LOCAL_SIZE", _int(environ, "LOCAL_WORLD_SIZE", world))
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
    master = environ.get("MASTER_ADDR") or environ.get("SMDATAPARALLEL_SERVER_ADDR") or None
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
    smddp_launch = launcher == "mpirun" and any(environ.get(flag) == "1" for flag in SMDDP_LAUNCH_FLAGS)
    instance_type = environ.get("SAGEMAKER_INSTANCE_TYPE") or instance_type or None
    return DistInfo(
        rank,
        local_rank,
        world,
        local_world,
        node_rank,
        master,
        port,
        launcher,
        agent_store,
        use_libuv,
        smddp_launch,
        instance_type,
    )


def smddp_environment(info: DistInfo, environ: Mapping[str, str]) -> dict[str, str]:
    """What SMDDP reads that the launch may not have exported (pure): SAGEMAKER_INSTANCE_TYPE (the runner
    exports it only to multi-node jobs; AWS's own SMDDP tests set it when it is missing). Set before the
    library is imported (`smddp_importable`)."""
    if info.instance_type and "SAGEMAKER_INSTANCE_TYPE" not in environ:
        return {"SAGEMAKER_INSTANCE_TYPE": info.instance_type}
    return {}


def smddp_importable() -> bool:
    """Import SMDDP's torch module (which registers the "smddp" backend); False when it is absent."""
    try:
        importlib.import_module(SMDDP_MODULE)
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class BackendChoice:
    """The backend, the device type it runs on ("cuda" | "cpu"), and why (one clause for the log)."""

    backend: str
    device_type: str
    reason: str

    def log_line(self) -> str:
        return f"backend {self.backend} on {self.device_type}: {self.reason}"


_SMDDP_MISSING = (
    f"the SMDDP library ({SMDDP_MODULE}) is not installed in this image; it ships only in {SMDDP_DLCS}"
)


def choose_backend(
    requested: str,
    *,
    cuda: bool,
    launch: str,
    instance_type: str | None,
    nnodes: int,
    smddp_available: bool | Callable[[], bool],
) -> BackendChoice:
    """The backend decision (pure; `smddp_available` may be a callable, asked only when the answer
    depends on it). `launch` is DistInfo.launch: "smddprun" | "mpirun" | "torchrun" | "none".

    auto: gloo without CUDA; on CUDA smddp only under the SMDDP runner's launch, on more than one node,
    on an instance type in SMDDP_INSTANCE_TYPES, with the library present; nccl on every other CUDA job
    (AWS: SMDDP's AllReduce needs the mpirun-based launch, and on one node it is slower than NCCL).
    smddp asked for: a ConfigError naming why where it cannot work (the library absent; a CUDA job not
    started by the SMDDP runner, where its AllReduce is not supported). Without CUDA only the test stand-in
    imports as SMDDP, and it is let through so the CPU suites run the smddp paths.
    """
    if requested not in ("auto", "smddp", "nccl", "gloo"):
        raise ConfigError(f"--backend={requested!r} must be one of auto, smddp, nccl, gloo")
    device = "cuda" if cuda else "cpu"

    def available() -> bool:
        return smddp_available() if callable(smddp_available) else smddp_available

    if requested == "gloo":
        return BackendChoice("gloo", "cpu", "--backend gloo")
    if requested == "nccl":
        if not cuda:
            raise ConfigError("--backend nccl needs CUDA GPUs; none is visible here (use gloo or auto)")
        return BackendChoice("nccl", "cuda", "--backend nccl")
    if requested == "smddp":
        if cuda and launch != "smddprun":
            raise ConfigError(
                f"--backend smddp: this job was started by {launch}, and SMDDP's AllReduce runs only under "
                "SageMaker's mpirun launch of the distribution smdistributed (or pytorchddp). "
                "Use --backend nccl (or auto), or launch with that distribution."
            )
        if not available():
            raise ConfigError(
                f"--backend smddp: {_SMDDP_MISSING}. Use --backend nccl (or auto) on other images."
            )
        notes = []
        if nnodes < 2:
            notes.append("one node, where AWS finds NCCL faster")
        if cuda and instance_type not in SMDDP_INSTANCE_TYPES:
            notes.append(f"{instance_type or 'an unknown instance type'} is not one SMDDP is optimised for")
        return BackendChoice("smddp", device, "; ".join(["--backend smddp", *notes]))
    # auto
    if not cuda:
        return BackendChoice("gloo", "cpu", "auto: no CUDA device")
    if launch != "smddprun":
        reason = f"auto: started by {launch}, not by SageMaker's SMDDP launch (distribution smdistributed)"
    elif nnodes < 2:
        reason = "auto: one node, where AWS finds SMDDP slower than NCCL"
    elif instance_type not in SMDDP_INSTANCE_TYPES:
        supported = ", ".join(sorted(SMDDP_INSTANCE_TYPES))
        reason = f"auto: {instance_type or 'unknown instance type'} is not one SMDDP supports ({supported})"
    elif not available():
        reason = f"auto: {_SMDDP_MISSING}"
    else:
        return BackendChoice("smddp", "cuda", f"auto: SMDDP launch on {nnodes} x {instance_type}")
    return BackendChoice("nccl", "cuda", reason)


def resolve(requested: str, info: DistInfo, cuda_available: bool) -> tuple[str, str]:
    """The one decision of backend and device type for this process: (backend, "cuda" | "cpu"), and its
    reason in one log line on rank 0 (`choose_backend`). Before SMDDP is imported, the variables it reads
    that the launch left out are set (`smddp_environment`)."""

    def library() -> bool:
        os.environ.update(smddp_environment(info, os.environ))
        return smddp_importable()

    choice = choose_backend(
        requested,
        cuda=cuda_available,
        launch=info.launch,
        instance_type=info.instance_type,
        nnodes=info.nnodes,
        smddp_available=library,
    )
    if info.rank == 0:
        log.info("%s", choice.log_line())
    return choice.backend, choice.device_type


# ------------------------------------------------------------------------------------- process state

_state: dict[str, Any] = {"rank": 0, "world_size": 1, "backend": None, "device": None, "store": None}


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
    # Imported before the group exists, so that its functions' `group=group.WORLD` defaults bind None:
    # imported after (DDP's constructor imports torch._dynamo, which imports it), they would hold the
    # default group for the life of the process, destroy_process_group() would never free the backend,
    # and its worker threads would outlive teardown (see _destroy_process_group).
    import torch.distributed.nn.functional  # noqa: F401

    # Our own TCPStore: SMDDP's mpirun launcher exports neither RANK nor MASTER_*, and torch's env://
    # client ignores USE_LIBUV under torchrun. Rank 0 hosts the store unless torchrun's agent does.
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store = dist.TCPStore(
            info.master_addr,
            info.master_port,
            info.world_size,
            is_master=info.rank == 0 and not info.agent_store,
            timeout=timeout,
            use_libuv=info.use_libuv,
        )
    except RuntimeError as exc:
        busy = port_in_use(exc, info.master_addr, info.master_port)  # a busy master port: one line, exit 2
        if busy is None:
            raise
        raise busy from exc
    dist.init_process_group(
        backend=backend, store=store, rank=info.rank, world_size=info.world_size, timeout=timeout
    )
    _state.update(store=store, store_host=None if info.agent_store else 0)  # for teardown()
    from yolov5_smddp.distributed import liveness  # a hung rank is named when a collective fails (issue 50)

    liveness.start(store, info.rank, info.world_size, timeout_s)
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
    """In-place sum over ranks of a float32 tensor (the one dtype on SMDDP's wire: see the collectives
    below); returns the tensor."""
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


def destroy() -> None:
    """Leave the process group now (no final barrier, no watchdog: see teardown() for the end of a job)."""
    if is_initialized():
        _destroy_process_group()
    _forget()


def wire_device() -> Any:
    """The device collectives put their tensors on: this rank's device once the group exists, else the CPU."""
    import torch

    return _state["device"] or torch.device("cpu")


def _forget() -> None:
    _state.update(rank=0, world_size=1, backend=None, device=None, store=None, store_host=None)


# ------------------------------------------------------------------------------------------- teardown
#
# The end of a distributed job must not hang (issue 10). What hung: torch 2.6 (this image's; the DLCs'
# 2.3-2.5 share the code; fixed upstream by pytorch/pytorch#154976) destroys the ProcessGroup wrapper
# with the GIL held, and the Gloo backend's destructor joins its worker threads. A worker thread still
# dropping its reference to the last finished collective frees that collective's tensors, and a tensor
# whose Python object Python had already let go of needs the GIL to be freed: each thread waits for
# the other, forever. The worker is only that late when the CPU is busy. The backend classes
# (ProcessGroupGloo, ProcessGroupNCCL) are bound so that their destructor releases the GIL: holding our
# own reference to the backends across destroy_process_group() and dropping it afterwards runs the
# blocking destructor without the GIL.
#
# On top of that fix: a final barrier (no rank tears down while another still runs collectives), the
# TCPStore's host (rank 0 under mpirun and our stand-in; torchrun's agent otherwise) leaves last, and
# a watchdog bounds the whole teardown.

TEARDOWN_LIMIT_S = 45.0
"""After a successful run, a rank still tearing down after this long is ended by the watchdog with
the run's exit code (its outputs are written): every rank exits within 60 s of the end of the run."""
FAILED_TEARDOWN_LIMIT_S = 30.0
"""After a failure, the teardown is abandoned after this long (the exception then goes on its way)."""
STORE_HOST_WAIT_S = 20.0
"""How long the rank that hosts the TCPStore waits for the others to say they have left."""
BACKSTOP_S = 10.0
"""faulthandler's own thread (it needs no GIL) dumps every stack and ends the process (exit code 1)
this long after a limit, should the watchdog itself be unable to run."""
EXIT_BACKSTOP_S = 60.0
"""After an abandoned teardown, the process ends (exit code 1) at the latest this long later."""
TEARDOWN_DONE_KEY = "yolov5_smddp/teardown/left"


def teardown(exit_code: int | None, *, limit_s: float | None = None) -> None:
    """End this rank's part in the job: final barrier, leave the process group, the store's host
    leaves last, all bounded. `exit_code` is the run's exit code (its outputs are written), or None
    when the run failed (an exception is on its way out: no barrier, no waiting for peers).

    After a success, a teardown that overruns its limit ends the process: one log line, MPI finalized
    when it is initialised (`finalize_mpi`), then os._exit(exit_code). After a failure it is abandoned with a log line (the caller goes on to
    report the failure) and the process is made to end within EXIT_BACKSTOP_S.
    """
    if not is_initialized():
        _forget()
        return
    from yolov5_smddp.distributed import liveness

    liveness.stop()  # no heartbeat into a store being closed
    succeeded = exit_code is not None
    limit = limit_s if limit_s is not None else TEARDOWN_LIMIT_S if succeeded else FAILED_TEARDOWN_LIMIT_S
    where, main, started = f"rank {rank()} of {world_size()}", is_main(), time.monotonic()
    finished = run_bounded(on_device(_state.get("device"), lambda: _leave(succeeded)), limit)
    _forget()
    if finished:
        if main:
            log.info("left the process group in %.1f s", time.monotonic() - started)
        return
    if exit_code is not None:
        log.warning(
            "teardown watchdog: %s did not finish leaving the process group in %.0f s; its outputs "
            "are written, ending the process with exit code %d",
            where,
            limit,
            exit_code,
        )
        _flush_outputs()
        finalize_mpi()
        os._exit(exit_code)
    log.warning(
        "teardown watchdog: %s failed and did not finish leaving the process group in %.0f s; "
        "abandoned (the process ends within %.0f s)",
        where,
        limit,
        EXIT_BACKSTOP_S,
    )
    faulthandler.dump_traceback_later(EXIT_BACKSTOP_S, exit=True)


def on_device(device: Any, work: Callable[[], None]) -> Callable[[], None]:
    """`work` made to run on this rank's CUDA device in whatever thread calls it: a new thread starts on
    device 0, and the final barrier's CUDA tensor and NCCL's teardown must be on the rank's own device."""

    def run() -> None:
        if device is not None and getattr(device, "type", None) == "cuda":
            import torch

            torch.cuda.set_device(device)
        work()

    return run


def run_bounded(work: Callable[[], None], limit_s: float, *, backstop_s: float = BACKSTOP_S) -> bool:
    """Run `work` in a daemon thread; True when it finished within `limit_s` (an exception it raised
    is logged, not raised), False when it is still running (it is left to run).

    While waiting, faulthandler's thread is armed `backstop_s` after the limit: a `work` that never
    releases the GIL (so that this thread cannot even notice the limit) still ends the process, with
    every thread's stack on stderr and exit code 1.
    """
    failure: list[BaseException] = []

    def target() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - reported by the waiting thread
            failure.append(exc)

    thread = threading.Thread(target=target, name="yolov5-smddp-teardown", daemon=True)
    faulthandler.dump_traceback_later(limit_s + backstop_s, exit=True)
    try:
        thread.start()
        thread.join(limit_s)
    finally:
        faulthandler.cancel_dump_traceback_later()
    if thread.is_alive():
        return False
    if failure:
        log.warning("teardown: %s", failure[0], exc_info=failure[0])
    return True


def _leave(succeeded: bool) -> None:
    store, host, me, world = _state.get("store"), _state.get("store_host"), rank(), world_size()
    if succeeded:
        try:
            barrier()  # final: nobody tears down while another rank still runs a collective
        except Exception as exc:  # a peer that died after the run: leave without it
            log.warning("teardown: the final barrier failed on rank %d: %s", me, exc)
            succeeded = False
    _destroy_process_group()
    if succeeded and store is not None and host is not None:
        _host_leaves_last(store, me == host, me, world, STORE_HOST_WAIT_S)


def finalize_mpi(limit_s: float = BACKSTOP_S) -> bool:
    """Finalize MPI when this process initialised it and has not finalized it; True when it did.

    Under `python -m mpi4py` (the SMDDP launch) mpi4py finalizes MPI at interpreter exit, which os._exit
    skips; Open MPI's mpirun then counts the rank as ended without MPI_Finalize and fails the job whatever
    its exit code. MPI_Finalize waits for the other ranks, so faulthandler bounds it: after `limit_s` every
    stack goes to stderr and the process ends with exit code 1. Only an mpi4py that is already imported
    is used (never imported here: importing it would initialise MPI).
    """
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return False
    try:
        if not mpi.Is_initialized() or mpi.Is_finalized():
            return False
        faulthandler.dump_traceback_later(limit_s, exit=True)
        try:
            mpi.Finalize()
        finally:
            faulthandler.cancel_dump_traceback_later()
    except Exception as exc:  # noqa: BLE001 - about to exit; a failed finalize must not stop that
        log.warning("teardown: MPI_Finalize failed: %s", exc)
        return False
    return True


def _flush_outputs() -> None:
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - about to exit; a broken handler must not stop that
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def _destroy_process_group() -> None:
    """destroy_process_group() with the backends' (blocking) destructors run without the GIL.

    That only holds when our reference is the backend's last one. Two things used to hold others
    (a Gloo rank aborted at exit, "terminate called without an active exception", CI of stop 47):
    a finished DistributedDataParallel, which sits in a reference cycle (its Reducer holds the group)
    until the garbage collector runs, collected here while the group is still registered; and the
    `group=group.WORLD` defaults of torch.distributed.nn.functional, imported before the group exists
    by init(). Otherwise the backend outlives this call: its worker threads keep running, a later
    collection destroys it with the GIL held (issue 10's hang), or the interpreter's finalization finds
    a worker thread still letting go of a finished collective's tensors, which needs the GIL, and the
    process aborts (SIGABRT) after its outputs are written.
    """
    import torch
    import torch.distributed as dist

    gc.collect()
    group = dist.group.WORLD
    backends = []
    for device_type in ("cpu", "cuda"):
        try:
            backends.append(group._get_backend(torch.device(device_type)))
        except (RuntimeError, ValueError):
            pass
    del group
    dist.destroy_process_group()
    backends.clear()  # the last references: each destructor releases the GIL, then joins its threads


def _host_leaves_last(store: Any, is_host: bool, me: int, world: int, wait_s: float) -> None:
    """The other ranks say they have left; the store's host waits (at most `wait_s`) until all have."""
    if not is_host:
        try:
            store.add(TEARDOWN_DONE_KEY, 1)
        except Exception as exc:  # noqa: BLE001 - the host is gone already: nothing left to tell
            log.debug("teardown: could not tell the store's host: %s", exc)
        return
    deadline = time.monotonic() + wait_s
    while (left := store.add(TEARDOWN_DONE_KEY, 0)) < world - 1:
        if time.monotonic() >= deadline:
            log.warning(
                "teardown: %d of %d other ranks had not left after %.0f s; rank %d leaves anyway",
                world - 1 - left,
                world - 1,
                wait_s,
                me,
            )
            return
        time.sleep(0.05)


def port_in_use(exc: BaseException, addr: str, port: int) -> ConfigError | None:
    """The one-line ConfigError for a store that could not listen on a busy master port; None for any
    other error."""
    text = str(exc)
    if "EADDRINUSE" not in text and "address already in use" not in text.lower():
        return None
    return ConfigError(
        f"the master port {port} on {addr} is already in use (another job or process listens there): "
        "give a free one with --master-port (or MASTER_PORT), or end that process"
    )
