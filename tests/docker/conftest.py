"""Container tests: they drive the Docker CLI from the host (no torch needed here) against the image that
`./build.sh test` built (YOLOV5_SMDDP_IMAGE). Skipped, with the reason, where no engine or image exists."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Tiny and quick on a 2-core CPU: yolov5n, 64 px, one epoch.
TINY_HPS = {
    "cfg": "yolov5n",
    "epochs": "1",
    "imgsz": "64",
    "batch-size": "8",
    "workers": "0",
    "log-every": "1",
    "dist-timeout": "60",
}


def docker(*args: str, check: bool = True, timeout: float = 900, **kwargs) -> subprocess.CompletedProcess:
    """Run the docker CLI (a list of words, never a shell string); text output captured."""
    return subprocess.run(
        ["docker", *args], check=check, timeout=timeout, capture_output=True, text=True, **kwargs
    )


def _engine_reason() -> str | None:
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "no Docker engine is reachable"
    return None


@pytest.fixture(scope="session")
def image() -> str:
    import os

    reason = _engine_reason()
    if reason:
        pytest.skip(reason)
    tag = os.environ.get("YOLOV5_SMDDP_IMAGE")
    if not tag:
        pytest.skip("YOLOV5_SMDDP_IMAGE is not set (./build.sh test builds the image and sets it)")
    if docker("image", "inspect", tag, check=False).returncode != 0:
        pytest.skip(f"image {tag} does not exist (run ./build.sh test)")
    return tag


def in_image(image: str, mounts: dict[Path, str], code: str) -> None:
    """Run a Python snippet inside the image (numpy/cv2 live there, not on the host)."""
    volumes = [w for host, inside in mounts.items() for w in ("-v", f"{host}:{inside}")]
    docker("run", "--rm", "--entrypoint", "python3", *volumes, image, "-c", code)


MAKE_DATASET = """
import numpy as np, os
from pathlib import Path
from yolov5_smddp.data.synthetic import make_default_dataset
root = Path('/d')
make_default_dataset(root, n_train=16, n_val=8, imgsz=64, seed=1)
# A stale cache in the release's format: np.save of a dict keyed by absolute paths of another machine,
# renamed to labels/train.cache. Only arrays, strings and numbers: nothing executable.
stale = {f'/home/someone/datasets/coco128/images/train2017/{i:012d}.jpg': [np.zeros((1, 5), np.float32), (64, 48), []]
         for i in range(4)}
stale.update(hash='0123456789abcdef', version=0.7, msgs=[], results=(4, 0, 0, 0, 4))
np.save('/d/labels/train.cache.npy', np.array(stale, dtype=object), allow_pickle=True)
os.replace('/d/labels/train.cache.npy', '/d/labels/train.cache')
"""


@pytest.fixture(scope="session")
def dataset(image: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny dataset (16 train and 8 val images of 64 x 48 px) with a stale release-format labels/train.cache."""
    root = tmp_path_factory.mktemp("dataset")
    in_image(image, {root: "/d"}, MAKE_DATASET)
    assert (root / "data.yaml").is_file() and (root / "labels" / "train.cache").is_file()
    return root


def opt_ml_tree(
    root: Path, *, host: str, hosts: list[str], hps: dict[str, str], channels: tuple[str, ...] = ()
) -> Path:
    """A /opt/ml tree as SageMaker lays it out for `host`: input/config/*.json, model, output, checkpoints."""
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(
        json.dumps(
            {
                "current_host": host,
                "hosts": hosts,
                "network_interface_name": "eth0",
                "current_group_name": "homogeneousCluster",
                "current_instance_type": "ml.c5.xlarge",
                "instance_groups": [
                    {
                        "instance_group_name": "homogeneousCluster",
                        "instance_type": "ml.c5.xlarge",
                        "hosts": hosts,
                    }
                ],
            }
        )
    )
    (config / "hyperparameters.json").write_text(json.dumps(hps))
    (config / "inputdataconfig.json").write_text(
        json.dumps({c: {"TrainingInputMode": "File"} for c in channels})
    )
    for sub in ("model", "output", "checkpoints"):
        (root / sub).mkdir()
    return root


def opt_ml_mounts(root: Path, channels: dict[str, Path]) -> list[str]:
    """`docker run` volume words: config read-only, channels read-only (as FastFile/FSx are to us)."""
    words = ["-v", f"{root / 'input' / 'config'}:/opt/ml/input/config:ro"]
    for name, folder in channels.items():
        words += ["-v", f"{folder}:/opt/ml/input/data/{name}:ro"]
    for sub in ("model", "output", "checkpoints"):
        words += ["-v", f"{root / sub}:/opt/ml/{sub}"]
    return words


@pytest.fixture
def network() -> Iterator[str]:
    """A private network (no outside access) for a two-host cluster; removed afterwards."""
    name = f"yolov5-smddp-test-{uuid.uuid4().hex[:8]}"
    docker("network", "create", "--internal", name)
    try:
        yield name
    finally:
        docker("network", "rm", name, check=False)


@pytest.fixture
def containers() -> Iterator[list[str]]:
    """Names of containers a test starts; force-removed afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        docker("rm", "-f", name, check=False)
