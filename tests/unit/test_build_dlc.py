"""`./build.sh build --dlc current|smddp`: which AWS PyTorch training DLC (or stand-in) the image builds FROM,
and the label that records it. build.sh runs for real against a fake `docker` on PATH that logs its words."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from yolov5_smddp import dlc

ROOT = Path(__file__).resolve().parents[2]


def _build(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, list[str], str]:
    """(exit code, stdout + stderr, the `docker build` command lines, the tag: stdout's last line)"""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "docker.log"
    fake = bin_dir / "docker"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {log}\nexit 0\n')  # every image "exists"
    fake.chmod(0o755)
    run_env = {k: v for k, v in os.environ.items() if k not in ("DLC", "BASE", "AWS_REGION", "REGION")}
    run_env.update(PATH=f"{bin_dir}{os.pathsep}{run_env['PATH']}", **(env or {}))
    proc = subprocess.run(
        ["bash", str(ROOT / "build.sh"), "build", *args],
        capture_output=True,
        text=True,
        env=run_env,
        timeout=60,
        check=False,
    )
    builds = [
        line for line in (log.read_text().splitlines() if log.exists() else []) if line.startswith("build ")
    ]
    tag = (proc.stdout.strip().splitlines() or [""])[-1]
    return proc.returncode, proc.stdout + proc.stderr, builds, tag


def _arg(build: str, name: str) -> str:
    words = build.split()
    values = [
        words[i + 1].split("=", 1)[1]
        for i, w in enumerate(words[:-1])
        if w == "--build-arg" and words[i + 1].startswith(f"{name}=")
    ]
    assert len(values) == 1, build
    return values[0]


def test_the_default_dlc_is_the_current_one_and_the_label_says_so(tmp_path):
    rc, out, builds, tag = _build(tmp_path, "--base", "dlc")
    assert rc == 0, out
    assert len(builds) == 1
    assert _arg(builds[0], "BASE_IMAGE") == dlc.dlc_image_uri("us-west-2", dlc.CURRENT_DLC_TAG)
    assert _arg(builds[0], "DLC") == "current"
    assert tag.startswith("yolov5-smddp:") and not tag.endswith(("-smddp", "-standin"))


@pytest.mark.parametrize("how", ["option", "environment"])
def test_dlc_smddp_builds_from_the_smddp_dlc_with_its_own_tag(tmp_path, how):
    args, env = (["--dlc", "smddp"], None) if how == "option" else ([], {"DLC": "smddp"})
    rc, out, builds, tag = _build(tmp_path, "--base", "dlc", "--region", "eu-west-1", *args, env=env)
    assert rc == 0, out
    assert _arg(builds[0], "BASE_IMAGE") == dlc.dlc_image_uri("eu-west-1", dlc.SMDDP_DLC_TAG)
    assert _arg(builds[0], "DLC") == "smddp"
    assert tag.endswith("-smddp")
    assert " -t yolov5-smddp:latest-dlc-smddp " in f" {builds[0]} "


def test_an_unknown_dlc_is_one_clear_line(tmp_path):
    rc, out, builds, _ = _build(tmp_path, "--dlc", "2.9")
    assert rc != 0 and not builds
    assert "--dlc must be current or smddp (got '2.9')" in out


def test_the_dockerfile_labels_the_flavour_and_defaults_to_the_current_dlc():
    text = (ROOT / "Dockerfile").read_text()
    assert 'io.github.yolov5-smddp.dlc="${DLC}"' in text
    [labels_arg] = [line for line in text.splitlines() if line.startswith("ARG BASE_IMAGE ")]
    assert " DLC=current " in labels_arg and "ARG DLC_TAG=${CURRENT_DLC_TAG}\n" in text
    assert dlc.DEFAULT_DLC == "current" and dlc.DLC_TAGS["smddp"] == dlc.SMDDP_DLC_TAG
