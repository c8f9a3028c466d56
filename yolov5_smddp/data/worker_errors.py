"""What a failed DataLoader worker means, in words a user can act on.

A loader worker that dies (SIGKILL from the out-of-memory killer, SIGBUS when /dev/shm — which carries
every batch from the workers to the trainer — is full) or cannot write a batch into shared memory
surfaces in torch as a bare RuntimeError ("DataLoader worker (pid 123) is killed by signal: Killed."),
either from the loader's `next()` or from torch's SIGCHLD handler, which raises at whatever line the
main thread is running (often inside the forward pass). `explain_worker_failure` turns such an error
into `LoaderWorkerDied` naming --workers, the /dev/shm size and the memory figures;
`install_sigchld_explainer` applies it to the handler's errors too. A user error raised inside a worker
(e.g. a DataError) comes back wrapped in the worker's traceback text; it is given back its own message.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from yolov5_smddp.errors import UserError

_DEATH = re.compile(r"DataLoader worker \(pid")
_FROM_WORKER = "in DataLoader worker process"
_SHM_SIGNS = ("Bus error", "No space left on device", "unable to write to file </torch_", "shared memory")
_CGROUP_V2 = Path("/sys/fs/cgroup")
_CGROUP_V1 = Path("/sys/fs/cgroup/memory")


class LoaderWorkerDied(UserError):
    """A DataLoader worker died or could not pass a batch on (memory or /dev/shm exhausted)."""


@dataclass(frozen=True)
class LoaderContext:
    """The loader a failure belongs to, for the message."""

    rank: int
    workers: int
    batch_size: int


@dataclass(frozen=True)
class Resources:
    """Memory figures in bytes (None when unknown)."""

    shm_total: int | None = None
    shm_free: int | None = None
    mem_total: int | None = None
    mem_available: int | None = None
    limit: int | None = None
    """the container's (cgroup's) memory limit; None when unlimited."""
    in_use: int | None = None
    peak: int | None = None
    oom_kills: int | None = None


def _size(n: int | None) -> str:
    if n is None:
        return "unknown"
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.1f} MiB"


def describe(resources: Resources) -> str:
    """'/dev/shm: 64.0 MiB total, 0.5 MiB free. Memory: ...' from the figures that are known."""
    r = resources
    text = f"/dev/shm: {_size(r.shm_total)} total, {_size(r.shm_free)} free. "
    text += f"Memory: {_size(r.mem_total)} total, {_size(r.mem_available)} available"
    if r.limit is not None:
        text += f"; container limit {_size(r.limit)}, {_size(r.in_use)} in use"
        if r.peak is not None:
            text += f", peak {_size(r.peak)}"
    if r.oom_kills:
        text += f"; the out-of-memory killer has stopped {r.oom_kills} process(es) in this container"
    return text + "."


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def parse_meminfo(text: str) -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo text."""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[key] = int(fields[0]) * 1024  # kB
    return values.get("MemTotal"), values.get("MemAvailable")


def read_resources() -> Resources:
    """The figures of this machine and container (cgroup v2, else v1)."""
    shm_total = shm_free = None
    if os.path.isdir("/dev/shm"):
        usage = shutil.disk_usage("/dev/shm")
        shm_total, shm_free = usage.total, usage.free
    try:
        mem_total, mem_available = parse_meminfo(Path("/proc/meminfo").read_text())
    except OSError:
        mem_total = mem_available = None
    if (_CGROUP_V2 / "memory.max").is_file():
        limit, in_use, peak = (
            _read_int(_CGROUP_V2 / name) for name in ("memory.max", "memory.current", "memory.peak")
        )
        oom_kills = None
        try:
            events = dict(line.split() for line in (_CGROUP_V2 / "memory.events").read_text().splitlines())
            oom_kills = int(events.get("oom_kill", 0))
        except (OSError, ValueError):
            pass
    else:
        limit, in_use, peak = (
            _read_int(_CGROUP_V1 / name)
            for name in ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.max_usage_in_bytes")
        )
        oom_kills = None
        if limit is not None and mem_total is not None and limit >= mem_total:
            limit = None  # v1 reports "no limit" as a huge number
    return Resources(shm_total, shm_free, mem_total, mem_available, limit, in_use, peak, oom_kills)


def _original_message(text: str) -> str:
    """The last line of a worker's re-raised traceback text ("DataError: ..."), without the type."""
    last = text.strip().splitlines()[-1] if text.strip() else text
    return re.sub(r"^[\w.]+(Error|Exception|Interrupt)?: ", "", last)


def died_message(what: str, context: LoaderContext, resources: Resources) -> str:
    """The whole explanation for the user (see the module docstring)."""
    if "Terminated" in what:  # SIGTERM from outside: a stop, not memory (workers ignore it, see loader)
        return (
            f"a DataLoader worker of rank {context.rank} was ended by SIGTERM from outside the trainer: "
            f"{what} The job is being stopped (docker stop, StopTrainingJob, a spot interruption) or "
            f"another process sent it; this is not a memory problem."
        )
    if any(sign in what for sign in _SHM_SIGNS):
        cause = "Bus errors and 'No space left on device' mean /dev/shm, which carries every batch from the workers, is full."
    elif "Killed" in what or "MemoryError" in what or "out of memory" in what.lower():
        cause = "A worker killed with SIGKILL was most likely stopped by the out-of-memory killer."
    else:
        cause = "Workers die like this when memory or /dev/shm runs out."
    return (
        f"a DataLoader worker of rank {context.rank} failed: {what} {cause} {describe(resources)} "
        f"This loader ran {context.workers} worker process(es) with a batch of {context.batch_size} per rank. "
        f"Lower --workers (the maximum per rank) or the batch per GPU, or drop --cache ram; "
        f"with docker run give a larger --shm-size (e.g. --shm-size 16g); on SageMaker choose an "
        f"instance type with more memory per GPU."
    )


def explain_worker_failure(
    exc: BaseException, context: LoaderContext, resources: Resources | None = None
) -> BaseException | None:
    """LoaderWorkerDied for a dead or out-of-memory worker; the user error a worker raised, with its own
    message; None for anything else (re-raise it as it is)."""
    if isinstance(exc, LoaderWorkerDied):
        return exc
    if isinstance(exc.__cause__, LoaderWorkerDied):  # torch re-raised ours as "exited unexpectedly"
        return exc.__cause__
    text = str(exc)
    flat = " ".join(text.split())
    if isinstance(exc, UserError) and _FROM_WORKER in text:
        return type(exc)(_original_message(text))
    died = isinstance(exc, RuntimeError) and _DEATH.search(flat) is not None
    starved = _FROM_WORKER in text and (
        isinstance(exc, MemoryError) or any(sign in text for sign in _SHM_SIGNS)
    )
    if not (died or starved):
        return None
    what = flat if died else f"{type(exc).__name__}: {_original_message(text)}"
    return LoaderWorkerDied(died_message(what, context, resources or read_resources()))


def dead_workers(iterator: object, wait_s: float = 2.0) -> list[tuple[int, int]]:
    """(pid, exit code) of the loader iterator's worker processes that exited with an error.

    A worker killed while it hands a batch over (the batch's shared-memory file descriptor travels over a
    socket) surfaces as EOFError / ConnectionResetError in the trainer rather than torch's "worker (pid)
    is killed" error. The socket closes a moment before the process shows as exited, so poll briefly."""
    workers = list(getattr(iterator, "_workers", None) or [])
    deadline = time.monotonic() + wait_s
    while True:
        dead = [(w.pid, w.exitcode) for w in workers if w.exitcode not in (None, 0)]
        if dead or not workers or time.monotonic() >= deadline:
            return dead
        time.sleep(0.05)


def worker_death_error(dead: list[tuple[int, int]]) -> RuntimeError:
    """torch's wording for a dead worker, so that `explain_worker_failure` reads it the same way."""
    pid, code = dead[0]
    if code < 0:
        how = f"is killed by signal: {signal.strsignal(-code) or -code}."
    else:
        how = f"exited unexpectedly with exit code {code}."
    return RuntimeError(f"DataLoader worker (pid {pid}) {how}")


def install_sigchld_explainer(context: LoaderContext) -> None:
    """Wrap torch's SIGCHLD handler (set when the first loader with workers starts) so that the worker
    death it raises, wherever the main thread is, arrives as LoaderWorkerDied. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGCHLD)
    base = getattr(current, "explained_handler", current)
    if not callable(base):
        return

    def handler(signum, frame) -> None:
        try:
            base(signum, frame)
        except RuntimeError as exc:
            explained = explain_worker_failure(exc, context)
            if explained is None:
                raise
            raise explained from exc

    handler.explained_handler = base  # type: ignore[attr-defined]
    signal.signal(signal.SIGCHLD, handler)
