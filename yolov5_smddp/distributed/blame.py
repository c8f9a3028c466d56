"""Which failed worker a failure reason names: the cause, not the symptom (issue 50).

When one rank dies, the others fail a moment later with transport errors ("Connection reset by peer",
Gloo's "Timed out", NCCL's watchdog): torch's agent names the failure with the earliest timestamp, which is
often a survivor. `blame(failures)` orders the failed workers of this host instead:
0. a rank that names a hung peer (distributed/liveness.py's "did not answer the collective for": the peer's
   heartbeat stopped while it was alive), ahead of that peer's own end: the launcher kills a hung rank
   (torch's agent: SIGKILL after its grace, which torch 2.10's agent reports as that rank's failure: seen in
   CI), so its signal is the symptom's end, not the cause;
1. a rank ended by a signal (SIGKILL, SIGSEGV, ...): the kernel's OOM killer when the oom_kill count of
   this process's memory cgroup (v2) or its subtree (v1) grew during the run ("killed by the OOM killer: memory");
2. a rank's own error (a known problem's one line, a traceback's last line);
3. a survivor's transport error.
`cause_words` spells the chosen one for the failure reason, with the rank and its host.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from yolov5_smddp.distributed.liveness import HUNG_WORDS

TRANSPORT_SIGNS = re.compile(
    r"Connection reset by peer|Connection closed by peer|Broken pipe|Connection refused|Timed out|"
    r"DistBackendError|NCCL|[Gg]loo|ProcessGroup|recvBytes|sendBytes|TCPStore"
)
"""Texts of the errors a surviving rank raises when a peer is gone."""

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Failed:
    """One failed worker as the agent saw it."""

    rank: int
    exitcode: int
    """negative: ended by that signal."""
    message: str
    timestamp: int = 0


def _tier(failed: Failed) -> int:
    if HUNG_WORDS in failed.message:
        return 0
    if failed.exitcode < 0:
        return 1
    if failed.message and not TRANSPORT_SIGNS.search(failed.message):
        return 2
    return 3


def blame(failures: list[Failed]) -> Failed:
    """The failed worker to name (see the module docstring); ties go to the earliest, then lowest rank."""
    return min(failures, key=lambda f: (_tier(f), f.timestamp, f.rank))


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def own_memory_cgroup(proc_self_cgroup: str | None = None) -> Path | None:
    """This process's memory cgroup folder: cgroup v2 (`0::/path`, memory.events) or v1 (`N:memory:/path`,
    memory.oom_control); None when neither can be read."""
    try:
        text = proc_self_cgroup if proc_self_cgroup is not None else Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if controllers == "":
            folder = CGROUP_ROOT / path.strip().lstrip("/")
            if (folder / "memory.events").is_file():
                return folder
        elif "memory" in controllers.split(","):
            for folder in (CGROUP_ROOT / "memory" / path.strip().lstrip("/"), CGROUP_ROOT / "memory"):
                if (folder / "memory.oom_control").is_file():  # the second: a cgroup namespace's root
                    return folder
    return None


MAX_CGROUPS = 1000
"""cgroup v1 counts OOM kills per cgroup, not with its descendants: at most this many are read."""


def _oom_kill_count(path: Path) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def oom_kills(folder: Path | None) -> int | None:
    """The OOM kills counted in the cgroup `folder` and below it (v2's memory.events counts its
    descendants; v1's memory.oom_control of each cgroup of the subtree is added up); None when unknown."""
    if folder is None:
        return None
    if (folder / "memory.events").is_file():
        return _oom_kill_count(folder / "memory.events")
    total, found = 0, False
    for seen, (current, _, _) in enumerate(os.walk(folder)):
        if seen >= MAX_CGROUPS:
            break
        count = _oom_kill_count(Path(current) / "memory.oom_control")
        if count is not None:
            total, found = total + count, True
    return total if found else None


def cause_words(failed: Failed, *, oom_killed: bool) -> str:
    """What happened to the chosen worker, in words: "was killed by the OOM killer: memory ...",
    "was killed by signal SIGKILL", "exited with code 2: <its line>"."""
    if failed.exitcode < 0:
        name = signal_name(-failed.exitcode)
        if oom_killed and -failed.exitcode == signal.SIGKILL:
            return (
                "was killed by the OOM killer: memory (the container's or host's memory ran out; lower the "
                "batch per GPU, --workers or --imgsz, drop --cache ram, or choose an instance type with more "
                "memory)"
            )
        return f"was killed by signal {name} (not by the trainer: the kernel, a user or an orchestrator)"
    detail = " ".join(failed.message.split()) or "see the worker's error in the log above"
    return f"exited with code {failed.exitcode}: {detail}"
