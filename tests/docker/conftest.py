"""Container tests: they drive the Docker engine from the host through the Docker SDK for Python (no torch
needed here) against the image that `./build.sh test` built (YOLOV5_SMDDP_IMAGE). Where no engine or image
exists they are skipped, with the reason, on a developer's machine; they FAIL under CI (tests/skip_policy.py)
and whenever YOLOV5_SMDDP_IMAGE names the image to test. Everything they make is removed afterwards
(tests/docker/engine.py)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The test image's pytest walks this folder too, without the SDK (only the host venv has it): skip the folder
# there, but not where the caller asked for these tests by naming the image. (`docker.errors`: a bare `docker`
# would find the repository's docker/ folder.)
if not os.environ.get("YOLOV5_SMDDP_IMAGE"):
    pytest.importorskip(
        "docker.errors", reason="the Docker SDK for Python is not installed (./build.sh test has it)"
    )

import docker  # noqa: E402
from docker.errors import DockerException, ImageNotFound  # noqa: E402
from docker.types import Mount  # noqa: E402

from tests.docker.engine import OWNER, Engine, bind, remove_leftovers, remove_owned  # noqa: E402
from tests.skip_policy import strict  # noqa: E402

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


def _required() -> bool:
    """A missing engine or image fails these tests under CI and when the caller named the image."""
    return strict() or bool(os.environ.get("YOLOV5_SMDDP_IMAGE"))


def _missing(message: str) -> None:
    if _required():
        pytest.fail(f"{message} (the container tests were asked for: CI or YOLOV5_SMDDP_IMAGE is set)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def client() -> Iterator[docker.DockerClient]:
    """The engine (a skip without one, a failure where it is required), cleared of what killed earlier runs
    left behind."""
    try:
        # A busy machine answers slowly: 300 s for each API call that has no timeout of its own.
        engine = docker.from_env(timeout=300)
        engine.ping()
    except DockerException as err:
        _missing(f"no Docker engine is reachable: {err}")
    removed = remove_leftovers(engine)
    if removed:
        print(f"removed leftovers of an interrupted run: {', '.join(removed)}", file=sys.stderr)
    yield engine
    remove_owned(engine, OWNER)
    engine.close()


@pytest.fixture(scope="session")
def image(client: docker.DockerClient) -> str:
    tag = os.environ.get("YOLOV5_SMDDP_IMAGE")
    if not tag:
        _missing("YOLOV5_SMDDP_IMAGE is not set (./build.sh test builds the image and sets it)")
    try:
        client.images.get(tag)
    except ImageNotFound:
        _missing(f"image {tag} does not exist (run ./build.sh test)")
    return tag


@pytest.fixture
def engine(client: docker.DockerClient) -> Iterator[Engine]:
    """This test's containers, networks and images: removed when it ends, passed or failed."""
    made = Engine(client)
    yield made
    made.close()


@pytest.fixture(scope="session")
def session_engine(client: docker.DockerClient) -> Iterator[Engine]:
    made = Engine(client)
    yield made
    made.close()


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
def dataset(image: str, session_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny dataset (16 train and 8 val images of 64 x 48 px) with a stale release-format labels/train.cache,
    made inside the image (numpy/cv2 live there, not on the host)."""
    root = tmp_path_factory.mktemp("dataset")
    made = session_engine.run(image, ["-c", MAKE_DATASET], entrypoint="python3", mounts=[bind(root, "/d")])
    assert made.code == 0, made.log[-4000:]
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


def opt_ml_mounts(root: Path, channels: dict[str, Path]) -> list[Mount]:
    """The container's mounts: config read-only, channels read-only (as FastFile/FSx are to us)."""
    mounts = [bind(root / "input" / "config", "/opt/ml/input/config", read_only=True)]
    mounts += [
        bind(folder, f"/opt/ml/input/data/{name}", read_only=True) for name, folder in channels.items()
    ]
    mounts += [bind(root / sub, f"/opt/ml/{sub}") for sub in ("model", "output", "checkpoints")]
    return mounts
