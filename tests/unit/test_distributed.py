import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from yolov5_smddp import distributed
from yolov5_smddp.distributed import detect_dist_info, resolve
from yolov5_smddp.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent.parent


def test_single_process_without_launcher():
    info = detect_dist_info({})
    assert (info.rank, info.world_size, info.launcher, info.distributed) == (0, 1, "none", False)


def test_torchrun_variables():
    env = {
        "RANK": "5",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "algo-1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    info = detect_dist_info(env)
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size, info.node_rank) == (
        5,
        1,
        16,
        4,
        1,
    )
    assert (info.master_addr, info.master_port, info.launcher, info.agent_store) == (
        "algo-1",
        29500,
        "torchrun",
        True,
    )


def test_open_mpi_variables_with_default_master_callback():
    env = {
        "OMPI_COMM_WORLD_RANK": "9",
        "OMPI_COMM_WORLD_SIZE": "16",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
        "OMPI_COMM_WORLD_NODE_RANK": "1",
    }
    info = detect_dist_info(env, default_master=lambda: "algo-1")
    assert (info.rank, info.local_rank, info.world_size, info.node_rank) == (9, 1, 16, 1)
    assert (info.master_addr, info.master_port, info.launcher, info.agent_store) == (
        "algo-1",
        7777,
        "mpirun",
        False,
    )
    assert (
        detect_dist_info({**env, "MASTER_ADDR": "10.0.0.2"}, default_master="algo-1").master_addr
        == "10.0.0.2"
    )


def test_multi_node_mpi_without_master_is_an_error():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        detect_dist_info(env)
    single_node = {
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    assert detect_dist_info(single_node).master_addr == "127.0.0.1"


def test_bad_values():
    with pytest.raises(ConfigError, match="RANK"):
        detect_dist_info({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="inconsistent"):
        detect_dist_info({"RANK": "2", "WORLD_SIZE": "2"})


@pytest.mark.parametrize(
    "requested, cuda, smddp, prefer_smddp, expected",
    [
        ("auto", True, True, False, ("smddp", "cuda")),
        ("auto", True, False, False, ("nccl", "cuda")),
        ("auto", False, True, False, ("gloo", "cpu")),
        ("auto", False, False, False, ("gloo", "cpu")),
        ("smddp", False, True, False, ("smddp", "cpu")),
        ("gloo", True, True, False, ("gloo", "cpu")),
        ("nccl", True, False, False, ("nccl", "cuda")),
        # under mpirun (SageMaker's SMDDP distribution) auto means smddp whenever it imports
        ("auto", False, True, True, ("smddp", "cpu")),
        ("auto", True, True, True, ("smddp", "cuda")),
        ("auto", False, False, True, ("gloo", "cpu")),
        ("auto", True, False, True, ("nccl", "cuda")),
        ("gloo", True, True, True, ("gloo", "cpu")),
    ],
)
def test_resolve_backend_and_device(requested, cuda, smddp, prefer_smddp, expected):
    assert resolve(requested, cuda, smddp, prefer_smddp=prefer_smddp) == expected


def test_resolve_imports_smddp_only_when_the_answer_depends_on_it():
    asked = []

    def importable() -> bool:
        asked.append(True)
        return True

    assert resolve("gloo", True, importable) == ("gloo", "cpu")
    assert resolve("auto", False, importable) == ("gloo", "cpu")
    assert asked == []
    assert resolve("auto", True, importable) == ("smddp", "cuda")
    assert asked == [True]


def test_missing_smddp_names_the_images():
    with pytest.raises(ConfigError, match="2.5.1.*2.4.0.*2.3.0"):
        resolve("smddp", True, False)
    with pytest.raises(ConfigError, match="CUDA"):
        resolve("nccl", False, False)
    with pytest.raises(ConfigError, match="--backend='mpi'"):
        resolve("mpi", True, True)


def test_mpirun_node_index_and_host_count_from_rank_and_local_size():
    # 2 hosts x 1 worker: OMPI_COMM_WORLD_NODE_RANK is 0 on both ranks (a per-node rank)
    second = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
        "OMPI_COMM_WORLD_NODE_RANK": "0",
    }
    info = detect_dist_info(second, default_master="algo-1")
    assert (info.rank, info.local_rank, info.node_rank, info.nnodes, info.local_world_size) == (1, 0, 1, 2, 1)
    # 2 hosts x 8 workers: rank 12 is local rank 4 of the second host
    twelfth = {
        "OMPI_COMM_WORLD_RANK": "12",
        "OMPI_COMM_WORLD_SIZE": "16",
        "OMPI_COMM_WORLD_LOCAL_RANK": "4",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
        "OMPI_COMM_WORLD_NODE_RANK": "4",
    }
    info = detect_dist_info(twelfth, default_master="algo-1")
    assert (info.rank, info.local_rank, info.node_rank, info.nnodes, info.local_world_size) == (
        12,
        4,
        1,
        2,
        8,
    )
    assert info.prefer_smddp and not detect_dist_info({}).prefer_smddp


def test_single_process_helpers_are_no_ops():
    import torch

    info = detect_dist_info({})
    device = distributed.init(info, "gloo", "cpu", 10)
    assert device.type == "cpu" and distributed.is_main() and distributed.world_size() == 1
    t = torch.tensor([3.0])
    assert distributed.all_reduce_mean(t).item() == 3.0
    assert distributed.broadcast_object({"a": 1}) == {"a": 1}
    distributed.barrier()
    distributed.destroy()


def test_smddp_importable_follows_the_module(monkeypatch):
    # the stand-in (tests/standin_smddp) imports and registers the backend; a module that is not there,
    # as SMDDP is not outside the DLC, is False rather than an ImportError
    import sys

    monkeypatch.syspath_prepend(str(REPO / "tests" / "standin_smddp"))
    for name in [m for m in sys.modules if m.startswith("smdistributed")]:
        monkeypatch.delitem(sys.modules, name)
    assert distributed.smddp_importable() is True
    monkeypatch.setattr(distributed, "SMDDP_MODULE", "smdistributed.dataparallel.torch.no_such_module")
    assert distributed.smddp_importable() is False


def test_mpirun_local_size_from_the_jobs_hosts_when_given():
    # what the stand-in's Open MPI exported to the rank on algo-2 of a 2 x 1 job under the toolkit's mpirun
    seen_on_algo_2 = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_COMM_WORLD_NODE_RANK": "1",
    }
    info = detect_dist_info(seen_on_algo_2, default_master="algo-1", hosts_in_job=2)
    assert (info.rank, info.local_rank, info.local_world_size, info.node_rank, info.nnodes) == (1, 0, 1, 1, 2)
    # without the host count, Open MPI's local size is all there is
    alone = detect_dist_info(seen_on_algo_2, default_master="algo-1")
    assert (alone.local_rank, alone.local_world_size, alone.node_rank, alone.nnodes) == (1, 2, 0, 1)
    # 2 x 8: rank 12 is local rank 4 of the second host either way
    twelfth = {
        "OMPI_COMM_WORLD_RANK": "12",
        "OMPI_COMM_WORLD_SIZE": "16",
        "OMPI_COMM_WORLD_LOCAL_RANK": "4",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
    }
    info = detect_dist_info(twelfth, default_master="algo-1", hosts_in_job=2)
    assert (info.local_rank, info.local_world_size, info.node_rank, info.nnodes) == (4, 8, 1, 2)


# ---- teardown (issue 10): bounded, the store's host last, a watchdog that ends a stuck rank

_ONE_RANK = (
    "import os, socket; from yolov5_smddp import distributed; "
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close(); "
    "info = distributed.DistInfo(0, 0, 1, 1, 0, '127.0.0.1', port, 'mpirun', "
    "use_libuv=os.environ.get('USE_LIBUV', '1') == '1'); "
    "distributed.init(info, 'gloo', 'cpu', 30); "
)


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env = {k: v for k, v in env.items() if not k.startswith(("OMPI_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_the_watchdog_ends_a_stuck_teardown_with_the_runs_exit_code():
    proc = _python(
        _ONE_RANK + "import time; distributed._leave = lambda succeeded: time.sleep(600); "
        "distributed.teardown(7, limit_s=1); print('not reached')"
    )
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert (
        "teardown watchdog: rank 0 of 1 did not finish leaving the process group in 1 s; its outputs "
        "are written, ending the process with exit code 7"
    ) in proc.stderr
    assert "not reached" not in proc.stdout


def test_a_stuck_teardown_after_a_failure_is_abandoned_and_the_failure_goes_on():
    proc = _python(
        _ONE_RANK + "import time; distributed._leave = lambda succeeded: time.sleep(600); "
        "distributed.teardown(None, limit_s=1); print('reported:', distributed.is_initialized())"
    )
    # the caller goes on (reports its failure) with the group still joined (the stuck leave never destroyed
    # it), and the process still ends
    assert proc.stdout.splitlines() == ["reported: True"], proc.stdout + proc.stderr
    assert (
        "teardown watchdog: rank 0 of 1 failed and did not finish leaving the process group in 1 s; "
        "abandoned (the process ends within 60 s)"
    ) in proc.stderr


def test_teardown_leaves_the_group_and_forgets_the_ranks():
    proc = _python(
        _ONE_RANK + "distributed.teardown(0); "
        "print('after:', distributed.is_initialized(), distributed.world_size(), distributed._state['store'])"
    )
    assert proc.returncode == 0, proc.stderr
    assert "after: False 1 None" in proc.stdout
    assert "teardown watchdog" not in proc.stderr


def test_the_backstop_ends_a_process_that_never_releases_the_gil():
    # a C call made with the GIL held: the waiting thread cannot even notice its limit
    proc = _python(
        "import ctypes; from yolov5_smddp.distributed import run_bounded; "
        "run_bounded(lambda: ctypes.PyDLL(None).sleep(60), 0.5, backstop_s=1.5); print('not reached')"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Timeout (0:00:02)!" in proc.stderr and "run_bounded" in proc.stderr
    assert "not reached" not in proc.stdout


def test_run_bounded_finished_overrun_and_failed(caplog):
    assert distributed.run_bounded(lambda: None, 30) is True
    release = threading.Event()
    assert distributed.run_bounded(lambda: release.wait(60), 0.2) is False
    release.set()

    def fails():
        raise RuntimeError("gloo said no")

    with caplog.at_level(logging.WARNING, logger="yolov5_smddp.distributed"):
        assert distributed.run_bounded(fails, 30) is True
    assert "teardown: gloo said no" in caplog.text


def test_the_store_host_waits_for_the_others_then_leaves(caplog):
    import torch.distributed as dist

    store = dist.HashStore()
    for me in (1, 2):  # the two other ranks say they have left
        distributed._host_leaves_last(store, False, me, 3, 5.0)
    assert store.add(distributed.TEARDOWN_DONE_KEY, 0) == 2
    distributed._host_leaves_last(store, True, 0, 3, 5.0)  # returns at once: both have left
    assert "leaves anyway" not in caplog.text

    lonely = dist.HashStore()
    distributed._host_leaves_last(lonely, False, 1, 3, 5.0)
    with caplog.at_level(logging.WARNING, logger="yolov5_smddp.distributed"):
        distributed._host_leaves_last(lonely, True, 0, 3, 0.3)  # rank 2 never says so
    assert "teardown: 1 of 2 other ranks had not left after 0 s; rank 0 leaves anyway" in caplog.text


def test_a_rank_whose_store_host_is_gone_still_leaves(caplog):
    class Gone:
        calls = []

        def add(self, key, value):
            self.calls.append((key, value))
            raise RuntimeError("Connection reset by peer")

    with caplog.at_level(logging.DEBUG, logger="yolov5_smddp.distributed"):
        distributed._host_leaves_last(Gone(), False, 1, 2, 5.0)  # returns: no exception, no waiting
    assert Gone.calls == [(distributed.TEARDOWN_DONE_KEY, 1)]  # it tried to say so, once
    assert [r.getMessage() for r in caplog.records] == [
        "teardown: could not tell the store's host: Connection reset by peer"
    ]
