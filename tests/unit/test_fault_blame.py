"""Faults during a run (issue 50): the failure reason names the rank that died and why, ahead of the
survivors' transport errors; memory exhaustion is one line naming memory and what to change."""

from __future__ import annotations

import signal

import pytest
from child_python import run_python

from yolov5_smddp.distributed import blame
from yolov5_smddp.train.out_of_memory import MemoryExhausted, as_memory_problem

RESET = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer"
TIMED_OUT = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting"


def test_a_rank_killed_by_a_signal_is_named_ahead_of_an_earlier_survivor():
    survivor = blame.Failed(rank=0, exitcode=1, message=RESET, timestamp=100)
    killed = blame.Failed(rank=1, exitcode=-signal.SIGKILL, message="", timestamp=105)
    assert blame.blame([survivor, killed]) is killed
    assert blame.cause_words(killed, oom_killed=False).startswith("was killed by signal SIGKILL")


def test_a_rank_naming_a_hung_peer_is_named_ahead_of_that_peers_later_kill_by_the_launcher():
    # rank 1 paused (SIGSTOP): rank 0's collective timed out and its liveness check named rank 1; torch
    # 2.10's agent then reports rank 1's SIGKILL (its own, after the grace) as a failure too
    said = (
        "RankStopped: training rank 1 on host algo-1 did not answer the collective for 10 s (--dist-timeout): "
        "its heartbeat stopped (paused with SIGSTOP, hung, or its host stalled) (noticed by rank 0 on host algo-1)"
    )
    noticed = blame.Failed(rank=0, exitcode=1, message=said, timestamp=100)
    killed = blame.Failed(rank=1, exitcode=-signal.SIGKILL, message="", timestamp=140)
    assert blame.blame([killed, noticed]) is noticed
    assert "training rank 1 on host algo-1 did not answer" in blame.cause_words(noticed, oom_killed=False)
    # a dead peer ("stopped answering") is not a hung one: its own end (an OOM kill, say) stays first
    died = blame.Failed(
        0, 1, "RankStopped: training rank 1 on host algo-1 stopped answering: its heartbeat", 100
    )
    assert blame.blame([died, killed]) is killed


def test_a_ranks_own_error_is_named_ahead_of_transport_errors():
    own = blame.Failed(rank=3, exitcode=2, message="cannot write /ckpt/last.pt: no space left", timestamp=9)
    survivors = [blame.Failed(r, 1, m, 1) for r, m in ((0, RESET), (1, TIMED_OUT))]
    assert blame.blame([*survivors, own]) is own
    assert blame.cause_words(own, oom_killed=False) == (
        "exited with code 2: cannot write /ckpt/last.pt: no space left"
    )


def test_an_oom_killed_rank_says_memory_in_words():
    killed = blame.Failed(rank=1, exitcode=-signal.SIGKILL, message="")
    words = blame.cause_words(killed, oom_killed=True)
    assert words.startswith("was killed by the OOM killer: memory")
    assert "--workers" in words


def test_the_oom_kill_count_is_read_from_the_processes_own_cgroup(tmp_path, monkeypatch):
    folder = tmp_path / "system.slice" / "job.scope"
    folder.mkdir(parents=True)
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 0\n")
    monkeypatch.setattr(blame, "CGROUP_ROOT", tmp_path)
    found = blame.own_memory_cgroup("0::/system.slice/job.scope\n")
    assert found == folder
    assert blame.oom_kills(found) == 2
    assert blame.own_memory_cgroup("0::/elsewhere\n") is None


def test_cgroup_v1_oom_kills_are_added_up_over_the_subtree(tmp_path, monkeypatch):
    job = tmp_path / "memory" / "job"
    (job / "rank1").mkdir(parents=True)
    (job / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    (job / "rank1" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    monkeypatch.setattr(blame, "CGROUP_ROOT", tmp_path)
    found = blame.own_memory_cgroup("4:memory:/job\n0::/\n")
    assert found == job and blame.oom_kills(found) == 1


@pytest.mark.parametrize(
    ("exc", "words"),
    [
        (MemoryError(), "out of host memory"),
        (RuntimeError("could not create a primitive"), "out of host memory"),
        (
            RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"),
            "host",
        ),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), "out of GPU memory"),
    ],
)
def test_memory_exhaustion_is_one_line_naming_memory_and_what_to_change(exc, words):
    problem = as_memory_problem(exc)
    assert isinstance(problem, MemoryExhausted)
    line = str(problem)
    assert words in line and "--batch-size" in line and "\n" not in line


def test_other_errors_are_not_memory():
    assert as_memory_problem(RuntimeError("shape mismatch")) is None
    assert as_memory_problem(ValueError("MemoryError")) is None


_REAL_MEMORY_ERROR = """
import sys
from yolov5_smddp import cli
try:
    bytearray(1 << 60)
except MemoryError as exc:
    sys.exit(cli.report(exc))
"""


def test_a_real_memory_error_ends_a_command_in_one_line_with_exit_2():
    done = run_python(_REAL_MEMORY_ERROR, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: out of host memory (MemoryError")


def test_an_elastic_worker_ends_a_dead_loader_worker_in_its_error_file_and_exit_2(
    tmp_path, monkeypatch, capsys
):
    import json

    from yolov5_smddp import launch
    from yolov5_smddp.data.worker_errors import LoaderWorkerDied

    def run_config(config):
        raise LoaderWorkerDied("a DataLoader worker of rank 1 failed: killed by signal: Bus error ...")

    monkeypatch.setattr(launch, "run_config", run_config)
    monkeypatch.setattr(launch, "read_worker_args", lambda argv: None)
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    assert launch._run_worker(["--config-json", "{}"]) == 2
    recorded = json.loads(error_file.read_text())
    assert recorded["message"].startswith("a DataLoader worker of rank 1 failed: killed by signal: Bus error")
    assert isinstance(recorded["timestamp"], int)
    assert capsys.readouterr().err.splitlines() == [f"error: {recorded['message']}"]


def test_a_bug_in_an_elastic_worker_keeps_its_traceback(monkeypatch):
    from yolov5_smddp import launch

    monkeypatch.setattr(launch, "run_config", lambda config: 1 / 0)
    monkeypatch.setattr(launch, "read_worker_args", lambda argv: None)
    with pytest.raises(ZeroDivisionError):
        launch._run_worker(["--config-json", "{}"])


def test_a_busy_port_is_one_config_line_and_other_store_errors_are_not():
    from yolov5_smddp.distributed.process_group import port_in_use
    from yolov5_smddp.errors import ConfigError

    busy = RuntimeError(
        "The server socket has failed to bind to 0.0.0.0:29500 (errno: 98 - Address already in use)."
    )
    found = port_in_use(busy, "algo-1", 29500)
    assert isinstance(found, ConfigError)
    assert str(found).startswith("the master port 29500 on algo-1 is already in use")
    assert port_in_use(RuntimeError("connect() timed out"), "algo-1", 29500) is None
