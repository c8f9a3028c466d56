"""The container tests' own clean-up: what a killed run left is found by its labels and removed; what a run
still going on (this one, or one on another host) made is left alone."""

from __future__ import annotations

import os
import socket
import subprocess

import docker
import pytest

from tests.docker.engine import (
    OWNER,
    OWNER_LABEL,
    SCOPE_LABEL,
    Engine,
    is_stale,
    process_token,
    remove_leftovers,
)

pytestmark = [pytest.mark.docker]


def _dead_owner() -> str:
    """The token of a process of this host that has exited."""
    child = subprocess.Popen(["true"])
    token = process_token(child.pid)
    child.wait(timeout=60)
    assert token is not None and process_token(child.pid) is None
    return token


def test_owner_tokens_tell_running_processes_from_gone_ones():
    assert OWNER == process_token(os.getpid())
    assert OWNER.startswith(f"{socket.gethostname()}/{os.getpid()}/")
    assert not is_stale(OWNER)
    assert is_stale(_dead_owner())
    host, pid, start = OWNER.split("/")
    assert is_stale(f"{host}/{pid}/{start}0")  # the same pid, another process (pid reused)
    assert not is_stale(f"another-{host}/{pid}/1")  # another host: can't tell, keep
    assert not is_stale("no-token-at-all")


def test_leftovers_of_a_dead_run_are_removed_and_a_live_runs_kept(
    client: docker.DockerClient, image: str, engine: Engine
):
    scope = engine.labels[SCOPE_LABEL]  # whatever this test leaves, the engine fixture removes
    owners = {"dead": _dead_owner(), "live": OWNER, "elsewhere": f"another-{socket.gethostname()}/1/1"}
    made = {}
    for who, owner in owners.items():
        labels = {OWNER_LABEL: owner, SCOPE_LABEL: scope}
        made[who] = (
            client.containers.create(
                image, "true", name=f"yolov5-smddp-test-{who}-{scope[:8]}", labels=labels
            ),
            client.networks.create(f"yolov5-smddp-test-{who}-{scope[:8]}", internal=True, labels=labels),
        )
    made["dead"][1].connect(made["dead"][0])  # a network still in use by a leftover container

    removed = remove_leftovers(client)

    dead_container, dead_network = made["dead"]
    assert f"container {dead_container.name}" in removed and f"network {dead_network.name}" in removed
    for who in ("live", "elsewhere"):
        container, network = made[who]
        assert f"container {container.name}" not in removed
        client.containers.get(container.id)
        client.networks.get(network.id)
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(dead_container.id)
    with pytest.raises(docker.errors.NotFound):
        client.networks.get(dead_network.id)
