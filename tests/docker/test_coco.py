"""A SageMaker `training` channel of images + one COCO instances JSON (no data.yaml, no conversion) trains
through the container, with a `validation` channel of the same form; both channels read-only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docker.conftest import REPO, TINY_HPS, opt_ml_mounts, opt_ml_tree
from tests.docker.engine import Engine, bind

pytestmark = [pytest.mark.docker, pytest.mark.slow]

MAKE_COCO = """
import sys
from pathlib import Path
sys.path.insert(0, '/support')
from cocotree import write_coco_dataset
write_coco_dataset(Path('/d/train'), n_images=16, seed=1, crowd_every=4, backgrounds=2)
write_coco_dataset(Path('/d/val'), n_images=6, seed=2, crowd_every=3, backgrounds=1, first_id=50)
"""


def make_coco_channels(engine: Engine, image: str, data: Path) -> Path:
    """`MAKE_COCO` run in the image under test (its OpenCV writes the JPEGs): data/train and data/val,
    each images + instances.json; returns `data`."""
    data.mkdir()
    made = engine.run(
        image,
        ["-c", MAKE_COCO],
        entrypoint="python3",
        mounts=[bind(data, "/d"), bind(REPO / "tests" / "support", "/support", read_only=True)],
    )
    assert made.code == 0, made.log[-4000:]
    return data


def test_training_channel_of_images_and_a_coco_json_trains(image: str, tmp_path: Path, engine: Engine):
    data = make_coco_channels(engine, image, tmp_path / "coco")
    assert (data / "train" / "instances.json").is_file() and not (data / "train" / "data.yaml").exists()
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    root = opt_ml_tree(
        tmp_path / "ml", host="algo-1", hosts=["algo-1"], hps=TINY_HPS, channels=("training", "validation")
    )
    channels = {"training": data / "train", "validation": data / "val"}
    run = engine.run(image, "train", hostname="algo-1", mounts=opt_ml_mounts(root, channels))
    log = run.log
    assert run.code == 0, log[-4000:]
    assert "no data.yaml in channel /opt/ml/input/data/training; reading its COCO JSON instances.json" in log
    # both channels' JSONs indexed before the workers start; the validation channel's is what is scored
    assert re.search(
        r"dataset check train \(/opt/ml/input/data/training/instances.json\): 16 images, 16 usable", log
    )
    assert "dataset check val (/opt/ml/input/data/validation/instances.json): 6 images, 6 usable" in log
    assert (root / "model" / "best.pt").is_file()
    assert (root / "output" / "success").is_file() and not (root / "output" / "failure").exists()
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == before  # nothing written beside the JSON
