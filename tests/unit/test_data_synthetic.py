"""The embedded default dataset: deterministic, valid, and boxes tight around the drawn shapes."""

import hashlib

import numpy as np
import pytest
from datatree import watch

from yolov5_smddp.data.config import load_data_config
from yolov5_smddp.data.labels import build_label_index
from yolov5_smddp.data.synthetic import CLASS_NAMES, _draw_object, make_default_dataset


def _digest(root):
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


def test_deterministic_and_loads(tmp_path):
    y1 = make_default_dataset(tmp_path / "a", n_train=6, n_val=2, imgsz=128, seed=5)
    make_default_dataset(tmp_path / "b", n_train=6, n_val=2, imgsz=128, seed=5)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    cfg = load_data_config(watch(y1.parent) / "data.yaml")
    assert cfg.names == list(CLASS_NAMES)
    index = build_label_index(cfg.train, nc=cfg.nc, root=cfg.root, cache_dir=tmp_path / "c")
    assert index.report.usable == 6 and index.report.bad == 0 and index.report.boxes >= 6
    assert index.shapes.tolist() == [[96, 128]] * 6
    assert len(build_label_index(cfg.val, nc=cfg.nc, root=cfg.root, cache_dir=tmp_path / "c").images) == 2


@pytest.mark.parametrize("cls", [0, 1, 2])
def test_drawn_object_box_is_tight(cls):
    img = np.zeros((60, 80, 3), np.uint8)
    box = _draw_object(img, cls, np.array([10, 5, 50, 40]), (255, 255, 255), np.random.default_rng(cls))
    ys, xs = np.nonzero(img.any(axis=2))
    assert box.tolist() == [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
    assert box[0] >= 10 and box[1] >= 5 and box[2] <= 51 and box[3] <= 41


def test_labels_are_normalised_boxes_of_every_class(tmp_path):
    yaml_path = make_default_dataset(tmp_path / "d", n_train=10, n_val=0, imgsz=160, seed=2)
    cfg = load_data_config(watch(yaml_path.parent) / "data.yaml")
    index = build_label_index(cfg.train, nc=cfg.nc, root=cfg.root, cache_dir=tmp_path / "c")
    labels = np.concatenate(index.labels)
    assert set(labels[:, 0].astype(int)) == {0, 1, 2}
    assert (labels[:, 3:] > 0.1).all() and (labels[:, 3:] < 0.5).all()
    xyxy = np.concatenate([labels[:, 1:3] - labels[:, 3:] / 2, labels[:, 1:3] + labels[:, 3:] / 2], axis=1)
    assert (xyxy >= 0).all() and (xyxy <= 1).all()
