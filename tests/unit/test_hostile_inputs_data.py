"""Hostile and unlucky dataset files (issue 42): FIFOs, devices, huge label files, link loops, names that
are not UTF-8, zero-area boxes and COCO numbers beyond 64 bits. Each ends in a counted skip or one error
line naming the file; nothing hangs. The corpus is generated here (no files committed).

The scans that could hang if broken run in a subprocess with a timeout, so a regression fails instead of
blocking the suite."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from child_python import run_python

from yolov5_smddp.data.coco import load_coco, parse_coco
from yolov5_smddp.data.config import load_data_config
from yolov5_smddp.data.labels import MAX_LABEL_BYTES, build_label_index, parse_label
from yolov5_smddp.errors import DataError

LABEL = "0 0.5 0.5 0.25 0.25\n"


def _dataset(root: Path, n: int = 12) -> Path:
    """root/images/im00.jpg .. with one-box labels under root/labels/."""
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    for i in range(n):
        cv2.imwrite(str(root / "images" / f"im{i:02d}.jpg"), np.full((32, 32, 3), 90, np.uint8))
        (root / "labels" / f"im{i:02d}.txt").write_text(LABEL)
    return root


def _index(root: Path, source: Path | None = None):
    return build_label_index(
        [source or root / "images"], nc=2, root=root, cache_dir=root.parent / "cache", workers=2
    )


def _scan_in_subprocess(root: Path, timeout: float = 60) -> dict:
    """build_label_index in a child process: (found, usable, bad, messages) as JSON; a hang times out."""
    code = (
        "import json, sys; from pathlib import Path\n"
        "from yolov5_smddp.data.labels import build_label_index\n"
        "root = Path(sys.argv[1])\n"
        "r = build_label_index([root / 'images'], nc=2, root=root, cache_dir=root.parent / 'cache', workers=2).report\n"
        "print(json.dumps({'found': r.found, 'usable': r.usable, 'bad': r.bad, 'messages': r.messages}))\n"
    )
    done = run_python(code, root, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_fifo_image_and_fifo_label_are_skipped_by_name_without_opening(tmp_path):
    root = _dataset(tmp_path / "d", n=3)
    os.mkfifo(root / "images" / "pipe.jpg")  # an image that is a FIFO
    os.remove(root / "labels" / "im01.txt")
    os.mkfifo(root / "labels" / "im01.txt")  # a label that is a FIFO
    started = time.monotonic()
    report = _scan_in_subprocess(root)
    assert time.monotonic() - started < 60
    assert (report["found"], report["usable"], report["bad"]) == (4, 2, 2)
    assert sorted(report["messages"]) == [
        f"{root}/images/pipe.jpg: a FIFO (named pipe), not a regular file",
        f"{root}/labels/im01.txt: a FIFO (named pipe), not a regular file",
    ]


def test_label_linked_to_dev_zero_and_huge_label_are_named_and_skipped(tmp_path):
    root = _dataset(tmp_path / "d", n=3)
    os.remove(root / "labels" / "im00.txt")
    (root / "labels" / "im00.txt").symlink_to("/dev/zero")
    with open(root / "labels" / "im01.txt", "r+b") as f:  # 100 MB: sparse, made in no time
        f.truncate(100 * 1024 * 1024)
    started = time.monotonic()
    report = _index(root).report
    assert time.monotonic() - started < 10  # read no further than the limit: seconds, not minutes
    assert (report.found, report.usable, report.bad) == (3, 1, 2)
    assert sorted(report.messages) == [
        f"{root}/labels/im00.txt: a character device, not a regular file",
        f"{root}/labels/im01.txt: a 104,857,600-byte label file, over the limit of {MAX_LABEL_BYTES:,} bytes",
    ]


def test_a_looping_folder_link_does_not_multiply_the_images(tmp_path, caplog):
    root = _dataset(tmp_path / "d", n=12)
    (root / "images" / "again").symlink_to(root / "images")  # a link to its own parent: a cycle
    (root / "labels" / "again").symlink_to(root / "labels")
    with caplog.at_level(logging.WARNING):
        report = _index(root).report
    assert (report.found, report.usable) == (12, 12)  # os.walk(followlinks=True) found 492
    assert f"{root}/images: 1 folder(s) not entered during the image search, e.g. {root}/images/again " in (
        caplog.text
    )
    assert "(already visited: a link cycle or a second link to it)" in caplog.text


def test_a_branching_link_loop_ends_with_each_image_once(tmp_path):
    root = _dataset(tmp_path / "d", n=12)
    sub = root / "images" / "sub"
    sub.mkdir()
    for name in ("a", "b", "c"):  # three links back up at every level: 3**40 paths for a naive walk
        (sub / name).symlink_to(root / "images")
    report = _scan_in_subprocess(root, timeout=60)
    assert (report["found"], report["usable"]) == (12, 12)


def test_a_link_outside_the_dataset_is_still_followed(tmp_path):
    root = _dataset(tmp_path / "d", n=2)
    elsewhere = _dataset(tmp_path / "other", n=3)
    (root / "images" / "more").symlink_to(elsewhere / "images")
    assert _index(root).report.found == 5


def _data_yaml(folder: Path, text: str) -> Path:
    path = folder / "data.yaml"
    path.write_text(text)
    return path


def test_link_loops_in_data_and_its_paths_are_one_error_each(tmp_path):
    root = _dataset(tmp_path / "d", n=1)
    self_link = tmp_path / "self.yaml"
    self_link.symlink_to(self_link)
    with pytest.raises(DataError, match=rf"^data.yaml: {self_link} is a symbolic link loop \("):
        load_data_config(self_link)
    (root / "loop").symlink_to(root / "loop")
    path = _data_yaml(root, "path: loop\ntrain: images\nval: images\nnames: [a, b]\n")
    with pytest.raises(DataError, match=rf"^{path}: key 'path': {root}/loop is a symbolic link loop \("):
        load_data_config(path)
    path = _data_yaml(root, "path: .\ntrain: [images, loop]\nval: images\nnames: [a, b]\n")
    with pytest.raises(DataError, match=rf"^{path}: key 'train': {root}/loop is a symbolic link loop \("):
        load_data_config(path)


def test_a_name_that_is_not_utf8_is_shown_escaped(tmp_path):
    root = _dataset(tmp_path / "d", n=2)
    bad = os.fsdecode(b"bad\xff.jpg")  # a name no UTF-8 stream can print as is
    (root / "images" / bad).write_bytes(b"not an image")
    report = _index(root).report
    assert (report.found, report.usable, report.bad) == (3, 2, 1)
    [message] = report.messages
    assert message.startswith(f"{root}/images/bad\\xff.jpg: ")
    message.encode("utf-8")  # printable on any stream: no surrogates left
    again = _index(root)  # the cache holds the name and maps it back to the same file
    assert (again.report.cache, len(again.images)) == ("loaded", 2)


def test_zero_area_boxes_are_dropped_and_counted():
    labels, flags, reason = parse_label(b"0 0.5 0.5 0 0.2\n1 0.5 0.5 0.2 0.0\n0 0.5 0.5 0.2 0.2\n", nc=2)
    assert labels.tolist() == [[0.0, 0.5, 0.5, pytest.approx(0.2), pytest.approx(0.2)]]
    assert reason == "2 boxes of zero width or height dropped"
    only, _, why = parse_label(b"0 0.5 0.5 0 0.2\n", nc=2)
    assert only.shape == (0, 5) and why == "1 boxes of zero width or height dropped"


def test_zero_area_boxes_in_the_scan_summary(tmp_path):
    root = _dataset(tmp_path / "d", n=3)
    (root / "labels" / "im00.txt").write_text("0 0.5 0.5 0 0.2\n" + LABEL)
    report = _index(root).report
    assert (report.usable, report.boxes, report.degenerate_files) == (3, 3, 1)
    assert report.messages == [f"{root}/labels/im00.txt: 1 boxes of zero width or height dropped"]


# ------------------------------------------------------------------------------------------------ COCO


def _coco(**changes) -> dict:
    doc = {
        "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}],
        "annotations": [{"id": 5, "image_id": 1, "category_id": 3, "bbox": [1, 2, 10, 10]}],
        "categories": [{"id": 3, "name": "disk"}],
    }
    for key, value in changes.items():
        doc[key] = value
    return doc


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"categories": [{"id": 2**70, "name": "disk"}]},
            "categories: entry {'id': 1180591620717411303424, ",
        ),
        ({"images": [{"id": 1e30, "file_name": "a.jpg"}]}, "field 'id' is 1e+30, beyond 64 bits"),
        (
            {"images": [{"id": 1, "file_name": "a.jpg", "width": 1e300, "height": 48}]},
            "field 'width' is 1e+300, beyond 64 bits (|value| < 2**63)",
        ),
        (
            {"annotations": [{"id": 5, "image_id": 2**70, "category_id": 3, "bbox": [1, 2, 3, 4]}]},
            "x.json: annotation id 5: field 'image_id' is 1180591620717411303424, beyond 64 bits",
        ),
    ],
)
def test_coco_numbers_beyond_64_bits_name_the_field(changes, message):
    with pytest.raises(DataError) as caught:
        parse_coco(_coco(**changes), "x.json")
    assert message in str(caught.value)


@pytest.mark.parametrize("name", [{"en": "disk"}, ["box"], True, None, ""])
def test_coco_category_names_must_be_strings(name):
    with pytest.raises(DataError) as caught:
        parse_coco(_coco(categories=[{"id": 3, "name": name}]), "x.json")
    assert str(caught.value) == (
        f"x.json: categories: id 3 has the name {name!r}, not a non-empty string; "
        'write it as a JSON string, e.g. "name": "box"'
    )


def test_coco_json_nested_100000_deep_is_one_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataError, match=r"deep.json: nested deeper than the JSON reader allows"):
        load_coco(path, tmp_path / "cache")


def test_coco_json_that_is_a_fifo_is_never_opened(tmp_path):
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    code = (
        "import sys; from pathlib import Path\n"
        "from yolov5_smddp.data.coco import load_coco\n"
        "try:\n    load_coco(Path(sys.argv[1]), Path(sys.argv[2]))\n"
        "except Exception as exc:\n    print(f'{type(exc).__name__}: {exc}')\n"
    )
    # opening the FIFO would block: the child is killed after 60 s and the test fails
    done = run_python(code, path, tmp_path / "cache", timeout=60)
    assert done.stdout.strip() == f"DataError: COCO JSON {path}: a FIFO (named pipe), not a regular file"


def test_the_validation_mosaic_reads_a_non_utf8_name_without_crashing(tmp_path):
    """cv2.imread on such a path kills the process (SIGSEGV): the plot reads through decode_image."""
    path = tmp_path / os.fsdecode(b"bad\xff.jpg")
    cv2.imwrite(str(tmp_path / "ok.jpg"), np.full((20, 30, 3), 90, np.uint8))
    (tmp_path / "ok.jpg").rename(path)
    code = (
        "import sys, os\nfrom yolov5_smddp.plots import _image_or_none\n"
        "print(_image_or_none(os.fsdecode(sys.argv[1].encode('utf-8', 'surrogateescape'))).shape)\n"
    )
    done = run_python(code, path)
    assert (done.returncode, done.stdout.strip()) == (0, "(20, 30, 3)")
