"""`predict` and `val` on the corpus of awkward files: each bad file is one "skipped: <path>: <why>" line,
the others are processed, the counts are reported, and the source/dataset tree is never written."""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch
from datatree import watch, write_bad_images

from yolov5_smddp.cli import main
from yolov5_smddp.data.synthetic import make_default_dataset
from yolov5_smddp.models.weights import save_weights
from yolov5_smddp.models.yolo import build_model

LIMIT = "1000000"
OVER = "over the limit of 1,000,000 (--max-image-pixels); not decoded"


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    torch.manual_seed(0)
    model = build_model("yolov5n", nc=3)
    model.names = ["rectangle", "ellipse", "triangle"]
    return save_weights(tmp_path_factory.mktemp("w") / "tiny.pt", model, meta={})


def _skipped(caplog) -> dict[str, str]:
    """file name -> reason, from the 'skipped: <path>: <why>' log lines."""
    out = {}
    for record in caplog.records:
        match = re.match(r"skipped: (\S+): (.*)", record.getMessage())
        if match:
            out[match.group(1).rsplit("/", 1)[-1]] = match.group(2)
    return out


def test_predict_skips_each_bad_file_and_processes_the_rest(tmp_path, weights, caplog):
    source = tmp_path / "images"
    write_bad_images(source, tmp_path / "labels")
    watch(source)
    out = tmp_path / "out"
    argv = ["predict", "--weights", str(weights), "--source", str(source), "--out", str(out), "--imgsz", "64"]
    with caplog.at_level(logging.WARNING):
        assert main([*argv, "--max-image-pixels", LIMIT, "--conf", "0.0005"]) == 0
    skipped = _skipped(caplog)
    assert sorted(skipped) == ["bomb.jpg", "bomb.png", "huge.jpg", "scrambled.jpg", "truncated.jpg"]
    assert skipped["bomb.png"] == f"its header claims 40000x40000 px (1,600,000,000 pixels), {OVER}"
    assert skipped["bomb.jpg"] == f"its header claims 60000x60000 px (3,600,000,000 pixels), {OVER}"
    assert skipped["huge.jpg"] == f"its header claims 1200x1000 px (1,200,000 pixels), {OVER}"
    assert skipped["truncated.jpg"] == "corrupt JPEG (truncated: no end-of-image marker)"
    assert skipped["scrambled.jpg"] == "unreadable image (OpenCV cannot decode it)"
    # a 1x1 image is fine for inference; CMYK and 16-bit images are converted by the decoder
    sizes = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert {k: (v["width"], v["height"]) for k, v in sizes.items()} == {
        "tiny": (1, 1),
        "cmyk": (64, 48),
        "deep": (64, 48),
    }
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # the default limit lets the valid 1.2-megapixel image through
        assert main(argv) == 0
    assert "huge.jpg" not in _skipped(caplog) and (out / "huge.json").is_file()


def test_val_names_and_counts_what_it_leaves_out(tmp_path, weights, caplog, capsys):
    root = tmp_path / "data"
    yaml_path = make_default_dataset(root, n_train=4, n_val=4, imgsz=96, seed=4)
    write_bad_images(root / "images" / "val", root / "labels" / "val")
    watch(root)
    out = tmp_path / "val"
    argv = ["val", "--weights", str(weights), "--data", str(yaml_path), "--imgsz", "64", "--batch-size", "4"]
    argv += ["--workers", "1", "--cache-dir", str(tmp_path / "cache"), "--max-image-pixels", LIMIT]
    with caplog.at_level(logging.WARNING):
        assert main([*argv, "--save-json", "--output-dir", str(out)]) == 0
    metrics = capsys.readouterr().out
    # 12 val images: 5 rejected by the scan, scrambled.jpg fails to decode, 6 scored
    assert re.search(r"\bimages=6 skipped=6 ", metrics), metrics
    skipped = _skipped(caplog)
    assert sorted(skipped) == ["bomb.jpg", "bomb.png", "huge.jpg", "tiny.png", "truncated.jpg"]
    messages = [r.getMessage() for r in caplog.records]
    assert (
        "val: 6 of 12 images skipped (named in the 'skipped:' lines above); the metrics cover 6" in messages
    )
    assert (
        "validation left out 1 of 7 images that could not be decoded (named in the 'skipped:' lines): "
        "the metrics cover 6 images"
    ) in messages
    gt = json.loads((out / "ground_truth.json").read_text())
    names = sorted(image["file_name"].rsplit("/", 1)[-1] for image in gt["images"])
    assert names == ["00000.jpg", "00001.jpg", "00002.jpg", "00003.jpg", "cmyk.jpg", "deep.tif"]
