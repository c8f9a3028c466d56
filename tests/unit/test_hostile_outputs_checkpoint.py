"""Our own weights format with hostile metadata (issue 42, item 4): a `names` entry built as a
shared-reference bomb (a few hundred bytes in the file, 2**40 values written out) or of the wrong type is
one `error:` line in export and predict, refused before anything walks it."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from yolov5_smddp.cli import main
from yolov5_smddp.errors import WeightsError
from yolov5_smddp.models.weights import FORMAT, MAX_META_VALUES, load_weights, save_weights
from yolov5_smddp.models.yolo import build_model


def _bomb(depth: int = 40) -> list:
    names: list = ["x"]
    for _ in range(depth):
        names = [names, names]
    return names


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return save_weights(tmp_path_factory.mktemp("w") / "good.pt", build_model("yolov5n", nc=2), meta={})


def _with_names(good: Path, folder: Path, names) -> Path:
    saved = torch.load(good, weights_only=True)
    saved["meta"]["names"] = names
    path = folder / "hostile.pt"
    torch.save({"format": FORMAT, "state_dict": saved["state_dict"], "meta": saved["meta"]}, path)
    return path


def test_a_names_bomb_is_small_on_disk_and_refused_on_load(good, tmp_path):
    path = _with_names(good, tmp_path, _bomb())
    assert path.stat().st_size < good.stat().st_size + 4096
    with pytest.raises(WeightsError) as caught:
        load_weights(path)
    assert str(caught.value) == (
        f"{path}: its metadata holds over {MAX_META_VALUES:,} values (nested or repeated references); refused"
    )


@pytest.mark.parametrize("command", ["export", "predict"])
def test_export_and_predict_on_a_names_bomb_are_one_line(good, tmp_path, capsys, command):
    path = _with_names(good, tmp_path, _bomb())
    argv = [command, "--weights", str(path), "--imgsz", "64"]
    if command == "predict":
        images = tmp_path / "images"
        images.mkdir()
        cv2.imwrite(str(images / "a.jpg"), np.full((48, 64, 3), 90, np.uint8))
        argv += ["--source", str(images), "--out", str(tmp_path / "out")]
    else:
        argv += ["--output-dir", str(tmp_path / "exported")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {path}: its metadata holds over {MAX_META_VALUES:,} values (nested or repeated references); "
        "refused\n"
    )


@pytest.mark.parametrize("names", [["a", None], ["a", ["b"]], "ab", {"0": "a"}])
def test_names_that_are_not_strings_are_refused(good, tmp_path, names):
    path = _with_names(good, tmp_path, names)
    with pytest.raises(WeightsError) as caught:
        load_weights(path)
    assert str(caught.value) == f"{path}: its class names (meta 'names') are not a list of strings"


def test_our_own_files_still_load(good):
    assert load_weights(good).names == ["class0", "class1"]
