"""How the training workers start: a pure decision from the environment, and torch's elastic launcher.

`decide_launch(info, ...)` picks one of (`info`: distributed.detect_dist_info, the one reader of the
launcher's variables):
- "torchrun": started by torchrun (RANK/WORLD_SIZE/LOCAL_RANK set) -> this process is one worker.
- "mpirun":   started by mpirun (OMPI_COMM_WORLD_* set; SageMaker's SMDDP distribution) -> this process
              is one worker; the backend is distributed.choose_backend's (smddp under the SMDDP
              runner on several p4d/p4de nodes, else nccl on CUDA, gloo on CPU).
- "single":   one host and one worker (one GPU, or a CPU host) -> run the worker in this process.
- "elastic":  SageMaker started one process per host without a distribution -> start `nproc_per_node`
              workers here with torch.distributed.launcher.api.elastic_launch and a static rendezvous that
              joins all hosts (node rank = index of this host, master = first host).

`python -m yolov5_smddp.launch --config-json JSON` is the worker command the elastic launcher runs: the
driver's parsed TrainConfig (worker_config.to_json), checked when read back, trained by
`yolov5_smddp.commands.train.run_config`, with its exception recorded for the agent.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from yolov5_smddp import problems, torch_patches
from yolov5_smddp.commands.train import run_config
from yolov5_smddp.config import worker_config
from yolov5_smddp.config.train_config import TrainConfig
from yolov5_smddp.distributed import blame
from yolov5_smddp.distributed.process_group import DistInfo, port_in_use
from yolov5_smddp.errors import EXIT_INTERRUPTED, ConfigError, WorkerFailed

MODES = ("torchrun", "mpirun", "single", "elastic")


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """How to run the workers of this host."""

    mode: str
    """One of MODES."""
    nnodes: int
    nproc_per_node: int
    node_rank: int
    master_addr: str
    master_port: int
    local_rank: int = 0
    """This process's local rank under torchrun/mpirun (0 otherwise)."""

    @property
    def in_process(self) -> bool:
        return self.mode != "elastic"

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


def _positive_int(value: str | int | None, what: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError as exc:
        raise ConfigError(f"{what}={value!r} is not an integer") from exc
    if number < 1:
        raise ConfigError(f"{what}={value!r} must be >= 1")
    return number


def decide_launch(
    info: DistInfo,
    *,
    hosts: Sequence[str],
    current_host: str,
    num_gpus: int,
    nproc_per_node: str | int | None = None,
    master_port: str | int | None = None,
) -> LaunchPlan:
    """The launch for this process (pure: a function of its arguments only).

    `info` is `distributed.detect_dist_info(environ, default_master=hosts[0])`: under torchrun or mpirun
    this process is one worker and `info` says where it sits (node index included); otherwise this host
    starts its workers. `nproc_per_node` (the `--nproc-per-node` option) overrides one worker per GPU (one on
    CPU hosts); `master_port` (`--master-port`) overrides MASTER_PORT. Raises ConfigError for a
    non-integer or non-positive count or port, or an unknown host.
    """
    if current_host not in hosts:
        raise ConfigError(f"current host {current_host!r} is not among the hosts {list(hosts)}")
    port = _positive_int(master_port, "--master-port") or info.master_port
    if info.launcher in ("torchrun", "mpirun"):
        return LaunchPlan(
            mode=info.launcher,
            nnodes=info.nnodes,
            nproc_per_node=info.local_world_size,
            node_rank=info.node_rank,
            master_addr=info.master_addr,
            master_port=port,
            local_rank=info.local_rank,
        )
    nproc = _positive_int(nproc_per_node, "--nproc-per-node") or max(num_gpus, 1)
    mode = "single" if len(hosts) == 1 and nproc == 1 else "elastic"
    return LaunchPlan(
        mode=mode,
        nnodes=len(hosts),
        nproc_per_node=nproc,
        node_rank=list(hosts).index(current_host),
        master_addr=info.master_addr,
        master_port=port,
    )


def elastic_config(plan: LaunchPlan, *, run_id: str, rdzv_timeout_s: int = 900) -> dict:
    """Keyword arguments of torch's `LaunchConfig` for `plan` (pure; exact-value tested).

    Static rendezvous: every host knows its rank, node 0 hosts the TCPStore on master:port. No restarts:
    a failed worker fails the job (the others stop within the collective timeout).
    """
    return {
        "min_nodes": plan.nnodes,
        "max_nodes": plan.nnodes,
        "nproc_per_node": plan.nproc_per_node,
        "run_id": run_id,
        "role": "trainer",
        "rdzv_backend": "static",
        "rdzv_endpoint": f"{plan.master_addr}:{plan.master_port}",
        "rdzv_configs": {"rank": plan.node_rank, "timeout": rdzv_timeout_s},
        "max_restarts": 0,
        "monitor_interval": 1.0,
        "start_method": "spawn",
    }


CONFIG_OPTION = "--config-json"


def worker_command(config: TrainConfig) -> tuple[str, list[str]]:
    """(program, arguments) of one elastic worker: this interpreter running this module on `config`."""
    return sys.executable, ["-m", "yolov5_smddp.launch", CONFIG_OPTION, worker_config.to_json(config)]


def read_worker_args(argv: Sequence[str]) -> TrainConfig:
    """The TrainConfig of `worker_command`'s arguments; ConfigError for anything else."""
    if len(argv) != 2 or argv[0] != CONFIG_OPTION:
        raise ConfigError(
            f"python -m yolov5_smddp.launch takes {CONFIG_OPTION} JSON (the elastic launcher's worker "
            f"command), got {len(argv)} argument(s); run `yolov5-smddp train` instead"
        )
    return worker_config.from_json(argv[1], source=f"worker option {CONFIG_OPTION}")


def run_elastic(plan: LaunchPlan, config: TrainConfig, *, run_id: str, environ: Mapping[str, str]) -> int:
    """Start this host's workers with the environment `environ` and wait for all of them. Returns 0, or
    EXIT_INTERRUPTED when SIGTERM stopped them (the agent passes it on; the trainer checkpoints); raises
    WorkerFailed naming the first failed worker."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    program, args = worker_command(config)
    cgroup = blame.own_memory_cgroup()
    oom_before = blame.oom_kills(cgroup)
    # USE_LIBUV=0: a torch built without libuv (Debian's, in the local stand-in); the static rendezvous
    # ignores the variable and would fail at once
    store = torch_patches.static_store_without_libuv() if environ.get("USE_LIBUV") == "0" else nullcontext()
    try:
        # torch's agent gives its workers a copy of os.environ; after a SIGTERM it waits SIGTERM_GRACE_S
        # for them (their checkpoint and model folder), not its own 30 s
        with _process_environment(environ), store, torch_patches.agent_waits_after_sigterm(SIGTERM_GRACE_S):
            elastic_launch(LaunchConfig(**elastic_config(plan, run_id=run_id)), program)(*args)
    except SignalException:
        return EXIT_INTERRUPTED
    except ChildFailedError as exc:
        chosen = blame.blame([_failed(rank, failure) for rank, failure in exc.failures.items()])
        oom_after = blame.oom_kills(cgroup)
        oom_killed = oom_before is not None and oom_after is not None and oom_after > oom_before
        raise WorkerFailed(
            f"training worker rank {chosen.rank} on host {socket.gethostname()} (node {plan.node_rank} of "
            f"{plan.nnodes}) {blame.cause_words(chosen, oom_killed=oom_killed)}",
            chosen.exitcode,
        ) from exc
    except RuntimeError as exc:  # torch's DistNetworkError: the rendezvous store could not listen
        busy = port_in_use(exc, plan.master_addr, plan.master_port)
        if busy is None:
            raise
        raise busy from exc
    return 0


def _failed(rank: int, failure) -> blame.Failed:
    """torch's ProcessFailure as blame.Failed (its message: the worker's recorded error, or empty)."""
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    text = " ".join(str(message or "").split())
    if "To enable traceback" in text or text.startswith("Signal "):
        text = ""
    return blame.Failed(rank, int(failure.exitcode), text, int(getattr(failure, "timestamp", 0) or 0))


SIGTERM_GRACE_S = 115.0
"""How long the elastic agent waits for its workers after a SIGTERM before it kills them: SageMaker's
SIGKILL comes 120 s after its SIGTERM."""


@contextmanager
def _process_environment(environ: Mapping[str, str]) -> Iterator[None]:
    """os.environ is exactly `environ` inside the block and what it was before after it."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _run_worker(argv: list[str]) -> int:
    """One elastic worker. A known problem (bad input, an output that cannot be written, memory) is one
    line on stderr and in the agent's error file, and exit 2, as in one process; anything else raises
    (torch's `record` writes its traceback for the agent)."""
    try:
        return run_config(read_worker_args(argv))
    except Exception as exc:
        if not problems.is_known_problem(exc):
            raise
        line = problems.error_line(exc)
        print(line, file=sys.stderr, flush=True)
        write_error_file(os.environ.get("TORCHELASTIC_ERROR_FILE"), line.removeprefix("error: "))
        return problems.exit_code(exc)


def write_error_file(path: str | None, message: str) -> None:
    """The agent's error file for this worker (torch elastic's format: a message and its time), which the
    launching side's failure reason quotes; nothing without a path."""
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"message": message, "timestamp": int(time.time())}, handle)
    except OSError as exc:
        print(f"could not write the worker's error file {path}: {exc}", file=sys.stderr, flush=True)


def _worker_main(argv: Sequence[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    return int(record(_run_worker)(list(argv)) or 0)


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
