"""The image as a product: labels, reuse as a base (`FROM`), `build.sh push` to a registry and back. The push
is the build script's own (a subprocess); everything else goes through the Docker SDK."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import docker
import pytest
from docker.errors import ImageNotFound

from tests.docker.conftest import REPO, TINY_HPS
from tests.docker.engine import Engine, bind

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_image_labels_and_sagemaker_settings(client: docker.DockerClient, image: str, engine: Engine):
    config = client.images.get(image).attrs["Config"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert len(labels["org.opencontainers.image.revision"]) in (40, len("unknown"))
    assert labels["org.opencontainers.image.base.name"].startswith("yolov5-smddp-standin:")
    assert "SAGEMAKER_PROGRAM=entrypoint.py" in config["Env"]
    assert config["Entrypoint"] == ["python3", "/usr/local/bin/yolov5-smddp-entry"]
    listing = engine.run(image, ["/opt/ml/code"], entrypoint="ls")
    assert listing.code == 0, listing.log
    assert listing.stdout.split() == ["entrypoint.py"]


def test_child_image_with_its_own_data_builds_and_trains(
    image: str, dataset: Path, tmp_path: Path, engine: Engine
):
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
    engine.build(context, tag)  # labelled: the engine fixture removes it
    model = tmp_path / "model"
    model.mkdir()
    run = engine.run(tag, mounts=[bind(model, "/opt/ml/model")])
    assert run.code == 0, run.log[-4000:]
    assert (model / "best.pt").is_file()
    assert "/opt/child-data" in json.loads((model / "config.json").read_text())["train_config"]["data"]


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


def test_build_sh_push_to_a_registry_then_pull_and_run(
    client: docker.DockerClient, image: str, local_registry: str, engine: Engine
):
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
    # the tag the push made on our image: removed, pulled back from the registry, run, removed again
    client.images.remove(target)
    try:
        client.images.pull(target)
        run = engine.run(target, ["python3", "/opt/ml/code/entrypoint.py", "--help"])
        assert run.code == 0 and "--nproc-per-node" in run.stdout, run.log
    finally:
        try:
            client.images.remove(target)
        except ImageNotFound:
            pass


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
