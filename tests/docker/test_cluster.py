"""Two hosts (algo-1, algo-2) on a private network, each with its own /opt/ml, like SageMaker local mode:
our launcher (no distribution), the toolkit's SMDDP-style mpirun launch, and a host dying mid-run."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from docker.models.containers import Container

from tests.docker.conftest import TINY_HPS, opt_ml_mounts, opt_ml_tree
from tests.docker.engine import NAME_PREFIX, Engine, logs, wait

pytestmark = [pytest.mark.docker, pytest.mark.slow]
HOSTS = ["algo-1", "algo-2"]


def _start_cluster(
    image: str, dataset: Path, tmp_path: Path, engine: Engine, hps: dict[str, str]
) -> tuple[dict[str, Path], dict[str, Container]]:
    """One container per host: host name and network alias algo-N (the toolkit resolves every host first)."""
    network = engine.network()
    run = uuid.uuid4().hex[:6]
    roots, containers = {}, {}
    for host in HOSTS:
        roots[host] = opt_ml_tree(tmp_path / host, host=host, hosts=HOSTS, hps=hps, channels=("training",))
        containers[host] = engine.start(
            image,
            "train",
            name=f"{NAME_PREFIX}-{host}-{run}",
            hostname=host,
            network=network,
            aliases=(host,),
            shm_size="512m",
            mounts=opt_ml_mounts(roots[host], {"training": dataset}),
        )
    return roots, containers


def test_two_hosts_without_distribution_use_our_launcher(image, dataset, tmp_path, engine):
    roots, containers = _start_cluster(image, dataset, tmp_path, engine, TINY_HPS)
    results = {host: wait(container, 900) for host, container in containers.items()}
    for host, result in results.items():
        assert result.code == 0, f"{host}:\n{result.log[-4000:]}"
    log1 = results["algo-1"].log
    assert "launch: elastic, 2 host(s) x 1 worker(s), this host algo-1 (node 0), master algo-1:7777" in log1
    assert "launch: elastic, 2 host(s) x 1 worker(s), this host algo-2 (node 1)" in results["algo-2"].log
    assert "backend=gloo world_size=2" in log1
    assert (roots["algo-1"] / "model" / "best.pt").is_file()


def test_two_hosts_with_the_toolkits_smddp_mpirun_launch(image, dataset, tmp_path, engine):
    hps = {
        **TINY_HPS,
        "sagemaker_distributed_dataparallel_enabled": "true",
        "sagemaker_instance_type": json.dumps("ml.p4d.24xlarge"),
    }
    roots, containers = _start_cluster(image, dataset, tmp_path, engine, hps)
    first = wait(containers["algo-1"], 900)
    log1 = first.log
    assert first.code == 0, log1[-4000:]
    assert "mpirun --host algo-1:1,algo-2:1 -np 2" in log1
    # each rank names its own host although the toolkit passes algo-1's SM_CURRENT_HOST to both
    launch = "launch: mpirun, 2 host(s) x 1 worker(s), this host {} (node {}), master algo-1:7777"
    assert f"[1,mpirank:0,algo-1]<stdout>: {launch.format('algo-1', 0)}" in log1
    assert f"[1,mpirank:1,algo-2]<stdout>: {launch.format('algo-2', 1)}" in log1  # started over ssh
    assert "backend=gloo world_size=2" in log1
    # the worker host's toolkit ran sshd, saw the MPI daemon finish and found the master's status file
    second = wait(containers["algo-2"], 300)
    assert second.code == 0, second.log[-4000:]
    assert "MPI training job status file found" in second.log
    assert (roots["algo-1"] / "model" / "best.pt").is_file()


def test_a_host_dying_ends_the_other_with_the_reason(image, dataset, tmp_path, engine):
    hps = {**TINY_HPS, "epochs": "100", "dist-timeout": "60"}
    roots, containers = _start_cluster(image, dataset, tmp_path, engine, hps)
    first, second = containers["algo-1"], containers["algo-2"]
    deadline = time.monotonic() + 600
    while "epoch=2" not in logs(first, stderr=False):
        assert time.monotonic() < deadline, logs(first, stderr=False)[-4000:]
        time.sleep(1)
    second.kill()
    # the job ends (wait() fails with the log if algo-1 is still running 300 s later: with --dist-timeout 60
    # it must not train on alone), fails, and says why in SageMaker's failure file
    result = wait(first, 300)
    assert result.code != 0, result.log[-4000:]
    reason = (roots["algo-1"] / "output" / "failure").read_text()
    assert reason.startswith("Training failed: training worker rank 0"), reason[:1024]
    assert "epoch=100 " not in result.stdout and not (roots["algo-1"] / "model" / "best.pt").exists()
