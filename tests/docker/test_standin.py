"""The stand-in base (YOLOV5_SMDDP_STANDIN, as `./build.sh test` built it here: the debootstrap path) carries
exactly the image settings of docker/standin/Dockerfile, which its other build path applies."""

from __future__ import annotations

import json
import os
import shlex

import docker
import pytest

from tests.docker.conftest import REPO

pytestmark = [pytest.mark.docker]


def dockerfile_settings() -> dict:
    """Env (as KEY=VALUE), Labels, WorkingDir, Entrypoint and Cmd of the Dockerfile's lines after its RUN."""
    lines = (REPO / "docker" / "standin" / "Dockerfile").read_text().splitlines()
    after_run = lines[next(i for i, line in enumerate(lines) if line.startswith("RUN ")) + 1 :]
    settings: dict = {"Env": [], "Labels": {}}
    for line in after_run:
        word, _, rest = line.partition(" ")
        if word == "ENV":
            settings["Env"].append(rest)
        elif word == "LABEL":
            key, _, value = rest.partition("=")
            settings["Labels"][key] = shlex.split(value)[0]
        elif word == "WORKDIR":
            settings["WorkingDir"] = rest
        elif word in ("ENTRYPOINT", "CMD"):
            settings[word.title()] = json.loads(rest)
    return settings


def test_the_stand_in_carries_the_dockerfiles_settings(client: docker.DockerClient):
    tag = os.environ.get("YOLOV5_SMDDP_STANDIN")
    if not tag:
        pytest.skip("YOLOV5_SMDDP_STANDIN is not set (./build.sh test sets it)")
    expected = dockerfile_settings()
    assert "USE_LIBUV=0" in expected["Env"] and expected["Cmd"] == ["/bin/bash"]  # the parse found them
    config = client.images.get(tag).attrs["Config"]
    assert sorted(config["Env"]) == sorted(expected["Env"])
    assert config["Labels"] == expected["Labels"]
    assert config["WorkingDir"] == expected["WorkingDir"]
    assert config["Entrypoint"] == expected["Entrypoint"]
    assert config["Cmd"] == expected["Cmd"]
