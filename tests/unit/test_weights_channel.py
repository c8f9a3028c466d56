"""Pretrained weights on SageMaker: a `weights` (or `model`) channel's .pt becomes the workers' --weights."""

import json
import shutil
from pathlib import Path

import pytest

from yolov5_smddp.errors import ConfigError, WeightsError
from yolov5_smddp.sagemaker import main
from yolov5_smddp.sagemaker.dataset import weights_from_channel
from yolov5_smddp.sagemaker.env import read_environment

RELEASE_YOLOV5N = Path(__file__).parents[1] / "fixtures" / "release_models" / "yolov5n.pt"


def _job(base: Path, channels: dict[str, list[str]]) -> Path:
    """A one-host /opt/ml tree whose channels hold the named files (a `.pt` is the release's yolov5n)."""
    config = base / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    (config / "hyperparameters.json").write_text("{}")
    (config / "inputdataconfig.json").write_text(json.dumps({c: {} for c in channels}))
    for name, files in channels.items():
        folder = base / "input" / "data" / name
        folder.mkdir(parents=True)
        for file in files:
            if file.endswith(".pt"):
                shutil.copyfile(RELEASE_YOLOV5N, folder / file)
            else:
                (folder / file).write_text("not weights")
    return base


def _env(base: Path):
    return read_environment({"SAGEMAKER_BASE_DIR": str(base)})


def test_the_channels_only_pt_becomes_the_weights(tmp_path):
    base = _job(tmp_path, {"weights": ["yolov5s.pt", "README.txt"]})
    assert weights_from_channel(_env(base), None) == base / "input" / "data" / "weights" / "yolov5s.pt"
    model = _job(tmp_path / "m", {"model": ["best.pt"]})
    assert weights_from_channel(_env(model), None) == model / "input" / "data" / "model" / "best.pt"


def test_a_relative_weights_name_is_a_file_of_the_channel(tmp_path):
    base = _job(tmp_path, {"weights": ["yolov5s.pt", "yolov5m.pt"]})
    channel = base / "input" / "data" / "weights"
    assert weights_from_channel(_env(base), "yolov5m.pt") == channel / "yolov5m.pt"
    assert weights_from_channel(_env(base), "/opt/image/yolov5s.pt") is None  # absolute: as given
    with pytest.raises(ConfigError) as missing:
        weights_from_channel(_env(base), "yolov5x.pt")
    assert str(missing.value) == (
        f"--weights yolov5x.pt: not in the weights channel {channel} (it holds: yolov5m.pt, yolov5s.pt)"
    )
    with pytest.raises(ConfigError) as several:
        weights_from_channel(_env(base), None)
    assert str(several.value) == (
        f"weights channel {channel} holds 2 .pt files (yolov5m.pt, yolov5s.pt): put one .pt there, or pass "
        "--weights NAME"
    )


def test_no_weights_channel_changes_nothing(tmp_path):
    base = _job(tmp_path, {"training": []})
    assert weights_from_channel(_env(base), None) is None
    assert weights_from_channel(_env(base), "yolov5s.pt") is None


def test_an_unusable_weights_channel_is_one_line(tmp_path):
    empty = _job(tmp_path / "e", {"weights": ["notes.txt"]})
    with pytest.raises(ConfigError, match=r"holds 0 .pt files \(none; other files: notes.txt\)"):
        weights_from_channel(_env(empty), None)
    broken = _job(tmp_path / "b", {"weights": []})
    (broken / "input" / "data" / "weights" / "yolov5s.pt").write_text("an HTML error page")
    with pytest.raises(WeightsError, match="yolov5s.pt: not a PyTorch checkpoint"):
        weights_from_channel(_env(broken), None)
    # through the entry point: the failure file's first line, no worker started
    code = main(["--epochs", "1"], environ={"SAGEMAKER_BASE_DIR": str(broken)})
    first = (broken / "output" / "failure").read_text().splitlines()[0]
    assert code != 0 and "yolov5s.pt: not a PyTorch checkpoint" in first
    assert not (broken / "model" / "best.pt").exists()
