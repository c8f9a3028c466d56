"""A hung rank is named when a collective fails (issue 50 item 3): heartbeats in the job's store, read
twice; a store that does not answer names its host, rank 0. Bounded in time."""

from __future__ import annotations

import threading
import time

import pytest

from yolov5_smddp.distributed import liveness

TIMED_OUT = RuntimeError(
    "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms"
)


class DictStore:
    """The TCPStore calls liveness uses, in memory."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}
        self.lock = threading.Lock()

    def set(self, key, value):
        with self.lock:
            self.values[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        with self.lock:
            return self.values[key]

    def add(self, key, n):
        with self.lock:
            self.values[key] = int(self.values.get(key, 0)) + n
            return self.values[key]


class FrozenStore(DictStore):
    """A store whose host is paused: reads never come back."""

    def add(self, key, n):
        time.sleep(3600)


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(liveness, "BEAT_S", 0.05)
    monkeypatch.setattr(liveness, "STALL_S", 0.5)
    monkeypatch.setattr(liveness, "STORE_WAIT_S", 0.5)
    yield
    liveness.stop()
    liveness._state.clear()


def test_the_rank_whose_heartbeat_stopped_is_named_with_its_host(fast):
    store = DictStore()
    store.set(f"{liveness.HOST_PREFIX}1", "algo-2")
    alive = threading.Event()

    def rank_2_beats():  # rank 2 beats on; rank 1 never does (paused)
        while not alive.wait(0.05):
            store.add(f"{liveness.PREFIX}2", 1)

    threading.Thread(target=rank_2_beats, daemon=True).start()
    liveness.start(store, 0, 3, 10.0)
    try:
        stopped = liveness.explain(TIMED_OUT)
    finally:
        alive.set()
    assert isinstance(stopped, liveness.RankStopped)
    assert str(stopped).startswith(
        "training rank 1 on host algo-2 did not answer the collective for 10 s (--dist-timeout)"
    )


def test_a_store_that_does_not_answer_names_its_host_in_bounded_time(fast):
    liveness._state.update(store=FrozenStore(), rank=1, world_size=2, timeout_s=10.0)
    started = time.monotonic()
    stopped = liveness.explain(TIMED_OUT)
    assert time.monotonic() - started < 3
    assert str(stopped).startswith("training rank 0, which hosts the job's store, did not answer")


def test_other_errors_and_live_ranks_are_left_as_they_are(fast):
    store = DictStore()
    liveness.start(store, 0, 1, 10.0)
    assert liveness.explain(ValueError("a bug")) is None
    assert liveness.explain(TIMED_OUT) is None  # nobody else: nothing stopped
