"""Label discovery and verification: every bad-input case is reported once with its file and reason,
the bad pair is skipped and the good pairs still load."""

from pathlib import Path

import cv2
import numpy as np
import pytest
from datatree import tree_state, watch

from yolov5_smddp.data.imageinfo import ImageProblem, read_image_info
from yolov5_smddp.data.labels import build_label_index, label_path_for, list_images, parse_label
from yolov5_smddp.errors import DataError

GOOD_LABEL = "0 0.5 0.5 0.25 0.25\n1 0.25 0.25 0.1 0.1\n"


def _pair(root: Path, name: str, label: str | None, size=(24, 32), ext="jpg") -> Path:
    img_path = root / "images" / f"{name}.{ext}"
    img_path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(img_path), np.full((*size, 3), 80, np.uint8))
    if label is not None:
        lbl = root / "labels" / f"{name}.txt"
        lbl.parent.mkdir(parents=True, exist_ok=True)
        lbl.write_text(label)
    return img_path


def _index(root: Path, nc: int = 3):
    watch(root)  # the test fails if the scan writes anything under the dataset
    return build_label_index(
        [root / "images"], nc=nc, root=root, cache_dir=root.parent / f"{root.name}-cache", workers=2
    )


def test_label_path_replaces_last_images_folder():
    assert label_path_for(Path("/d/images/x/images/a.b.jpg")) == Path("/d/images/x/labels/a.b.txt")
    assert label_path_for(Path("/d/imgs/a.png")) == Path("/d/imgs/a.txt")


def test_list_file_entries_resolve_against_the_list_folder(tmp_path):
    a = _pair(tmp_path, "a", GOOD_LABEL)
    listing = tmp_path / "sub" / "train.txt"
    listing.parent.mkdir()
    listing.write_text("../images/a.jpg\n\n")
    assert list_images([listing]) == [a]


@pytest.mark.parametrize("ext", ["jpg", "png"])
def test_header_size_matches_decode(tmp_path, ext):
    path = _pair(tmp_path, "a", None, size=(37, 53), ext=ext)
    (h, w), nbytes = read_image_info(path)
    assert (h, w) == (37, 53) and nbytes == path.stat().st_size


def test_exif_orientation_swaps_size(tmp_path):
    path = _pair(tmp_path, "a", None, size=(20, 40))
    data = path.read_bytes()
    # APP1 Exif, big-endian TIFF with one IFD entry: Orientation (0x0112) = 6 (rotate 90)
    tiff = (
        b"MM\x00\x2a\x00\x00\x00\x08"
        + b"\x00\x01"
        + b"\x01\x12\x00\x03\x00\x00\x00\x01\x00\x06\x00\x00"
        + b"\x00" * 4
    )
    app1 = b"Exif\x00\x00" + tiff
    segment = b"\xff\xe1" + (len(app1) + 2).to_bytes(2, "big") + app1
    rotated = tmp_path / "rot.jpg"
    rotated.write_bytes(data[:2] + segment + data[2:])
    assert read_image_info(rotated)[0] == (40, 20)
    assert cv2.imread(str(rotated)).shape[:2] == (40, 20)  # what OpenCV decodes agrees


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-40])


def _zero(path: Path) -> None:
    path.write_bytes(b"")


def _garbage(path: Path) -> None:
    path.write_bytes(b"this is not an image at all" * 10)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_truncate, "corrupt JPEG (truncated: no end-of-image marker)"),
        (_zero, "empty file (0 bytes)"),
        (_garbage, "unreadable image (OpenCV cannot decode it)"),
    ],
)
def test_bad_images_are_reported_and_skipped(tmp_path, damage, reason):
    good = [_pair(tmp_path, f"good{i}", GOOD_LABEL) for i in range(2)]
    bad = _pair(tmp_path, "bad", GOOD_LABEL)
    damage(bad)
    index = _index(tmp_path)
    assert index.images == good
    assert index.report.bad == 1
    assert index.report.messages == [f"{bad}: {reason}"]
    assert all(len(lb) == 2 for lb in index.labels)


def test_too_small_image(tmp_path):
    good = _pair(tmp_path, "good", GOOD_LABEL)
    small = _pair(tmp_path, "small", GOOD_LABEL, size=(8, 30), ext="png")
    index = _index(tmp_path)
    assert index.images == [good]
    assert index.report.messages == [f"{small}: too small (30x8 px, sides must be >= 10)"]


@pytest.mark.parametrize(
    ("label", "reason"),
    [
        ("0 0.5 0.5 0.2\n", "line 1: 4 values, expected 5"),
        ("0 0.5 0.5 0.2 0.2\n1 0.5 abc 0.2 0.2\n", "line 2: non-numeric value 'abc'"),
        ("0 0.5 -0.1 0.2 0.2\n", "line 1: negative coordinate -0.1"),
        ("0 0.5 1.5 0.2 0.2\n", "line 1: coordinate 1.5 out of range [0, 1]"),
        ("5 0.5 0.5 0.2 0.2\n", "line 1: class id 5 >= nc 3"),
        ("1.5 0.5 0.5 0.2 0.2\n", "line 1: class id 1.5 is not a non-negative integer"),
        ("0 0.5 0.5 0.2 0.2 0.3\n", "line 1: 6 values"),
    ],
)
def test_bad_labels_are_reported_and_skipped(tmp_path, label, reason):
    good = _pair(tmp_path, "good", GOOD_LABEL)
    _pair(tmp_path, "bad", label)
    index = _index(tmp_path)
    assert index.images == [good]
    assert index.report.bad == 1
    [message] = index.report.messages
    assert message.startswith(f"{tmp_path / 'labels' / 'bad.txt'}: {reason}")


def test_duplicates_dropped_and_reported_pair_kept(tmp_path):
    dup = _pair(tmp_path, "dup", "0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.1 0.1\n")
    index = _index(tmp_path)
    assert index.images == [dup]
    np.testing.assert_allclose(index.labels[0], [[0, 0.5, 0.5, 0.2, 0.2], [1, 0.3, 0.3, 0.1, 0.1]])
    assert index.report.messages == [f"{tmp_path / 'labels' / 'dup.txt'}: 1 duplicate rows dropped"]
    assert index.report.duplicate_files == 1


def test_polygon_becomes_enclosing_box():
    labels, _flags, _reason = parse_label(b"2 0.1 0.2 0.5 0.2 0.3 0.6\n", nc=3)
    np.testing.assert_allclose(labels, [[2, 0.3, 0.4, 0.4, 0.4]], atol=1e-6)


def test_missing_and_empty_labels_are_background(tmp_path):
    good = _pair(tmp_path, "a_good", GOOD_LABEL)
    missing = _pair(tmp_path, "b_missing", None)
    empty = _pair(tmp_path, "c_empty", "\n")
    index = _index(tmp_path)
    assert index.images == [good, missing, empty]
    assert [len(lb) for lb in index.labels] == [2, 0, 0]
    assert (index.report.missing_labels, index.report.empty_labels, index.report.bad) == (1, 1, 0)
    assert index.report.messages == []
    assert index.shapes.tolist() == [[24, 32]] * 3


def test_no_usable_labels_is_fatal_and_says_where(tmp_path):
    _pair(tmp_path, "a", None)
    _pair(tmp_path, "b", "5 0.5 0.5 0.1 0.1\n")
    with pytest.raises(
        DataError, match=r"no usable labels in .*images.*/labels/.*1 without a label file.*1 unusable"
    ):
        _index(tmp_path)


def test_no_images_is_fatal(tmp_path):
    (tmp_path / "images").mkdir()
    with pytest.raises(DataError, match="no images found in .*images"):
        _index(tmp_path)


def test_dataset_is_never_written(tmp_path):
    _pair(tmp_path, "a", GOOD_LABEL)
    bad = _pair(tmp_path, "b", GOOD_LABEL)
    _truncate(bad)
    before = tree_state(tmp_path)
    index = _index(tmp_path)
    assert tree_state(tmp_path) == before and not index.cache_path.is_relative_to(tmp_path)


def test_image_problem_is_raised_for_missing_file(tmp_path):
    with pytest.raises(ImageProblem, match="cannot be read"):
        read_image_info(tmp_path / "nope.jpg")


def test_scan_workers_one_cap_for_the_pre_launch_check_and_the_ranks():
    from yolov5_smddp.data.labels import scan_workers

    assert [scan_workers(n) for n in (0, 1, 2, 16, 17, 96)] == [1, 1, 2, 16, 16, 16]
