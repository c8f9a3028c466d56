"""The image as a product: labels, reuse as a base (`FROM`), `build.sh push` to a registry and back."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.docker.conftest import REPO, TINY_HPS, docker

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_image_labels_and_sagemaker_settings(image: str):
    config = json.loads(docker("image", "inspect", image).stdout)[0]["Config"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert len(labels["org.opencontainers.image.revision"]) in (40, len("unknown"))
    assert labels["org.opencontainers.image.base.name"].startswith("yolov5-smddp-standin:")
    assert "SAGEMAKER_PROGRAM=entrypoint.py" in config["Env"]
    assert config["Entrypoint"] == ["python3", "/usr/local/bin/yolov5-smddp-entry"]
    listing = docker("run", "--rm", "--entrypoint", "ls", image, "/opt/ml/code").stdout.split()
    assert listing == ["entrypoint.py"]


def test_child_image_with_its_own_data_builds_and_trains(image: str, dataset: Path, tmp_path: Path):
    context = tmp_path / "child"
    shutil.copytree(dataset, context / "data", ignore=shutil.ignore_patterns("*.cache"))
    (context / "data" / "data.yaml").write_text(
        (dataset / "data.yaml").read_text().replace("path: .", "path: /opt/child-data")
    )
    args = json.dumps(
        [
            "train",
            "--data",
            "/opt/child-data/data.yaml",
            *[w for k, v in TINY_HPS.items() for w in (f"--{k}", v)],
        ]
    )
    (context / "Dockerfile").write_text(f"FROM {image}\nCOPY data /opt/child-data\nCMD {args}\n")
    tag = f"yolov5-smddp-child-test:{uuid.uuid4().hex[:8]}"
    docker("build", "-q", "-t", tag, str(context))
    try:
        model = tmp_path / "model"
        model.mkdir()
        run = docker("run", "--rm", "-v", f"{model}:/opt/ml/model", tag, check=False)
        assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
        assert (model / "best.pt").is_file()
        assert "/opt/child-data" in json.loads((model / "config.json").read_text())["train_config"]["data"]
    finally:
        docker("rmi", "-f", tag, check=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def local_registry(tmp_path: Path):
    """Debian's docker-registry on 127.0.0.1 only (nothing outside this machine)."""
    binary = shutil.which("docker-registry") or (
        "/usr/bin/docker-registry" if os.path.exists("/usr/bin/docker-registry") else None
    )
    if binary is None:
        pytest.skip("docker-registry is not installed (apt-get install docker-registry; .ci/run does)")
    port = _free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'registry'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen(
        [binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the local registry did not start"
                time.sleep(0.3)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_build_sh_push_to_a_registry_then_pull_and_run(image: str, local_registry: str):
    push = subprocess.run(
        [
            str(REPO / "build.sh"),
            "push",
            "--registry",
            local_registry,
            "--repo",
            "yolov5-smddp",
            "--image",
            image,
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert push.returncode == 0, push.stderr[-4000:]
    target = push.stdout.strip().splitlines()[-1]
    assert target == f"{local_registry}/yolov5-smddp:{image.split(':')[-1]}"
    assert "logging in" not in push.stderr and "creating ECR repository" not in push.stderr
    docker("rmi", target)
    docker("pull", target, timeout=1800)
    try:
        run = docker("run", "--rm", target, "python3", "/opt/ml/code/entrypoint.py", "--help", check=False)
        assert run.returncode == 0 and "--nproc-per-node" in run.stdout, run.stdout + run.stderr
    finally:
        docker("rmi", target, check=False)


def test_compose_file_describes_two_hosts():
    import yaml

    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    services = compose["services"]
    assert sorted(services) == ["algo-1", "algo-2"]
    for name, service in services.items():
        assert service["hostname"] == name
        assert name in service["networks"]["cluster"]["aliases"]
        assert service["command"] == "train"
        assert any(v.endswith(":/opt/ml/input/config:ro") and name in v for v in service["volumes"])
    if shutil.which("docker-compose"):
        check = subprocess.run(
            ["docker-compose", "-f", str(REPO / "docker" / "compose.yaml"), "config", "-q"],
            env={**os.environ, "IMAGE": "yolov5-smddp:test", "CLUSTER_DIR": "/tmp/c", "DATA_DIR": "/tmp/d"},
            capture_output=True,
            text=True,
        )
        assert check.returncode == 0, check.stderr
