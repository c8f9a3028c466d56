"""Which rank stopped answering, when a collective fails (issue 50): the cause, not the survivor's symptom.

A rank that hangs (paused with SIGSTOP, stuck in a driver, its host stalled) makes every other rank fail
its next collective after --dist-timeout with a transport error ("Timed out", "Connection reset by
peer") that names only the rank that noticed. Each rank therefore beats in the job's TCPStore: a daemon
thread adds 1 to `yolov5_smddp/beat/<rank>` every BEAT_S seconds (a few bytes over the store's socket,
off the training thread: no host sync). When a rank's collective fails, `explain(exc)` reads every
rank's count twice, STALL_S apart; a rank whose count did not move is named: "training rank 1 on host
algo-2 did not answer the collective for 10 s (its heartbeat stopped: paused, hung or its host stalled)".
A store that does not answer within STALL_S + STORE_WAIT_S means its host (rank 0) is the one that stopped.

Bound: a hung rank ends the job within --dist-timeout + STALL_S + the launcher's grace (torch's agent: 30 s
before its SIGKILL; mpirun: at once) — about 50 s with --dist-timeout 10 (README, "A stopped job").
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

BEAT_S = 1.0
STALL_S = 4.0
"""How long the counts are watched: four beats missed is a stopped rank, not a slow one."""
STORE_WAIT_S = 10.0
PREFIX = "yolov5_smddp/beat/"
HOST_PREFIX = "yolov5_smddp/host/"

TRANSPORT_SIGNS = (
    "Timed out",
    "timed out",
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "DistBackendError",
    "NCCL",
    "gloo",
    "Gloo",
    "Watchdog caught collective operation timeout",
)

HUNG_WORDS = "did not answer the collective for"
"""RankStopped's words for a rank that was alive but stuck (its heartbeat stopped, its socket open): the
launcher then kills that rank (torch's agent with SIGKILL after its grace), which is the end of the symptom,
not a second cause (distributed/blame.py names this message first)."""

_state: dict[str, Any] = {}


class RankStopped(RuntimeError):
    """Another rank stopped answering; the message names it, its host and for how long."""


def start(store: Any, rank: int, world_size: int, timeout_s: float) -> None:
    """Beat for this rank in `store` until the process ends (a daemon thread; a failing store ends it)."""
    store.set(f"{HOST_PREFIX}{rank}", socket.gethostname())
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(BEAT_S):
            try:
                store.add(f"{PREFIX}{rank}", 1)
            except Exception:  # noqa: BLE001 - the store is gone: the run is ending anyway
                return

    thread = threading.Thread(target=beat, name="yolov5-smddp-heartbeat", daemon=True)
    thread.start()
    _state.update(
        store=store, rank=rank, world_size=world_size, timeout_s=timeout_s, stop=stop, thread=thread
    )


def stop() -> None:
    """End this rank's beats and let go of the store (teardown: no beat into a store being closed, and
    no reference that would keep it and its threads alive); waits at most 2 beats for the thread."""
    event, thread = _state.pop("stop", None), _state.pop("thread", None)
    _state.clear()
    if event is not None:
        event.set()
    if thread is not None and thread is not threading.current_thread():
        thread.join(2 * BEAT_S)


def _counts(store: Any, world_size: int) -> list[int]:
    return [store.add(f"{PREFIX}{r}", 0) for r in range(world_size)]


def stalled_ranks(store: Any, world_size: int, me: int, watch_s: float | None = None) -> list[int]:
    """Ranks other than `me` whose beat count did not move in `watch_s` seconds (default STALL_S)."""
    before = _counts(store, world_size)
    time.sleep(STALL_S if watch_s is None else watch_s)
    after = _counts(store, world_size)
    return [r for r in range(world_size) if r != me and before[r] == after[r]]


def _host(store: Any, rank: int) -> str:
    try:
        return store.get(f"{HOST_PREFIX}{rank}").decode("utf-8", "replace")
    except Exception:  # noqa: BLE001
        return "an unknown host"


def looks_like_transport(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(sign in text for sign in TRANSPORT_SIGNS)


def explain(exc: BaseException) -> RankStopped | None:
    """RankStopped naming the rank(s) that stopped answering, when `exc` is a failed collective and some
    rank's heartbeat stopped; None otherwise (the failure is reported as it is). Bounded: at most
    STALL_S + STORE_WAIT_S seconds."""
    store = _state.get("store")
    if store is None or not looks_like_transport(exc):
        return None
    world, me, timeout_s = _state["world_size"], _state["rank"], _state["timeout_s"]
    stop()
    found: dict[str, Any] = {}

    def look() -> None:
        ranks = stalled_ranks(store, world, me)
        found["ranks"] = [(r, _host(store, r)) for r in ranks]

    thread = threading.Thread(target=look, name="yolov5-smddp-liveness", daemon=True)
    thread.start()
    thread.join(STALL_S + STORE_WAIT_S)
    waited = f"{timeout_s:g} s (--dist-timeout)"
    if thread.is_alive() or "ranks" not in found:
        return RankStopped(
            f"training rank 0, which hosts the job's store, {HUNG_WORDS} {waited} "
            f"nor the store for {STORE_WAIT_S:g} s: it was paused, hung, or its host stalled "
            f"(noticed by rank {me} on host {socket.gethostname()})"
        )
    if not found["ranks"]:
        return None
    named = ", ".join(f"rank {r} on host {h}" for r, h in found["ranks"])
    noticed = f"(noticed by rank {me} on host {socket.gethostname()})"
    if "imed out" in str(exc):
        return RankStopped(
            f"training {named} {HUNG_WORDS} {waited}: its heartbeat stopped (paused "
            f"with SIGSTOP, hung, or its host stalled) {noticed}"
        )
    return RankStopped(
        f"training {named} stopped answering: its heartbeat stopped and its connection closed (the process "
        f"died or its host went away) {noticed}"
    )
