"""COCO instances JSON read directly: the conversion rules (exact), what is reported and skipped, the
data.yaml forms, the cached parse (in the cache folder only), and crowd regions in validation items."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import yaml
from cocotree import CLASS_OF, write_coco_dataset
from datatree import watch

from yolov5_smddp.data import coco
from yolov5_smddp.data.augment import AugmentParams
from yolov5_smddp.data.coco import convert_boxes, load_coco, parse_coco
from yolov5_smddp.data.config import load_data_config
from yolov5_smddp.data.dataset import YoloDataset
from yolov5_smddp.data.labels import build_label_index
from yolov5_smddp.errors import DataError


@pytest.fixture(autouse=True)
def _fresh_memo():
    coco._MEMO.clear()  # each test sees the disk cache, not an earlier test's parse
    yield
    coco._MEMO.clear()


def _doc(images, annotations, categories=None):
    return {
        "images": images,
        "annotations": annotations,
        "categories": categories
        or [{"id": 90, "name": "c90"}, {"id": 1, "name": "c1"}, {"id": 18, "name": "c18"}],
    }


def test_categories_map_to_indices_in_ascending_id_order():
    table = parse_coco(_doc([], []), "x.json")
    assert table.category_ids.tolist() == [1, 18, 90]
    assert table.names == ["c1", "c18", "c90"]


def test_bbox_pixels_become_normalised_centre_boxes_exactly():
    # 200 x 100 image: [x, y, w, h] = [20, 10, 60, 40] -> centre (50, 30), normalised by (200, 100)
    conv = convert_boxes(np.array([[20, 10, 60, 40]]), np.array([2]), 200, 100)
    np.testing.assert_allclose(conv.labels, [[2, 0.25, 0.3, 0.3, 0.4]], rtol=0, atol=1e-7)
    assert conv.keep.tolist() == [True] and conv.clipped.tolist() == [False]


def test_boxes_outside_the_image_are_clipped_and_boxes_without_area_dropped():
    boxes = np.array(
        [
            [-10, 0, 30, 50],  # reaches left of the image: clipped to x 0..20
            [190, 90, 20, 20],  # reaches past the right and bottom: clipped to 190..200, 90..100
            [10, 10, 0, 5],  # zero width
            [250, 10, 10, 10],  # wholly outside
        ]
    )
    conv = convert_boxes(boxes, np.zeros(4), 200, 100)
    assert conv.keep.tolist() == [True, True, False, False]
    assert conv.clipped.tolist() == [True, True, False, False]
    np.testing.assert_allclose(
        conv.labels[:, 1:], [[0.05, 0.25, 0.1, 0.5], [0.975, 0.95, 0.05, 0.1]], rtol=0, atol=1e-7
    )


def test_bad_annotations_are_messages_not_errors():
    images = [{"id": 5, "file_name": "a.jpg", "width": 10, "height": 10}, {"id": 6}]
    annotations = [
        {"id": 1, "image_id": 5, "category_id": 18, "bbox": [1, 1, 2, 2]},
        {"id": 2, "image_id": 99, "category_id": 18, "bbox": [1, 1, 2, 2]},
        {"id": 3, "image_id": 5, "category_id": 2, "bbox": [1, 1, 2, 2]},
        {"id": 4, "image_id": 5, "category_id": 1, "bbox": [1, 1, "x", 2]},
        {"id": 5, "image_id": 5, "category_id": 1, "bbox": [1, 1, -2, 2]},
        {"id": 6, "image_id": 5, "category_id": 90, "bbox": [0, 0, 4, 4], "iscrowd": 1},
    ]
    table = parse_coco(_doc(images, annotations), "x.json")
    assert table.classes.tolist() == [1, 2] and table.crowd.tolist() == [False, True]
    assert table.messages == [
        "x.json: image id 6: no 'file_name'",
        "x.json: annotation id 2: image_id 99 is not in 'images'",
        "x.json: annotation id 3: category_id 2 is not in 'categories'",
        "x.json: annotation id 4: bbox [1, 1, 'x', 2] is not four finite numbers [x, y, w, h]",
        "x.json: annotation id 5: bbox [1, 1, -2, 2] has a negative width or height",
    ]


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ([], "expected a JSON object"),
        ({"annotations": []}, "key 'images' is missing"),
        ({"images": [], "categories": []}, "key 'categories' is missing or empty"),
        ({"images": [], "categories": [{"id": 1}, {"id": 1}]}, "id 1 appears twice"),
    ],
)
def test_not_an_instances_file_is_a_data_error_naming_it(raw, why):
    with pytest.raises(DataError, match=f"x.json: .*{why}"):
        parse_coco(raw, "x.json")


def _index(json_path: Path, cache_dir: Path, nc: int = 3, image_dir=None):
    return build_label_index(
        [json_path], nc=nc, root=json_path.parent, cache_dir=cache_dir, workers=2, image_dir=image_dir
    )


def test_index_converts_every_box_and_keeps_crowds_apart(tmp_path):
    root = tmp_path / "data"
    json_path = write_coco_dataset(root, n_images=6, seed=1)
    watch(root)
    index = _index(json_path, tmp_path / "cache")
    raw = json.loads(json_path.read_text())
    assert len(index.images) == 6 and index.report.bad == 0
    by_id = {img["id"]: img for img in raw["images"]}
    for path, labels, crowd, image_id in zip(index.images, index.labels, index.crowd, index.coco.image_ids):
        img = by_id[int(image_id)]
        assert path == root / img["file_name"]
        mine = [a for a in raw["annotations"] if a["image_id"] == image_id]
        for rows, is_crowd in ((labels, 0), (crowd, 1)):
            want = [
                [CLASS_OF[a["category_id"]], (x + w / 2) / img["width"], (y + h / 2) / img["height"],
                 w / img["width"], h / img["height"]]
                for a in mine if a["iscrowd"] == is_crowd for x, y, w, h in [a["bbox"]]
            ]  # fmt: skip
            np.testing.assert_allclose(rows, np.array(want).reshape(-1, 5), rtol=0, atol=1e-6)
    assert index.coco.category_ids == [3, 7, 90]
    assert index.report.empty_labels >= 1  # the background image
    assert sum(len(c) for c in index.crowd) > 0
    assert index.report.boxes == sum(1 for a in raw["annotations"] if not a["iscrowd"])


def test_missing_images_and_dangling_annotations_are_skipped_and_named(tmp_path, caplog):
    root = tmp_path / "data"
    json_path = write_coco_dataset(root, n_images=5, seed=2)
    raw = json.loads(json_path.read_text())
    (root / raw["images"][2]["file_name"]).unlink()
    raw["images"][3]["width"] += 7  # the JSON disagrees with the file
    raw["annotations"].append({"id": 999, "image_id": 4242, "category_id": 3, "bbox": [1, 1, 5, 5]})
    raw["annotations"].append(
        {"id": 1000, "image_id": raw["images"][1]["id"], "category_id": 3, "bbox": [500, 500, 5, 5]}
    )
    json_path.write_text(json.dumps(raw))
    watch(root)
    with caplog.at_level(logging.WARNING):
        index = _index(json_path, tmp_path / "cache")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped: ")]
    missing, resized = root / raw["images"][2]["file_name"], root / raw["images"][3]["file_name"]
    img3 = raw["images"][3]
    assert f"skipped: {json_path}: annotation id 999: image_id 4242 is not in 'images'" in lines
    assert f"skipped: {missing}: image file not found" in lines
    assert (
        f"skipped: {resized}: the JSON says {img3['width']}x{img3['height']} pixels (image id {img3['id']}), "
        f"the file is {img3['width'] - 7}x{img3['height']}" in lines
    )
    assert any("bbox [500.0, 500.0, 5.0, 5.0] has no area inside the" in line for line in lines)
    assert len(index.images) == 3 and index.report.bad == 2 and index.report.found == 5
    assert missing not in index.images and resized not in index.images


def test_cached_in_the_cache_folder_by_content_never_beside_the_json(tmp_path):
    root = tmp_path / "data"
    json_path = write_coco_dataset(root, n_images=4, seed=3)
    watch(root)
    cache = tmp_path / "cache"
    first = _index(json_path, cache)
    assert first.report.cache == "built" and first.cache_path.parent == cache
    coco._MEMO.clear()
    second = _index(json_path, cache)
    assert second.report.cache == "loaded" and second.cache_path == first.cache_path
    for a, b in zip(first.labels, second.labels):
        np.testing.assert_array_equal(a, b)
    # an edit gives a new entry (the old one is not reused)
    raw = json.loads(json_path.read_text())
    raw["annotations"][0]["bbox"][0] += 1
    json_path.write_text(json.dumps(raw))
    watch(root)  # the test itself edited the JSON: a new baseline
    coco._MEMO.clear()
    third = _index(json_path, cache)
    assert third.report.cache == "built" and third.cache_path != first.cache_path
    assert len(list(cache.glob("*.cocoindex.npz"))) == 2


def test_image_checks_are_cached_and_redone_when_a_file_changes(tmp_path, caplog):
    root = tmp_path / "data"
    json_path = write_coco_dataset(root, n_images=4, seed=13)
    cache = tmp_path / "cache"
    assert _index(json_path, cache).report.cache == "built"
    coco._MEMO.clear()
    assert _index(json_path, cache).report.cache == "loaded"  # JSON parse and image checks from the cache
    victim = sorted((root / "images").iterdir())[1]
    victim.write_bytes(victim.read_bytes()[:200])  # truncated since the checks were cached
    coco._MEMO.clear()
    watch(root)
    with caplog.at_level(logging.WARNING):
        index = _index(json_path, cache)
    assert index.report.cache == "built" and victim not in index.images and index.report.bad == 1
    assert any(r.getMessage().startswith(f"skipped: {victim}: ") for r in caplog.records)


def test_cached_arrays_load_without_pickle(tmp_path):
    root = tmp_path / "data"
    json_path = write_coco_dataset(root, n_images=3, seed=4)
    table, state = load_coco(json_path, tmp_path / "cache")
    assert state == "built"
    (npz,) = (tmp_path / "cache").glob("*.cocoindex.npz")
    with np.load(npz, allow_pickle=False) as data:
        assert all(data[key].dtype != object for key in data.files)


def test_data_yaml_coco_form_with_an_image_folder(tmp_path):
    root = tmp_path / "data"
    train = write_coco_dataset(
        root,
        n_images=4,
        seed=5,
        image_folder="train2017",
        json_name="annotations/train.json",
        relative_to_json=False,
    )
    val = write_coco_dataset(
        root,
        n_images=3,
        seed=6,
        image_folder="val2017",
        json_name="annotations/val.json",
        relative_to_json=False,
    )
    (root / "data.yaml").write_text(
        yaml.safe_dump(
            {
                "train": "annotations/train.json",
                "train_images": "train2017",
                "val": "annotations/val.json",
                "val_images": "val2017",
            }
        )
    )
    watch(root)
    config = load_data_config(root / "data.yaml", cache_dir=tmp_path / "cache")
    assert config.names == ["three", "seven", "ninety"] and config.nc == 3
    assert config.train == [train] and config.val == [val]
    assert config.image_dirs == {"train": root / "train2017", "val": root / "val2017"}
    index = _index(config.val[0], tmp_path / "cache", image_dir=config.image_dirs["val"])
    assert all(p.parent == root / "val2017" for p in index.images) and index.report.bad == 0


def test_data_yaml_names_must_agree_with_the_categories(tmp_path):
    root = tmp_path / "data"
    write_coco_dataset(root, n_images=2, seed=7)
    (root / "data.yaml").write_text(
        yaml.safe_dump({"train": "instances.json", "val": "instances.json", "names": ["a", "b", "c"]})
    )
    with pytest.raises(
        DataError, match=r"key 'names' \['a', 'b', 'c'\] disagrees with the COCO JSON's categories"
    ):
        load_data_config(root / "data.yaml", cache_dir=tmp_path / "cache")


def test_splits_with_different_categories_are_refused(tmp_path):
    root = tmp_path / "data"
    write_coco_dataset(root, n_images=2, seed=8, json_name="a.json")
    other = write_coco_dataset(root, n_images=2, seed=9, json_name="b.json")
    raw = json.loads(other.read_text())
    raw["categories"][0]["id"] = 8
    other.write_text(json.dumps(raw))
    (root / "data.yaml").write_text(yaml.safe_dump({"train": "a.json", "val": "b.json"}))
    with pytest.raises(DataError, match="every split must use the same categories"):
        load_data_config(root / "data.yaml", cache_dir=tmp_path / "cache")


def test_a_coco_json_as_data_is_its_own_val_split(tmp_path):
    json_path = write_coco_dataset(tmp_path / "data", n_images=2, seed=10)
    config = load_data_config(json_path, cache_dir=tmp_path / "cache")
    assert config.val == [json_path] and config.names == ["three", "seven", "ninety"]


def test_validation_items_carry_crowds_and_training_items_never_do(tmp_path):
    root = tmp_path / "data"
    json_path = write_coco_dataset(root, n_images=6, seed=11, crowd_every=2)
    index = _index(json_path, tmp_path / "cache")
    i = next(k for k, c in enumerate(index.crowd) if len(c))
    hyp = {"mosaic": 0.0, "mixup": 0.0, "degrees": 0.0, "translate": 0.0, "scale": 0.0, "shear": 0.0,
           "perspective": 0.0, "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0, "fliplr": 0.0, "flipud": 0.0}  # fmt: skip
    val = YoloDataset(index, 64, augment=False, hyp=None)
    _, targets, _, _, _ = val[i]
    crowd_rows = targets[targets[:, 1] < 0]
    assert len(crowd_rows) == len(index.crowd[i])
    assert sorted((-1 - crowd_rows[:, 1]).tolist()) == sorted(index.crowd[i][:, 0].tolist())
    assert (targets[:, 1] >= 0).sum() == len(index.labels[i])
    train = YoloDataset(index, 64, augment=True, hyp=AugmentParams(**hyp))
    for k in range(len(index.images)):
        _, targets, _, _, _ = train[k]
        assert (targets[:, 1] >= 0).all() and len(targets) == len(index.labels[k])


def test_the_column_wise_parse_equals_the_checked_one():
    rng = np.random.default_rng(0)
    images = [{"id": 10 + 2 * i, "file_name": f"{i}.jpg", "width": 100, "height": 80} for i in range(20)]
    annotations = [
        {
            "id": k,
            "image_id": 10 + 2 * int(rng.integers(0, 20)),
            "category_id": [1, 18, 90][int(rng.integers(0, 3))],
            "bbox": rng.uniform(0, 50, 4).round(2).tolist(),
            "iscrowd": int(rng.random() < 0.2),
        }
        for k in range(200)
    ]
    clean = parse_coco(_doc(images, annotations), "x.json")  # every annotation well formed: by columns
    bad = {"id": 999, "image_id": 77, "category_id": 1, "bbox": [1, 1, 2, 2]}
    checked = parse_coco(_doc(images, [*annotations, bad]), "x.json")  # one by one
    assert clean.messages == [] and checked.messages == [
        "x.json: annotation id 999: image_id 77 is not in 'images'"
    ]
    for key in ("ann_image", "boxes", "classes", "crowd"):
        np.testing.assert_array_equal(getattr(clean, key), getattr(checked, key))
    assert clean.ann_image.dtype == checked.ann_image.dtype and clean.classes.dtype == checked.classes.dtype


class _Forgetful(dict):
    def __setitem__(self, key, value) -> None:
        pass


def test_one_process_parses_while_the_others_wait_and_load_its_arrays(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    json_path = write_coco_dataset(tmp_path / "data", n_images=3, seed=12)
    parses = []
    real = coco._parse_file

    def counted(*args):
        parses.append(1)
        return real(*args)

    monkeypatch.setattr(coco, "_parse_file", counted)
    monkeypatch.setattr(coco, "_MEMO", _Forgetful())  # each "rank" has its own memory: only the lock serves

    def rank(_):
        return load_coco(json_path, tmp_path / "cache")[1]

    with ThreadPoolExecutor(4) as pool:  # flock is per open file, so threads contend like processes
        states = list(pool.map(rank, range(4)))
    assert len(parses) == 1
    assert sorted(states) == ["built", "loaded", "loaded", "loaded"]


@pytest.mark.parametrize("single_cls", [False, True])
def test_training_reads_a_coco_data_yaml(tmp_path, single_cls):
    from yolov5_smddp.config.train_config import TrainConfig
    from yolov5_smddp.train.data_wiring import scan_data

    root = tmp_path / "data"
    write_coco_dataset(
        root, n_images=5, seed=14, image_folder="imgs", json_name="ann/train.json", relative_to_json=False
    )
    write_coco_dataset(
        root,
        n_images=4,
        seed=15,
        image_folder="vimgs",
        json_name="ann/val.json",
        relative_to_json=False,
        crowd_every=2,
    )
    (root / "data.yaml").write_text(
        yaml.safe_dump(
            {"train": "ann/train.json", "train_images": "imgs", "val": "ann/val.json", "val_images": "vimgs"}
        )
    )
    watch(root)
    bundle = scan_data(TrainConfig(data=str(root / "data.yaml"), single_cls=single_cls), tmp_path / "cache")
    assert len(bundle.train_index.images) == 5 and len(bundle.val_index.images) == 4
    assert bundle.nc == (1 if single_cls else 3)
    crowd = np.concatenate(bundle.val_index.crowd)
    assert len(crowd) and set(crowd[:, 0].tolist()) <= set(range(bundle.nc))
    if single_cls:
        assert set(crowd[:, 0].tolist()) == {0.0}


def test_a_broken_json_and_a_misplaced_images_key_are_data_errors_naming_them(tmp_path):
    root = tmp_path / "data"
    (root / "images").mkdir(parents=True)
    broken = root / "broken.json"
    broken.write_text('{"images": [')
    with pytest.raises(DataError, match=f"{broken}: cannot be read as JSON"):
        load_data_config(broken, cache_dir=tmp_path / "cache")
    (root / "data.yaml").write_text("train: images\nval: images\ntrain_images: images\nnames: [a]\n")
    with pytest.raises(
        DataError, match="key 'train_images' is only for a 'train' that is one COCO .json file"
    ):
        load_data_config(root / "data.yaml", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("*.npz"))
