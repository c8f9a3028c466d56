"""The launch decision: exact plans for each way SageMaker (or a person) starts the entrypoint."""

import sys

import pytest

from yolov5_smddp import launch
from yolov5_smddp.config.train_config import parse_train_args
from yolov5_smddp.distributed.process_group import detect_dist_info
from yolov5_smddp.errors import ConfigError
from yolov5_smddp.launch import LaunchPlan, decide_launch, elastic_config, read_worker_args, worker_command

HOSTS = ["algo-1", "algo-2"]


def plan_for(environ, *, hosts, **kwargs):
    """The plan as the SageMaker driver makes it: the launcher's variables read once, by distributed."""
    info = detect_dist_info(environ, default_master=hosts[0], hosts_in_job=len(hosts))
    return decide_launch(info, hosts=hosts, **kwargs)


def test_no_distribution_two_gpu_hosts_is_elastic_one_worker_per_gpu():
    plan = plan_for({}, hosts=HOSTS, current_host="algo-2", num_gpus=8)
    assert plan == LaunchPlan(
        mode="elastic", nnodes=2, nproc_per_node=8, node_rank=1, master_addr="algo-1", master_port=7777
    )
    assert plan.world_size == 16 and not plan.in_process


def test_single_gpu_or_cpu_host_runs_in_process():
    for gpus in (0, 1):
        plan = plan_for({}, hosts=["algo-1"], current_host="algo-1", num_gpus=gpus)
        assert plan == LaunchPlan(
            mode="single", nnodes=1, nproc_per_node=1, node_rank=0, master_addr="algo-1", master_port=7777
        )


def test_cpu_hosts_get_one_worker_each_unless_told():
    assert plan_for({}, hosts=HOSTS, current_host="algo-1", num_gpus=0).nproc_per_node == 1
    plan = plan_for(
        {}, hosts=["algo-1"], current_host="algo-1", num_gpus=0, nproc_per_node="2", master_port="29500"
    )
    assert plan == LaunchPlan(
        mode="elastic", nnodes=1, nproc_per_node=2, node_rank=0, master_addr="algo-1", master_port=29500
    )


def test_master_port_from_environment():
    plan = plan_for({"MASTER_PORT": "12345"}, hosts=HOSTS, current_host="algo-1", num_gpus=1)
    assert plan.master_port == 12345 and plan.mode == "elastic"


def test_under_mpirun_one_worker_in_process():
    environ = {
        "OMPI_COMM_WORLD_RANK": "9",
        "OMPI_COMM_WORLD_SIZE": "16",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
        "OMPI_COMM_WORLD_NODE_RANK": "1",
    }
    plan = plan_for(environ, hosts=HOSTS, current_host="algo-2", num_gpus=8)
    assert plan == LaunchPlan(
        mode="mpirun",
        nnodes=2,
        nproc_per_node=8,
        node_rank=1,
        master_addr="algo-1",
        master_port=7777,
        local_rank=1,
    )
    assert plan.in_process
    assert detect_dist_info(environ, default_master="algo-1").launch == "mpirun"


def _ompi(rank: int, size: int, local_rank: int, local_size: int) -> dict[str, str]:
    """What Open MPI exports to one rank. OMPI_COMM_WORLD_NODE_RANK is this rank's place among the ranks
    on its node (0 for every rank of a 2 x 1 job), not the node's index."""
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "OMPI_COMM_WORLD_NODE_RANK": str(local_rank),
    }


@pytest.mark.parametrize(
    "rank, local_rank, local_size, size, node_rank",
    [
        (0, 0, 1, 2, 0),  # 2 hosts x 1 worker
        (1, 0, 1, 2, 1),
        (0, 0, 8, 16, 0),  # 2 hosts x 8 workers
        (7, 7, 8, 16, 0),
        (8, 0, 8, 16, 1),
        (15, 7, 8, 16, 1),
    ],
)
def test_under_mpirun_the_node_comes_from_rank_and_local_size(rank, local_rank, local_size, size, node_rank):
    # the toolkit's mpirun passes algo-1's SM_CURRENT_HOST to every rank: the plan must not depend on it
    for current_host in HOSTS:
        plan = plan_for(
            _ompi(rank, size, local_rank, local_size), hosts=HOSTS, current_host=current_host, num_gpus=8
        )
        assert plan == LaunchPlan(
            mode="mpirun",
            nnodes=2,
            nproc_per_node=local_size,
            node_rank=node_rank,
            master_addr="algo-1",
            master_port=7777,
            local_rank=local_rank,
        )


def test_under_torchrun_one_worker_in_process():
    environ = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "algo-1",
        "MASTER_PORT": "29400",
        "TORCHELASTIC_RUN_ID": "job",  # torch's agent: its variables win over an outer mpirun's
        "OMPI_COMM_WORLD_RANK": "0",
    }
    plan = plan_for(environ, hosts=HOSTS, current_host="algo-2", num_gpus=2)
    assert plan == LaunchPlan(
        mode="torchrun",
        nnodes=2,
        nproc_per_node=2,
        node_rank=1,
        master_addr="algo-1",
        master_port=29400,
        local_rank=1,
    )


def test_bad_values_name_the_option():
    with pytest.raises(ConfigError, match="--nproc-per-node='two'"):
        plan_for({}, hosts=["a"], current_host="a", num_gpus=0, nproc_per_node="two")
    with pytest.raises(ConfigError, match="--nproc-per-node='0'"):
        plan_for({}, hosts=["a"], current_host="a", num_gpus=0, nproc_per_node="0")
    with pytest.raises(ConfigError, match="'algo-3'"):
        plan_for({}, hosts=HOSTS, current_host="algo-3", num_gpus=0)


def test_elastic_config_exact():
    plan = LaunchPlan(
        mode="elastic", nnodes=2, nproc_per_node=8, node_rank=1, master_addr="algo-1", master_port=7777
    )
    assert elastic_config(plan, run_id="job-1") == {
        "min_nodes": 2,
        "max_nodes": 2,
        "nproc_per_node": 8,
        "run_id": "job-1",
        "role": "trainer",
        "rdzv_backend": "static",
        "rdzv_endpoint": "algo-1:7777",
        "rdzv_configs": {"rank": 1, "timeout": 900},
        "max_restarts": 0,
        "monitor_interval": 1.0,
        "start_method": "spawn",
    }


def test_worker_command_hands_the_parsed_config_as_one_word_not_a_shell_string():
    config = parse_train_args(["--epochs", "2", "--name", "x; rm -rf /", "--cfg", "yolov5n", "--freeze", "1"])
    program, args = worker_command(config)
    assert program == sys.executable
    assert args[:3] == ["-m", "yolov5_smddp.launch", "--config-json"] and len(args) == 4
    back = read_worker_args(args[2:])
    assert back == config and back.given == config.given and back.freeze == [0]


def test_the_worker_trains_the_config_it_was_handed(monkeypatch):
    config = parse_train_args(["--epochs", "2", "--cfg", "yolov5n", "--data", "/d/data.yaml"])
    seen = []
    monkeypatch.setattr(launch, "run_config", lambda c: seen.append(c) or 0)
    assert launch._worker_main(worker_command(config)[1][2:]) == 0
    assert seen == [config] and seen[0].given == {"epochs", "cfg", "data"}


@pytest.mark.parametrize("argv", [[], ["--epochs", "1"], ["--config-json"], ["--config-json", "{}", "x"]])
def test_a_worker_command_without_one_config_is_refused(argv):
    with pytest.raises(ConfigError, match="takes --config-json JSON"):
        read_worker_args(argv)


def test_elastic_config_is_accepted_by_torch_launch_config():
    api = pytest.importorskip("torch.distributed.launcher.api")
    plan = LaunchPlan(
        mode="elastic", nnodes=1, nproc_per_node=2, node_rank=0, master_addr="localhost", master_port=7777
    )
    config = api.LaunchConfig(**elastic_config(plan, run_id="t"))
    assert (config.rdzv_backend, config.max_restarts, config.rdzv_configs["rank"]) == ("static", 0, 0)
