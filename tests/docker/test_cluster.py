"""Two hosts (algo-1, algo-2) on a private network, each with its own /opt/ml, like SageMaker local mode:
our launcher (no distribution), the toolkit's SMDDP-style mpirun launch, and a host dying mid-run."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from tests.docker.conftest import TINY_HPS, docker, opt_ml_mounts, opt_ml_tree

pytestmark = [pytest.mark.docker, pytest.mark.slow]
HOSTS = ["algo-1", "algo-2"]


def _start_cluster(
    image: str, dataset: Path, tmp_path: Path, network: str, containers: list[str], hps: dict[str, str]
) -> dict[str, Path]:
    roots = {}
    tag = uuid.uuid4().hex[:6]
    for host in HOSTS:
        root = opt_ml_tree(tmp_path / host, host=host, hosts=HOSTS, hps=hps, channels=("training",))
        name = f"yolov5-smddp-{host}-{tag}"
        containers.append(name)
        docker(
            "run",
            "-d",
            "--name",
            name,
            "--hostname",
            host,
            "--network",
            network,
            "--network-alias",
            host,
            "--shm-size",
            "512m",
            *opt_ml_mounts(root, {"training": dataset}),
            image,
            "train",
        )
        roots[host] = root
    return roots


def _wait(name: str, timeout: float) -> tuple[int, str]:
    code = int(docker("wait", name, timeout=timeout).stdout.strip())
    logs = docker("logs", name, check=False)
    return code, logs.stdout + logs.stderr


def test_two_hosts_without_distribution_use_our_launcher(image, dataset, tmp_path, network, containers):
    roots = _start_cluster(image, dataset, tmp_path, network, containers, TINY_HPS)
    results = {host: _wait(name, 900) for host, name in zip(HOSTS, containers)}
    for host, (code, log) in results.items():
        assert code == 0, f"{host}:\n{log[-4000:]}"
    log1 = results["algo-1"][1]
    assert "launch: elastic, 2 host(s) x 1 worker(s), this host algo-1 (node 0), master algo-1:7777" in log1
    assert "launch: elastic, 2 host(s) x 1 worker(s), this host algo-2 (node 1)" in results["algo-2"][1]
    assert "backend=gloo world_size=2" in log1
    assert (roots["algo-1"] / "model" / "best.pt").is_file()


def test_two_hosts_with_the_toolkits_smddp_mpirun_launch(image, dataset, tmp_path, network, containers):
    hps = {
        **TINY_HPS,
        "sagemaker_distributed_dataparallel_enabled": "true",
        "sagemaker_instance_type": json.dumps("ml.p4d.24xlarge"),
    }
    roots = _start_cluster(image, dataset, tmp_path, network, containers, hps)
    code, log1 = _wait(containers[0], 900)
    assert code == 0, log1[-4000:]
    assert "mpirun --host algo-1:1,algo-2:1 -np 2" in log1
    assert "[1,mpirank:0,algo-1]<stdout>: launch: mpirun" in log1
    assert "[1,mpirank:1,algo-2]<stdout>: launch: mpirun" in log1  # the rank mpirun started over ssh
    assert "backend=gloo world_size=2" in log1
    # the worker host's toolkit ran sshd, saw the MPI daemon finish and found the master's status file
    code2, log2 = _wait(containers[1], 300)
    assert code2 == 0, log2[-4000:]
    assert "MPI training job status file found" in log2
    assert (roots["algo-1"] / "model" / "best.pt").is_file()


def test_a_host_dying_fails_the_other_within_the_timeout(image, dataset, tmp_path, network, containers):
    hps = {**TINY_HPS, "epochs": "100", "dist-timeout": "60"}
    roots = _start_cluster(image, dataset, tmp_path, network, containers, hps)
    first, second = containers
    deadline = time.monotonic() + 600
    while "epoch=2" not in docker("logs", first, check=False).stdout:
        assert time.monotonic() < deadline, docker("logs", first, check=False).stdout[-4000:]
        time.sleep(1)
    docker("kill", second)
    killed_at = time.monotonic()
    code, log = _wait(first, 300)
    elapsed = time.monotonic() - killed_at
    assert code != 0, log[-4000:]
    assert elapsed < 60 + 60, f"algo-1 took {elapsed:.0f} s to stop after algo-2 died"
    reason = (roots["algo-1"] / "output" / "failure").read_text()
    assert reason.startswith("Training failed: training worker rank 0"), reason[:1024]
