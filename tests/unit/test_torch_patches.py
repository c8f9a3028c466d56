"""torch_patches: torch's internals that the elastic launcher patches are still there, the way the patches
assume, on the installed torch (red on a torch upgrade that changes them); each patch does what it says inside
its block only, and stands aside with a warning when torch's surface differs."""

import logging
import signal

import pytest
import torch
from torch.distributed.elastic.multiprocessing import SignalException, api
from torch.distributed.elastic.rendezvous import static_tcp_rendezvous

from yolov5_smddp import launch, torch_patches


def test_installed_torch_is_a_release_the_patches_were_read_against():
    release = ".".join(torch.__version__.split(".")[:2])
    assert release in torch_patches.TESTED_TORCH, (
        f"torch {torch.__version__}: read yolov5_smddp/torch_patches.py's patches against its code, "
        "then add the release to TESTED_TORCH"
    )


def test_installed_torch_has_the_surface_the_patches_assume():
    assert torch_patches.stop_window_problems() == []
    assert torch_patches.static_store_problems() == []


class _Context:
    """A PContext whose _close records what the agent's close asked for."""

    _stdout_tail = _stderr_tail = None  # torch 2.5 / 2.6
    _tail_logs = ()  # torch 2.10 on: close() stops these and closes the filtered streams after _close
    filtered_stdout = filtered_stderr = None

    def _close(self, death_sig, timeout):
        self.closed = (death_sig, timeout)


def test_after_its_own_sigterm_the_elastic_agent_waits_the_stop_window_for_its_workers():
    """torch's agent kills its workers 30 s after its SIGTERM; inside the block it waits the grace (the workers
    write a checkpoint and the model folder), but only after a SIGTERM of its own: a shutdown after a failed
    worker keeps torch's 30 s. Outside the block torch is as it was."""
    before = (api._terminate_process_handler, api.PContext.close)
    with torch_patches.agent_waits_after_sigterm(launch.SIGTERM_GRACE_S):
        context = _Context()
        api.PContext.close(context, signal.SIGTERM)
        assert context.closed == (signal.SIGTERM, 30)  # a failed worker: torch's grace
        with pytest.raises(SignalException):
            api._terminate_process_handler(signal.SIGTERM, None)  # what the agent's handler does
        api.PContext.close(context, signal.SIGTERM)
        assert context.closed == (signal.SIGTERM, launch.SIGTERM_GRACE_S)
    assert (api._terminate_process_handler, api.PContext.close) == before
    assert launch.SIGTERM_GRACE_S < 120  # SageMaker's SIGKILL


def test_static_rendezvous_store_is_made_without_libuv_inside_the_block_only():
    before = static_tcp_rendezvous.TCPStore
    with torch_patches.static_store_without_libuv():
        rendezvous = static_tcp_rendezvous.StaticTCPRendezvous("127.0.0.1", 0, 0, 1, "t", 30)
        info = rendezvous.next_rendezvous()
        info.store.set("k", "v")
        assert info.store.get("k") == b"v"
        assert rendezvous._store.libuvBackend is False
    assert static_tcp_rendezvous.TCPStore is before


def test_a_changed_close_is_named_and_left_alone(monkeypatch, caplog):
    def close(self, death_sig=None):  # a torch whose close takes no timeout
        self.closed = death_sig

    monkeypatch.setattr(api.PContext, "close", close)
    problems = torch_patches.stop_window_problems()
    assert problems == ["PContext.close takes (self, death_sig), not (self, death_sig, timeout)"]
    with caplog.at_level(logging.WARNING), torch_patches.agent_waits_after_sigterm(100.0):
        assert api.PContext.close is close
    assert "changed under yolov5_smddp" in caplog.text and "torch's own 30 s" in caplog.text


def test_a_renamed_handler_is_named(monkeypatch):
    monkeypatch.delattr(api, "_terminate_process_handler")
    assert torch_patches.stop_window_problems() == ["api._terminate_process_handler is missing"]


def test_a_static_rendezvous_without_our_tcpstore_is_named_and_left_alone(monkeypatch, caplog):
    def other_store(*args, **kwargs):
        raise AssertionError("not called")

    monkeypatch.setattr(static_tcp_rendezvous, "TCPStore", other_store)
    assert torch_patches.static_store_problems() == [
        "static_tcp_rendezvous.TCPStore is not torch.distributed.TCPStore"
    ]
    with caplog.at_level(logging.WARNING), torch_patches.static_store_without_libuv():
        assert static_tcp_rendezvous.TCPStore is other_store
    assert "libuv default" in caplog.text
