"""docker/standin/build.sh: which path builds the stand-in (Dockerfile or debootstrap) and the tag, which must
not depend on the path. Runs the real script with a fake `docker` first on PATH that answers from a list of
present and pullable images and records every call; the real builds are CI's (debootstrap) and
docker/standin/check_paths.sh (both)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

STANDIN = Path(__file__).resolve().parents[2] / "docker" / "standin"
RECIPE = [
    "Dockerfile",
    "packages.txt",
    "pip-requirements.txt",
    "setup.sh",
    "start_with_right_hostname.sh",
    "torch_without_libuv.py",
]

FAKE_DOCKER = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_DOCKER_LOG"
case "$1" in
    image) [[ " $FAKE_PRESENT " == *" $3 "* ]] ;;
    pull) [[ " $FAKE_PULLABLE " == *" ${@: -1} "* ]] ;;
    build) ls "${@: -1}" >> "$FAKE_DOCKER_LOG" ;;
    *) exit 99 ;;
esac
"""


@pytest.fixture
def fake(tmp_path: Path):
    """run(*args, present=(), pullable=(), **env) -> (exit code, stdout, stderr, the docker calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    log = tmp_path / "docker.log"

    def run(*args: str, folder: Path = STANDIN, present=(), pullable=(), **env: str):
        log.write_text("")
        environ = {k: v for k, v in os.environ.items() if not k.startswith("STANDIN_")}
        environ.update(
            PATH=f"{bin_dir}:{os.environ['PATH']}",
            FAKE_DOCKER_LOG=str(log),
            FAKE_PRESENT=" ".join(present),
            FAKE_PULLABLE=" ".join(pullable),
            TMPDIR=str(tmp_path),
            **env,
        )
        proc = subprocess.run(
            ["bash", str(folder / "build.sh"), *args],
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return proc.returncode, proc.stdout, proc.stderr, log.read_text().splitlines()

    return run


def expected_tag(folder: Path = STANDIN, suite: str = "trixie") -> str:
    content = b"".join((folder / name).read_bytes() for name in RECIPE) + f"{suite}\n".encode()
    return f"yolov5-smddp-standin:{hashlib.sha256(content).hexdigest()[:12]}"


def test_the_tag_is_the_recipe_hash_whichever_path(fake):
    tags = {
        method: fake("--tag", STANDIN_METHOD=method)[1].strip()
        for method in ("auto", "dockerfile", "debootstrap")
    }
    assert set(tags.values()) == {expected_tag()}
    assert fake("--tag", STANDIN_SUITE="bookworm")[1].strip() == expected_tag(suite="bookworm")
    assert fake("--tag", STANDIN_IMAGE_NAME="other")[1].strip() == "other:" + expected_tag().split(":")[1]


def test_the_tag_follows_each_recipe_file_but_not_the_driver(fake, tmp_path: Path):
    copy = tmp_path / "standin"
    shutil.copytree(STANDIN, copy)
    original = fake("--tag", folder=copy)[1].strip()
    assert original == expected_tag()
    with (copy / "build.sh").open("a") as f:  # the driver: not part of the image
        f.write("# a comment\n")
    assert fake("--tag", folder=copy)[1].strip() == original
    seen = {original}
    for name in RECIPE:
        with (copy / name).open("a") as f:
            f.write("# changed\n")
        tag = fake("--tag", folder=copy)[1].strip()
        assert tag == expected_tag(copy) and tag not in seen, name
        seen.add(tag)


@pytest.mark.parametrize(
    ("env", "present", "pullable", "method", "calls"),
    [
        ({}, ["debian:trixie-slim"], [], "dockerfile", ["image inspect debian:trixie-slim"]),
        (
            {},
            [],
            ["debian:trixie-slim"],
            "dockerfile",
            ["image inspect debian:trixie-slim", "pull -q debian:trixie-slim"],
        ),
        ({}, [], [], "debootstrap", ["image inspect debian:trixie-slim", "pull -q debian:trixie-slim"]),
        ({"STANDIN_METHOD": "dockerfile"}, [], [], "dockerfile", []),
        ({"STANDIN_METHOD": "debootstrap"}, ["debian:trixie-slim"], [], "debootstrap", []),
        (
            {"STANDIN_SUITE": "bookworm"},
            ["debian:bookworm-slim"],
            [],
            "dockerfile",
            ["image inspect debian:bookworm-slim"],
        ),
        (
            {"STANDIN_BASE_IMAGE": "mirror.local/debian:trixie-slim"},
            ["debian:trixie-slim"],
            [],
            "debootstrap",
            ["image inspect mirror.local/debian:trixie-slim", "pull -q mirror.local/debian:trixie-slim"],
        ),
    ],
)
def test_the_path_is_chosen_by_the_base_image_or_the_override(fake, env, present, pullable, method, calls):
    code, out, err, docker_calls = fake("--method", present=present, pullable=pullable, **env)
    assert code == 0, err
    assert out.strip() == method
    assert docker_calls == calls
    if calls and method == "debootstrap":
        assert "cannot be pulled: building with debootstrap instead" in err


def test_an_unknown_method_is_refused_by_name(fake):
    code, out, err, _ = fake("--method", STANDIN_METHOD="podman")
    assert code == 1 and out == ""
    assert "STANDIN_METHOD must be auto, dockerfile or debootstrap (got 'podman')" in err


def test_a_built_stand_in_is_reused_whichever_path_built_it(fake):
    code, out, err, calls = fake(present=[expected_tag()])
    assert code == 0, err
    assert out.splitlines()[-1] == expected_tag()
    assert calls == [f"image inspect {expected_tag()}"]  # no base image probe, no build


def test_the_dockerfile_path_builds_the_recipe_with_the_suite_and_base(fake):
    code, out, err, calls = fake(pullable=["debian:trixie-slim"])
    assert code == 0, err
    assert out.splitlines()[-1] == expected_tag()
    build = next(i for i, call in enumerate(calls) if call.startswith("build "))
    words = calls[build].split()
    assert words[:7] == [
        "build",
        "--build-arg",
        "SUITE=trixie",
        "--build-arg",
        "BASE_IMAGE=debian:trixie-slim",
        "-t",
        expected_tag(),
    ]
    assert sorted(calls[build + 1 :]) == sorted([*RECIPE, "host-ca.crt"])  # the staged build context
    assert "with the dockerfile path" in err


DLC_VERSIONS = STANDIN.parent / "dlc-versions"
DLC_RECIPE = ["Dockerfile", "packages.txt", "pip-requirements.txt", "setup.sh"]


def expected_dlc_tag(folder: Path = DLC_VERSIONS) -> str:
    content = b"".join((folder / name).read_bytes() for name in DLC_RECIPE) + b"bookworm\n"
    return f"yolov5-smddp-dlc-versions-base:{hashlib.sha256(content).hexdigest()[:12]}"


def test_the_dlc_versions_base_is_built_by_the_same_driver_from_its_own_recipe(fake):
    code, out, err, calls = fake(folder=DLC_VERSIONS, pullable=["debian:bookworm-slim"])
    assert code == 0, err
    assert out.splitlines()[-1] == expected_dlc_tag()
    build = next(i for i, call in enumerate(calls) if call.startswith("build "))
    assert calls[build].split()[:7] == [
        "build",
        "--build-arg",
        "SUITE=bookworm",
        "--build-arg",
        "BASE_IMAGE=debian:bookworm-slim",
        "-t",
        expected_dlc_tag(),
    ]
    assert sorted(calls[build + 1 :]) == sorted([*DLC_RECIPE, "host-ca.crt"])


def test_the_dlc_versions_tag_follows_its_recipe_and_leaves_the_stand_ins_alone(fake, tmp_path: Path):
    copy = tmp_path / "docker"
    shutil.copytree(STANDIN.parent, copy)
    assert fake("--tag", folder=copy / "dlc-versions")[1].strip() == expected_dlc_tag()
    seen = {expected_dlc_tag()}
    for name in DLC_RECIPE:
        with (copy / "dlc-versions" / name).open("a") as f:
            f.write("# changed\n")
        tag = fake("--tag", folder=copy / "dlc-versions")[1].strip()
        assert tag == expected_dlc_tag(copy / "dlc-versions") and tag not in seen, name
        seen.add(tag)
    assert fake("--tag", folder=copy / "standin")[1].strip() == expected_tag()
