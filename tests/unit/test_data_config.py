"""data.yaml parsing: path resolution, SageMaker root override, names/nc checks, errors naming file and key."""

from pathlib import Path

import pytest

from yolov5_smddp.data.config import load_data_config
from yolov5_smddp.errors import DataError


def _dataset(root: Path) -> None:
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)


def test_relative_path_resolves_against_yaml_folder_not_cwd(tmp_path, monkeypatch):
    _dataset(tmp_path / "ds")
    yaml_path = tmp_path / "ds" / "data.yaml"
    yaml_path.write_text("path: .\ntrain: images/train\nval: [images/val]\nnames: [a, b]\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_data_config(yaml_path)
    assert cfg.root == (tmp_path / "ds").resolve()
    assert cfg.train == [(tmp_path / "ds" / "images" / "train").resolve()]
    assert cfg.val == [(tmp_path / "ds" / "images" / "val").resolve()]
    assert cfg.test == []
    assert cfg.names == ["a", "b"] and cfg.nc == 2


def test_missing_path_means_yaml_folder_and_names_dict(tmp_path):
    _dataset(tmp_path)
    (tmp_path / "d.yaml").write_text("train: images/train\nval: images/val\nnames: {1: dog, 0: cat}\nnc: 2\n")
    cfg = load_data_config(tmp_path / "d.yaml")
    assert cfg.root == tmp_path.resolve()
    assert cfg.names == ["cat", "dog"]


def test_root_override_rebases_absolute_entries(tmp_path):
    channel = tmp_path / "opt" / "ml" / "input" / "data" / "training"
    _dataset(channel)
    yaml_path = channel / "data.yaml"
    yaml_path.write_text(
        "path: /home/me/data\ntrain: /home/me/data/images/train\nval: images/val\nnames: [a]\n"
    )
    cfg = load_data_config(yaml_path, root_override=channel)
    assert cfg.root == channel.resolve()
    assert cfg.train == [(channel / "images" / "train").resolve()]
    assert cfg.val == [(channel / "images" / "val").resolve()]


def test_missing_root_without_override_names_key(tmp_path):
    yaml_path = tmp_path / "data.yaml"
    yaml_path.write_text(
        "path: /home/me/nonexistent-data\ntrain: images/train\nval: images/val\nnames: [a]\n"
    )
    with pytest.raises(DataError, match=r"data\.yaml: key 'path'.*nonexistent-data"):
        load_data_config(yaml_path)


@pytest.mark.parametrize(
    ("body", "pattern"),
    [
        ("train: images/train\nnames: [a]\n", "key 'val' is missing"),
        ("train: images/train\nval: images/nope\nnames: [a]\n", "key 'val'.*images/nope does not exist"),
        ("train: images/train\nval: images/val\nnames: [a, b]\nnc: 3\n", "key 'nc' is 3 but 'names' lists 2"),
        ("train: images/train\nval: images/val\nnames: {0: a, 2: b}\n", "key 'names'.*without gaps"),
        ("train: images/train\nval: images/val\n", "key 'names' is missing"),
        ("- just a list\n", "expected a mapping"),
    ],
)
def test_errors_name_the_yaml_and_key(tmp_path, body, pattern):
    _dataset(tmp_path)
    yaml_path = tmp_path / "data.yaml"
    yaml_path.write_text(body)
    with pytest.raises(DataError, match=pattern) as info:
        load_data_config(yaml_path)
    assert str(yaml_path.resolve()) in str(info.value)


def test_missing_yaml_file(tmp_path):
    with pytest.raises(DataError, match="data.yaml not found"):
        load_data_config(tmp_path / "nope.yaml")
