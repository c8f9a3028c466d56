import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from yolov5_smddp.distributed import collectives, process_group
from yolov5_smddp.distributed.process_group import BackendChoice, choose_backend, detect_dist_info
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


P4D, G5, P3DN, P5 = "ml.p4d.24xlarge", "ml.g5.48xlarge", "ml.p3dn.24xlarge", "ml.p5.48xlarge"

# launch x instance type x nodes x SMDDP library present -> backend of `--backend auto` on a CUDA job
AUTO_ON_CUDA = [
    ("smddprun", P4D, 2, True, "smddp"),
    ("smddprun", "ml.p4de.24xlarge", 16, True, "smddp"),
    ("smddprun", P4D, 2, False, "nccl"),  # the 2.6+ DLCs: no library
    ("smddprun", P4D, 1, True, "nccl"),  # one node: NCCL is faster
    ("smddprun", P3DN, 2, True, "nccl"),  # SMDDP without its optimisations
    ("smddprun", P5, 2, True, "nccl"),
    ("smddprun", G5, 4, True, "nccl"),
    ("smddprun", None, 2, True, "nccl"),  # instance type unknown
    ("mpirun", P4D, 2, True, "nccl"),  # a plain mpirun, not the SMDDP runner
    ("torchrun", P4D, 2, True, "nccl"),  # distribution torch_distributed
    ("torchrun", P5, 2, True, "nccl"),
    ("torchrun", G5, 1, True, "nccl"),
    ("none", P4D, 1, True, "nccl"),  # one process
]


@pytest.mark.parametrize("launch, instance_type, nnodes, library, expected", AUTO_ON_CUDA)
def test_auto_backend_on_cuda_by_launch_instance_nodes_and_library(
    launch, instance_type, nnodes, library, expected
):
    choice = choose_backend(
        "auto", cuda=True, launch=launch, instance_type=instance_type, nnodes=nnodes, smddp_available=library
    )
    assert (choice.backend, choice.device_type) == (expected, "cuda")


@pytest.mark.parametrize("launch", ["smddprun", "mpirun", "torchrun", "none"])
@pytest.mark.parametrize("library", [True, False])
def test_auto_backend_without_cuda_is_gloo_everywhere(launch, library):
    choice = choose_backend(
        "auto", cuda=False, launch=launch, instance_type=P4D, nnodes=2, smddp_available=library
    )
    assert choice == BackendChoice("gloo", "cpu", "auto: no CUDA device")


def test_auto_reasons_name_the_deciding_fact():
    def reason(**kw):
        args = {
            "cuda": True,
            "launch": "smddprun",
            "instance_type": P4D,
            "nnodes": 2,
            "smddp_available": True,
        }
        return choose_backend("auto", **{**args, **kw}).log_line()

    assert reason() == "backend smddp on cuda: auto: SMDDP launch on 2 x ml.p4d.24xlarge"
    assert reason(launch="torchrun") == (
        "backend nccl on cuda: auto: started by torchrun, not by SageMaker's SMDDP launch "
        "(distribution smdistributed)"
    )
    assert reason(nnodes=1) == "backend nccl on cuda: auto: one node, where AWS finds SMDDP slower than NCCL"
    assert reason(instance_type=P3DN) == (
        "backend nccl on cuda: auto: ml.p3dn.24xlarge is not one SMDDP supports "
        "(ml.p4d.24xlarge, ml.p4de.24xlarge)"
    )
    assert "is not installed in this image" in reason(smddp_available=False)


@pytest.mark.parametrize(
    "requested, cuda, launch, library, expected",
    [
        ("gloo", True, "smddprun", True, ("gloo", "cpu")),
        ("nccl", True, "torchrun", False, ("nccl", "cuda")),
        ("smddp", True, "smddprun", True, ("smddp", "cuda")),
        # without CUDA only the test stand-in imports as SMDDP: let through, on the CPU
        ("smddp", False, "torchrun", True, ("smddp", "cpu")),
        ("smddp", False, "none", True, ("smddp", "cpu")),
    ],
)
def test_explicit_backends(requested, cuda, launch, library, expected):
    choice = choose_backend(
        requested, cuda=cuda, launch=launch, instance_type=P4D, nnodes=2, smddp_available=library
    )
    assert (choice.backend, choice.device_type) == expected


def test_explicit_smddp_where_it_cannot_work_is_one_clear_error():
    args = {"instance_type": P4D, "nnodes": 2}
    for launch in ("torchrun", "mpirun", "none"):
        with pytest.raises(ConfigError, match=f"started by {launch}, and SMDDP's AllReduce runs only under"):
            choose_backend("smddp", cuda=True, launch=launch, smddp_available=True, **args)
    with pytest.raises(ConfigError, match="not installed in this image.*2.5.1.*2.4.0.*2.3.0"):
        choose_backend("smddp", cuda=True, launch="smddprun", smddp_available=False, **args)
    with pytest.raises(ConfigError, match="CUDA"):
        choose_backend("nccl", cuda=False, launch="none", smddp_available=False, **args)
    with pytest.raises(ConfigError, match="--backend='mpi'"):
        choose_backend("mpi", cuda=True, launch="none", smddp_available=True, **args)


def test_explicit_smddp_where_it_works_but_is_not_the_best_says_so():
    choice = choose_backend(
        "smddp", cuda=True, launch="smddprun", instance_type=G5, nnodes=1, smddp_available=True
    )
    assert choice.reason == (
        "--backend smddp; one node, where AWS finds NCCL faster; ml.g5.48xlarge is not one SMDDP is optimised for"
    )


def test_the_library_is_imported_only_when_the_answer_depends_on_it():
    asked = []

    def importable() -> bool:
        asked.append(True)
        return True

    for requested, cuda, launch in [
        ("gloo", True, "smddprun"),
        ("auto", False, "smddprun"),
        ("auto", True, "torchrun"),
    ]:
        choose_backend(
            requested, cuda=cuda, launch=launch, instance_type=P4D, nnodes=2, smddp_available=importable
        )
    assert asked == []
    choose_backend(
        "auto", cuda=True, launch="smddprun", instance_type=P4D, nnodes=2, smddp_available=importable
    )
    assert asked == [True]


def _smddprun_rank(rank: int, size: int = 16, local_size: int = 8, **extra: str) -> dict[str, str]:
    """What a rank of the toolkit's SMDDP runner sees (2 x 8: SMDATAPARALLEL_USE_HOMOGENEOUS and the
    server address; the ranks it starts over ssh have no MASTER_*)."""
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % local_size),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "SMDATAPARALLEL_USE_HOMOGENEOUS": "1",
        "SMDATAPARALLEL_SERVER_ADDR": "algo-1",
        "SMDATAPARALLEL_SERVER_PORT": "7592",
        **extra,
    }


def test_rank_and_world_without_local_variables_take_open_mpis_local_place():
    # smddprun exporting RANK / WORLD_SIZE without LOCAL_*: rank 9 of 2 x 8 is local rank 1 of 8
    info = detect_dist_info(_smddprun_rank(9, RANK="9", WORLD_SIZE="16"))
    assert (
        info.rank,
        info.local_rank,
        info.world_size,
        info.local_world_size,
        info.node_rank,
        info.nnodes,
    ) == (
        9,
        1,
        16,
        8,
        1,
        2,
    )
    assert (info.launcher, info.launch) == ("mpirun", "smddprun")
    with pytest.raises(ConfigError, match="RANK=3 disagrees with Open MPI's OMPI_COMM_WORLD_RANK=9"):
        detect_dist_info(_smddprun_rank(9, RANK="3", WORLD_SIZE="16"))


def test_torchs_agent_wins_over_an_outer_mpiruns_variables():
    # torchrun started inside an mpirun rank: its workers inherit OMPI_* that describe the agent, not them
    env = {
        **_smddprun_rank(1, size=2, local_size=1),
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "TORCHELASTIC_RUN_ID": "job",
    }
    info = detect_dist_info(env)
    assert (info.rank, info.local_rank, info.local_world_size, info.node_rank, info.launch) == (
        3,
        1,
        2,
        1,
        "torchrun",
    )


def test_the_smddp_launch_and_its_master_on_every_rank():
    # the first host's ranks inherit the toolkit's MASTER_ADDR / MASTER_PORT, the others do not: all agree
    first = detect_dist_info(_smddprun_rank(0, MASTER_ADDR="algo-1", MASTER_PORT="7777"))
    remote = detect_dist_info(_smddprun_rank(12))
    assert (
        (first.master_addr, first.master_port) == (remote.master_addr, remote.master_port) == ("algo-1", 7777)
    )
    assert first.smddp_launch and remote.launch == "smddprun"
    single_node = {**_smddprun_rank(3, size=8), "SMDATAPARALLEL_USE_SINGLENODE": "1"}
    del single_node["SMDATAPARALLEL_USE_HOMOGENEOUS"]
    assert detect_dist_info(single_node).launch == "smddprun"
    plain = {k: v for k, v in _smddprun_rank(12).items() if not k.startswith("SMDATAPARALLEL_USE")}
    assert detect_dist_info(plain).launch == "mpirun"


def test_the_instance_type_from_the_runner_else_the_caller():
    assert detect_dist_info(_smddprun_rank(0), instance_type=P4D).instance_type == P4D
    assert (
        detect_dist_info(_smddprun_rank(0, SAGEMAKER_INSTANCE_TYPE=P5), instance_type=P4D).instance_type == P5
    )
    assert detect_dist_info({}).instance_type is None


def test_smddp_environment_sets_the_instance_type_only_when_missing():
    info = detect_dist_info(_smddprun_rank(0), instance_type=P4D)
    assert process_group.smddp_environment(info, {}) == {"SAGEMAKER_INSTANCE_TYPE": P4D}
    assert process_group.smddp_environment(info, {"SAGEMAKER_INSTANCE_TYPE": P5}) == {}
    assert process_group.smddp_environment(detect_dist_info({}), {}) == {}


def test_resolve_logs_the_decision_in_one_line_and_exports_the_instance_type(monkeypatch, caplog):
    monkeypatch.delenv("SAGEMAKER_INSTANCE_TYPE", raising=False)
    seen = []
    monkeypatch.setattr(
        process_group,
        "smddp_importable",
        lambda: seen.append(os.environ.get("SAGEMAKER_INSTANCE_TYPE")) or True,
    )
    info = detect_dist_info(_smddprun_rank(0), instance_type=P4D)
    with caplog.at_level(logging.INFO, logger="yolov5_smddp.distributed.process_group"):
        assert process_group.resolve("auto", info, True) == ("smddp", "cuda")
    assert seen == [P4D]  # set before the library's import
    assert [r.getMessage() for r in caplog.records] == [
        "backend smddp on cuda: auto: SMDDP launch on 2 x ml.p4d.24xlarge"
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="yolov5_smddp.distributed.process_group"):
        process_group.resolve("auto", detect_dist_info(_smddprun_rank(3)), False)
    assert caplog.records == []  # rank 3 does not log


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
    assert info.launch == "mpirun" and detect_dist_info({}).launch == "none"


def test_single_process_helpers_are_no_ops():
    import torch

    info = detect_dist_info({})
    device = process_group.init(info, "gloo", "cpu", 10)
    assert device.type == "cpu" and process_group.is_main() and process_group.world_size() == 1
    t = torch.tensor([3.0])
    assert process_group.all_reduce_mean(t).item() == 3.0
    assert collectives.broadcast_ints((1, -2)) == (1, -2)
    process_group.barrier()
    process_group.destroy()


def test_smddp_importable_follows_the_module(monkeypatch):
    # the stand-in (tests/standin_smddp) imports and registers the backend; a module that is not there,
    # as SMDDP is not outside the DLC, is False rather than an ImportError
    import sys

    monkeypatch.syspath_prepend(str(REPO / "tests" / "standin_smddp"))
    for name in [m for m in sys.modules if m.startswith("smdistributed")]:
        monkeypatch.delitem(sys.modules, name)
    assert process_group.smddp_importable() is True
    monkeypatch.setattr(process_group, "SMDDP_MODULE", "smdistributed.dataparallel.torch.no_such_module")
    assert process_group.smddp_importable() is False


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
    "import os, socket; from yolov5_smddp.distributed import process_group; "
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close(); "
    "info = process_group.DistInfo(0, 0, 1, 1, 0, '127.0.0.1', port, 'mpirun', "
    "use_libuv=os.environ.get('USE_LIBUV', '1') == '1'); "
    "process_group.init(info, 'gloo', 'cpu', 30); "
)


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env = {k: v for k, v in env.items() if not k.startswith(("OMPI_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def _our_lines(stdout: str) -> list[str]:
    """stdout's lines without Gloo's own: torch 2.10's Gloo prints "[Gloo] Rank 0 is connected to 0 peer
    ranks..." to stdout when a group forms."""
    return [line for line in stdout.splitlines() if not line.startswith("[Gloo] ")]


def test_the_watchdog_ends_a_stuck_teardown_with_the_runs_exit_code():
    proc = _python(
        _ONE_RANK + "import time; process_group._leave = lambda succeeded: time.sleep(600); "
        "process_group.teardown(7, limit_s=1); print('not reached')"
    )
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert (
        "teardown watchdog: rank 0 of 1 did not finish leaving the process group in 1 s; its outputs "
        "are written, ending the process with exit code 7"
    ) in proc.stderr
    assert "not reached" not in proc.stdout


def test_a_stuck_teardown_after_a_failure_is_abandoned_and_the_failure_goes_on():
    proc = _python(
        _ONE_RANK + "import time; process_group._leave = lambda succeeded: time.sleep(600); "
        "process_group.teardown(None, limit_s=1); print('reported:', process_group.is_initialized())"
    )
    # the caller goes on (reports its failure) with the group still joined (the stuck leave never destroyed
    # it), and the process still ends
    assert _our_lines(proc.stdout) == ["reported: True"], proc.stdout + proc.stderr
    assert (
        "teardown watchdog: rank 0 of 1 failed and did not finish leaving the process group in 1 s; "
        "abandoned (the process ends within 60 s)"
    ) in proc.stderr


def test_teardown_leaves_the_group_and_forgets_the_ranks():
    proc = _python(
        _ONE_RANK + "process_group.teardown(0); "
        "print('after:', process_group.is_initialized(), process_group.world_size(), process_group._state['store'])"
    )
    assert proc.returncode == 0, proc.stderr
    assert "after: False 1 None" in proc.stdout
    assert "teardown watchdog" not in proc.stderr


def test_the_backstop_ends_a_process_that_never_releases_the_gil():
    # a C call made with the GIL held: the waiting thread cannot even notice its limit
    proc = _python(
        "import ctypes; from yolov5_smddp.distributed.process_group import run_bounded; "
        "run_bounded(lambda: ctypes.PyDLL(None).sleep(60), 0.5, backstop_s=1.5); print('not reached')"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Timeout (0:00:02)!" in proc.stderr and "run_bounded" in proc.stderr
    assert "not reached" not in proc.stdout


def test_run_bounded_finished_overrun_and_failed(caplog):
    assert process_group.run_bounded(lambda: None, 30) is True
    release = threading.Event()
    assert process_group.run_bounded(lambda: release.wait(60), 0.2) is False
    release.set()

    def fails():
        raise RuntimeError("gloo said no")

    with caplog.at_level(logging.WARNING, logger="yolov5_smddp.distributed.process_group"):
        assert process_group.run_bounded(fails, 30) is True
    assert "teardown: gloo said no" in caplog.text


def test_the_store_host_waits_for_the_others_then_leaves(caplog):
    import torch.distributed as dist

    store = dist.HashStore()
    for me in (1, 2):  # the two other ranks say they have left
        process_group._host_leaves_last(store, False, me, 3, 5.0)
    assert store.add(process_group.TEARDOWN_DONE_KEY, 0) == 2
    process_group._host_leaves_last(store, True, 0, 3, 5.0)  # returns at once: both have left
    assert "leaves anyway" not in caplog.text

    lonely = dist.HashStore()
    process_group._host_leaves_last(lonely, False, 1, 3, 5.0)
    with caplog.at_level(logging.WARNING, logger="yolov5_smddp.distributed.process_group"):
        process_group._host_leaves_last(lonely, True, 0, 3, 0.3)  # rank 2 never says so
    assert "teardown: 1 of 2 other ranks had not left after 0 s; rank 0 leaves anyway" in caplog.text


def test_a_rank_whose_store_host_is_gone_still_leaves(caplog):
    class Gone:
        calls = []

        def add(self, key, value):
            self.calls.append((key, value))
            raise RuntimeError("Connection reset by peer")

    with caplog.at_level(logging.DEBUG, logger="yolov5_smddp.distributed.process_group"):
        process_group._host_leaves_last(Gone(), False, 1, 2, 5.0)  # returns: no exception, no waiting
    assert Gone.calls == [(process_group.TEARDOWN_DONE_KEY, 1)]  # it tried to say so, once
    assert [r.getMessage() for r in caplog.records] == [
        "teardown: could not tell the store's host: Connection reset by peer"
    ]


_FAKE_MPI = (
    "import sys, types; mpi = types.ModuleType('mpi4py.MPI'); state = {'init': True, 'fin': False}; "
    "mpi.Is_initialized = lambda: state['init']; mpi.Is_finalized = lambda: state['fin']; "
    "mpi.Finalize = lambda: (state.update(fin=True), print('MPI_Finalize', flush=True)); "
    "sys.modules['mpi4py.MPI'] = mpi; "
)


def test_the_watchdogs_exit_finalizes_mpi_first():
    # under `python -m mpi4py` os._exit would skip mpi4py's MPI_Finalize at exit: mpirun fails such a rank
    proc = _python(
        _FAKE_MPI + _ONE_RANK + "import time; process_group._leave = lambda succeeded: time.sleep(600); "
        "process_group.teardown(7, limit_s=1); print('not reached')"
    )
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert _our_lines(proc.stdout) == ["MPI_Finalize"], proc.stdout + proc.stderr


def test_finalize_mpi_only_when_initialised_and_not_finalized(monkeypatch):
    import types

    calls = []
    mpi = types.ModuleType("mpi4py.MPI")
    mpi.Finalize = lambda: calls.append("finalize")
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    assert process_group.finalize_mpi() is False  # no mpi4py: nothing to do (and it is not imported)
    assert "mpi4py.MPI" not in sys.modules
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)
    for initialised, finalized, expected in [(False, False, False), (True, True, False), (True, False, True)]:
        mpi.Is_initialized, mpi.Is_finalized = (lambda v=initialised: v), (lambda v=finalized: v)
        assert process_group.finalize_mpi() is expected
    assert calls == ["finalize"]


_LEAVE_AFTER_DDP = """
import gc, json, os, socket, torch
from torch.nn.parallel import DistributedDataParallel
from yolov5_smddp.distributed import process_group
from yolov5_smddp.models.yolo import build_model

torch.set_num_threads(1)
threads = lambda: set(os.listdir("/proc/self/task"))
before = threads()
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
process_group.init(process_group.DistInfo(0, 0, 1, 1, 0, "127.0.0.1", port, "torchrun"), "gloo", "cpu", 30)
joined = threads()

def train_step():
    ddp = DistributedDataParallel(build_model("yolov5n").train(), gradient_as_bucket_view=True)
    sum(o.mean() for o in ddp(torch.rand(1, 3, 64, 64))).backward()

gc.disable()  # no automatic collection: a process where none happened to run before the end
train_step()  # the wrapper is garbage now, in a reference cycle
process_group.teardown(0)
started = joined - before  # by the group: the store's and the backend's (the backward may add its own)
print(json.dumps({"group": len(started), "left": sorted(started & threads())}))
"""


def test_leaving_the_group_after_ddp_ends_the_backends_threads():
    # stop 47's CI: a rank aborted at exit ("terminate called without an active exception"). The Gloo
    # backend outlived destroy_process_group, held by a finished DDP wrapper (a reference cycle) and by
    # torch.distributed.nn.functional's group.WORLD defaults (imported by DDP's constructor, via
    # torch._dynamo, after the group existed); its threads were still running at interpreter exit
    proc = _python(_LEAVE_AFTER_DDP)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["group"] >= 2  # the store's and the backend's threads: something to end
    assert result["left"] == []  # every thread the group started has ended
