"""The container tests' handle on the Docker engine, through the Docker SDK for Python.

Every container, network and image a test makes carries two labels: OWNER_LABEL, the pytest process that made
it ('<host>/<pid>/<process start>'), and SCOPE_LABEL, the Engine (one per test, one per session) that removes
it when that test or session ends, passed or failed. What a killed run left behind (its process gone) is
removed by the next session on the same host; objects of a run still going on are left alone.
By hand: `docker rm -f $(docker ps -aq --filter label=org.yolov5-smddp.test.owner)`.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import docker
import requests
from docker.errors import NotFound
from docker.models.containers import Container
from docker.models.images import Image
from docker.models.networks import Network
from docker.types import Mount

OWNER_LABEL = "org.yolov5-smddp.test.owner"
SCOPE_LABEL = "org.yolov5-smddp.test.scope"
NAME_PREFIX = "yolov5-smddp-test"


def process_token(pid: int) -> str | None:
    """'<host>/<pid>/<start>' of the running process `pid`, None when none runs under it.

    The start (clock ticks after boot, field 22 of /proc/PID/stat) tells a reused pid from the process that
    made an object; where /proc does not exist (macOS) it is '-' and the pid alone counts."""
    if Path("/proc/self/stat").exists():
        try:
            start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        except OSError:
            return None
    else:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:  # someone else's process: it runs
            pass
        start = "-"
    return f"{socket.gethostname()}/{pid}/{start}"


def is_stale(owner: str) -> bool:
    """True for an owner token of a process on this host that no longer runs (another host: can't tell)."""
    host, _, rest = owner.partition("/")
    pid = rest.partition("/")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return process_token(int(pid)) != owner


OWNER = process_token(os.getpid())


def _remove(obj: Container | Network | Image, client: docker.DockerClient) -> None:
    try:
        if isinstance(obj, Container):
            obj.remove(force=True)
        elif isinstance(obj, Network):
            obj.remove()
        else:
            client.images.remove(obj.id, force=True)
    except NotFound:  # already gone (removed by a finalizer that ran first)
        pass


def _labelled(client: docker.DockerClient, label: str) -> list[Container | Network | Image]:
    """Containers first, then networks (free once their containers are gone), then images."""
    where = {"label": label}
    return [
        *client.containers.list(all=True, filters=where),
        *client.networks.list(filters=where),
        *client.images.list(filters=where),
    ]


def _labels_of(obj: Container | Network | Image) -> dict[str, str]:
    return (obj.attrs.get("Labels") if isinstance(obj, Network) else obj.labels) or {}


def remove_leftovers(client: docker.DockerClient) -> list[str]:
    """Remove the labelled objects of test runs that died on this host; their names, for the log."""
    removed = []
    for obj in _labelled(client, OWNER_LABEL):
        if is_stale(_labels_of(obj)[OWNER_LABEL]):
            _remove(obj, client)
            removed.append(
                f"{type(obj).__name__.lower()} {obj.name if not isinstance(obj, Image) else obj.id}"
            )
    return removed


def remove_owned(client: docker.DockerClient, owner: str) -> None:
    """Remove every labelled object of `owner` (the session's end: what a failed finalizer left)."""
    for obj in _labelled(client, f"{OWNER_LABEL}={owner}"):
        _remove(obj, client)


def logs(container: Container, *, stderr: bool = True) -> str:
    """What the container wrote so far: stdout and stderr interleaved as written, or stdout alone."""
    return container.logs(stdout=True, stderr=stderr).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Exited:
    """How a container ended: its exit status, its whole log and its stdout alone."""

    code: int
    log: str
    stdout: str


def wait(container: Container, timeout: float) -> Exited:
    """Block until the container exits (at most `timeout` s: then an AssertionError with its log's tail)."""
    try:
        code = container.wait(timeout=timeout)["StatusCode"]
    except requests.exceptions.RequestException as err:  # the SDK's read timeout
        raise AssertionError(
            f"{container.name} still running after {timeout} s:\n{logs(container)[-4000:]}"
        ) from err
    return Exited(code, logs(container), logs(container, stderr=False))


def wait_for_log(container: Container, text: str, timeout: float) -> str:
    """Poll the log until `text` shows (then return the log); fail if the container stops first or never."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = logs(container)
        if text in out:
            return out
        container.reload()
        if container.status != "running":
            raise AssertionError(f"{container.name} stopped before printing {text!r}:\n{out[-4000:]}")
        time.sleep(1)
    raise AssertionError(f"{container.name} did not print {text!r} within {timeout} s")


def bind(source: Path, target: str, *, read_only: bool = False) -> Mount:
    """A bind mount of a host folder (it must exist)."""
    return Mount(target, str(source), type="bind", read_only=read_only)


class Engine:
    """Makes containers, networks and images for one test (or the session), all labelled, and removes every
    one of them in close() however the test ended."""

    def __init__(self, client: docker.DockerClient):
        self.client = client
        self.labels = {OWNER_LABEL: OWNER, SCOPE_LABEL: uuid.uuid4().hex}

    def start(
        self,
        image: str,
        command: list[str] | str | None = None,
        *,
        network: Network | None = None,
        aliases: tuple[str, ...] = (),
        mounts: Sequence[Mount] = (),
        **options,
    ) -> Container:
        """Start a detached container; `options` are `containers.run`'s (hostname, environment, shm_size,
        entrypoint, name...). On `network` it answers to `aliases` as well as to its name."""
        if network is not None:
            options["network"] = network.name
            options["networking_config"] = {
                network.name: self.client.api.create_endpoint_config(aliases=list(aliases))
            }
        options.setdefault("name", f"{NAME_PREFIX}-{uuid.uuid4().hex[:10]}")
        return self.client.containers.run(
            image, command, detach=True, labels=self.labels, mounts=list(mounts), **options
        )

    def run(
        self, image: str, command: list[str] | str | None = None, *, timeout: float = 900, **options
    ) -> Exited:
        """Start a container, wait for its exit (see `wait`), remove it; its exit status and log."""
        container = self.start(image, command, **options)
        try:
            return wait(container, timeout)
        finally:
            _remove(container, self.client)

    def network(self) -> Network:
        """A private bridge network: the containers on it reach each other, nothing outside."""
        return self.client.networks.create(
            f"{NAME_PREFIX}-{uuid.uuid4().hex[:10]}", driver="bridge", internal=True, labels=self.labels
        )

    def build(self, context: Path, tag: str) -> Image:
        """`docker build -t tag context`, the image labelled like everything else here."""
        image, _ = self.client.images.build(
            path=str(context), tag=tag, labels=self.labels, rm=True, forcerm=True, timeout=1800
        )
        return image

    def close(self) -> None:
        for obj in _labelled(self.client, f"{SCOPE_LABEL}={self.labels[SCOPE_LABEL]}"):
            _remove(obj, self.client)
