"""`predict` outputs: YOLO labels (--save-txt/--save-conf), crops, videos (annotated video + JSON Lines
per frame, --vid-stride), --classes / --agnostic-nms / --max-det, progress lines, and checked writes."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import cv2
import pytest
import torch
from detections import scene_image
from test_predict_sources import write_video

from yolov5_smddp.cli import main
from yolov5_smddp.detection import postprocess
from yolov5_smddp.inference.predict_output import Progress, crop_box, safe_folder_name, yolo_label_lines
from yolov5_smddp.models.weights import save_weights
from yolov5_smddp.models.yolo import build_model


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A random yolov5n (3 classes) with an objectness prior, so that it detects things at --conf 0.1."""
    torch.manual_seed(0)
    model = build_model("yolov5n", nc=3)
    with torch.no_grad():
        for conv in model.detect.m:
            conv.bias.view(model.detect.na, -1)[:, 4] += 4.0
    model.names = ["cat", "dog/wolf", "bird"]
    return save_weights(tmp_path_factory.mktemp("w") / "tiny.pt", model, meta={})


def _predict(weights, source, out, *extra) -> int:
    argv = ["predict", "--weights", str(weights), "--source", str(source), "--out", str(out)]
    return main([*argv, "--img", "96", "--conf-thres", "0.1", *extra])


def test_yolo_label_lines_are_normalised_xywh():
    det = torch.tensor([[10.0, 20.0, 50.0, 60.0, 0.875, 2.0], [0.0, 0.0, 200.0, 100.0, 0.5, 0.0]])
    assert yolo_label_lines(det, 200, 100, with_conf=False) == [
        "2 0.150000 0.400000 0.200000 0.400000",
        "0 0.500000 0.500000 1.000000 1.000000",
    ]
    assert yolo_label_lines(det[:1], 200, 100, with_conf=True) == [
        "2 0.150000 0.400000 0.200000 0.400000 0.87500"
    ]


def test_crop_box_and_folder_names():
    assert crop_box([1.2, 2.7, 10.1, 20.0], 8, 30) == (1, 2, 8, 20)
    assert crop_box([5.0, 5.0, 5.0, 9.0], 8, 30) is None
    assert safe_folder_name("dog/wolf") == "dog_wolf" and safe_folder_name("..") == "_"


def test_progress_is_time_based_not_per_item():
    now = [0.0]
    progress = Progress(10.0, lambda: now[0])
    ticks = []
    for step in range(1, 101):  # 100 items, 0.5 s apart: a line at 10 s, 20 s, ... never per item
        now[0] = step * 0.5
        ticks.append(progress.due())
    assert sum(ticks) == 5 and ticks.index(True) == 19
    assert progress.line(100, 3, 7) == "predict: 100 images/frames done, file 3 of 7 (2.0/s)"


def test_save_txt_conf_and_crops_in_yolo_format(tmp_path, weights):
    (tmp_path / "src").mkdir()
    scene_image(tmp_path / "src" / "scene.jpg")
    out = tmp_path / "out"
    assert (
        _predict(weights, tmp_path / "src" / "scene.jpg", out, "--save-txt", "--save-conf", "--save-crop")
        == 0
    )
    result = json.loads((out / "scene.json").read_text())
    w, h = result["width"], result["height"]
    lines = (out / "labels" / "scene.txt").read_text().splitlines()
    assert len(lines) == len(result["detections"]) > 0
    for line, d in zip(lines, result["detections"]):
        cls, xc, yc, bw, bh, conf = line.split()
        x1, y1, x2, y2 = d["box_xyxy"]
        assert int(cls) == d["class_id"] and float(conf) == pytest.approx(d["score"], abs=1e-5)
        assert float(xc) == pytest.approx((x1 + x2) / 2 / w, abs=1e-4)
        assert float(bh) == pytest.approx((y2 - y1) / h, abs=1e-4)
    crops = sorted(p.relative_to(out / "crops").as_posix() for p in (out / "crops").rglob("*.jpg"))
    assert len(crops) == len(result["detections"])
    first = result["detections"][0]
    crop = cv2.imread(str(out / "crops" / safe_folder_name(first["class_name"]) / "scene_0.jpg"))
    x1, y1, x2, y2 = crop_box(first["box_xyxy"], w, h)
    assert crop.shape == (y2 - y1, x2 - x1, 3)


def test_classes_agnostic_nms_and_max_det(tmp_path, weights, monkeypatch):
    """The options reach NMS (whose own behaviour tests/unit/test_postprocess.py checks), and --classes
    and --max-det shape the written detections."""
    (tmp_path / "src").mkdir()
    scene_image(tmp_path / "src" / "scene.jpg")
    source = tmp_path / "src" / "scene.jpg"

    def detections(name, *extra):
        assert _predict(weights, source, tmp_path / name, "--nosave", *extra) == 0
        assert not (tmp_path / name / "scene.jpg").exists()  # --nosave: JSON only
        return json.loads((tmp_path / name / "scene.json").read_text())["detections"]

    everything = detections("all")
    assert {d["class_id"] for d in everything} == {0, 1}
    only = detections("only", "--classes", "1", "2")
    assert only == [d for d in everything if d["class_id"] in (1, 2)] != []
    assert detections("two", "--max-det", "2") == everything[:2]
    calls = []
    real = postprocess.non_max_suppression

    def recording(pred, conf, iou, **kwargs):
        calls.append(kwargs)
        return real(pred, conf, iou, **kwargs)

    monkeypatch.setattr(postprocess, "non_max_suppression", recording)
    detections("agnostic", "--agnostic-nms", "--classes", "1", "--max-det", "7")
    assert calls == [{"classes": [1], "agnostic": True, "max_det": 7}]
    calls.clear()
    detections("defaults")
    assert calls == [{"classes": None, "agnostic": False, "max_det": 1000}]  # the release's default


def test_video_gives_an_annotated_video_and_a_json_line_per_frame(tmp_path, weights, caplog):
    (tmp_path / "src").mkdir()
    clip = write_video(tmp_path / "src" / "clip", 9, size_wh=(128, 96))
    scene_image(tmp_path / "src" / "still.jpg")
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO):
        assert _predict(weights, tmp_path / "src", out, "--vid-stride", "4", "--save-txt") == 0
    lines = [json.loads(line) for line in (out / "clip.jsonl").read_text().splitlines()]
    assert [(r["frame"], r["width"], r["height"], r["video"]) for r in lines] == [
        (i, 128, 96, str(clip)) for i in (0, 4, 8)
    ]
    annotated = next(p for p in out.iterdir() if p.stem == "clip" and p.suffix in (".mp4", ".avi"))
    capture = cv2.VideoCapture(str(annotated))
    read_back = []
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        read_back.append(frame.shape)
    capture.release()
    assert read_back == [(96, 128, 3)] * 3
    assert sorted(p.name for p in (out / "labels").iterdir()) == [
        "clip_0.txt",
        "clip_4.txt",
        "clip_8.txt",
        "still.txt",
    ]
    assert (out / "still.json").is_file()
    assert any(
        "wrote results of 4 image(s)/frame(s) from 2 file(s)" in r.getMessage() for r in caplog.records
    )
    assert not any(r.getMessage().startswith("skipped") for r in caplog.records)


def test_bad_files_are_skipped_by_name_and_sources_refused_in_one_line(tmp_path, weights, caplog, capsys):
    (tmp_path / "src").mkdir()
    scene_image(tmp_path / "src" / "ok.jpg")
    (tmp_path / "src" / "broken.mp4").write_bytes(b"not a video at all")
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING):
        assert _predict(weights, tmp_path / "src", out) == 0
    messages = [r.getMessage() for r in caplog.records]
    assert f"skipped: {tmp_path / 'src' / 'broken.mp4'}: OpenCV cannot open it as a video" in messages
    assert (out / "ok.json").is_file() and not (out / "broken.jsonl").exists()
    assert _predict(weights, "/dev/zero", out) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "error: --source /dev/zero: is a character device, not a regular file; give an image, a video, "
        "a folder, a glob or a .txt list"
    )
    assert _predict(weights, str(tmp_path / "src" / "*.png"), out) == 2
    assert "*.png: no file matches this pattern" in capsys.readouterr().err


def test_a_write_that_fails_stops_with_one_line(tmp_path, weights, capsys, monkeypatch):
    (tmp_path / "src").mkdir()
    scene_image(tmp_path / "src" / "scene.jpg")
    out = tmp_path / "out"
    (out / "scene.jpg").mkdir(parents=True)  # where the annotated image should go: a folder
    assert _predict(weights, tmp_path / "src", out) == 2
    assert (
        capsys.readouterr().err.strip() == f"error: --out: cannot write {out / 'scene.jpg'} (Is a directory)"
    )

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full)
    assert _predict(weights, tmp_path / "src", tmp_path / "out2") == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --out: cannot write {tmp_path / 'out2' / 'scene.json'} (No space left on device)"
    monkeypatch.undo()
    blocker = tmp_path / "file"
    blocker.write_text("a file where --out's parent should be")
    assert _predict(weights, tmp_path / "src", blocker / "out") == 2
    assert (
        capsys.readouterr().err.strip()
        == f"error: --out: cannot make the folder {blocker / 'out'} (Not a directory)"
    )
