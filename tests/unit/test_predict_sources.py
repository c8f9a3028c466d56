"""`predict --source`: files, recursive folders, globs, .txt lists, videos read with a stride; only regular
files opened (a FIFO or device is refused, or skipped by name inside a folder or list)."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pytest

from yolov5_smddp.errors import ConfigError, DataError
from yolov5_smddp.inference.predict_sources import frames, not_regular, output_stems, resolve_source


def write_video(path: Path, n_frames: int, size_wh=(96, 64), fps: float = 10.0) -> Path:
    """A real video file written by OpenCV (mp4v .mp4, else MJPG .avi): frame i is filled with grey
    level 10 * i, so a frame read back says its number. Returns the path written."""
    for codec, suffix in (("mp4v", ".mp4"), ("MJPG", ".avi")):
        target = path.with_suffix(suffix)
        writer = cv2.VideoWriter(str(target), cv2.VideoWriter_fourcc(*codec), fps, size_wh)
        if writer.isOpened():
            for i in range(n_frames):
                writer.write(np.full((size_wh[1], size_wh[0], 3), 10 * i, np.uint8))
            writer.release()
            return target
    pytest.skip("this OpenCV can write neither mp4v nor MJPG video")


def _image(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.zeros((8, 8, 3), np.uint8))
    return path


def test_folder_is_searched_recursively_with_videos_and_unique_stems(tmp_path):
    _image(tmp_path / "a.jpg")
    _image(tmp_path / "sub" / "a.jpg")
    _image(tmp_path / "sub" / "deeper" / "b.png")
    (tmp_path / "sub" / "notes.txt").write_text("not media")
    clip = write_video(tmp_path / "sub" / "clip", 3)
    resolved = resolve_source(str(tmp_path))
    assert [(f.path.relative_to(tmp_path).as_posix(), f.kind, f.stem) for f in resolved.files] == [
        ("a.jpg", "image", "a_jpg"),
        ("sub/a.jpg", "image", "a_jpg_2"),
        (f"sub/{clip.name}", "video", "clip"),
        ("sub/deeper/b.png", "image", "b"),
    ]
    assert resolved.skipped == []


def test_output_stems_never_collide():
    paths = [Path("x/a.jpg"), Path("x/a.png"), Path("y/a.jpg"), Path("y/b.jpg")]
    assert output_stems(paths) == ["a_jpg", "a_png", "a_jpg_2", "b"]


def test_glob_and_list_sources(tmp_path):
    for name in ("one.jpg", "two.jpg", "three.png"):
        _image(tmp_path / "imgs" / name)
    resolved = resolve_source(str(tmp_path / "imgs" / "*.jpg"))
    assert [f.path.name for f in resolved.files] == ["one.jpg", "two.jpg"]
    recursive = resolve_source(str(tmp_path / "**" / "t*.*"))
    assert [f.path.name for f in recursive.files] == ["three.png", "two.jpg"]
    with pytest.raises(DataError, match=r"no file matches this pattern"):
        resolve_source(str(tmp_path / "imgs" / "*.bmp"))
    listing = tmp_path / "list.txt"
    listing.write_text(f"# inputs\nimgs/two.jpg\n\n{tmp_path / 'imgs' / 'one.jpg'}\nimgs/missing.jpg\nimgs\n")
    resolved = resolve_source(str(listing))
    assert [f.path.name for f in resolved.files] == ["two.jpg", "one.jpg"]  # as listed
    assert resolved.skipped == [
        f"{tmp_path / 'imgs' / 'missing.jpg'}: does not exist",
        f"{tmp_path / 'imgs'}: not an image or video suffix",
    ]


def test_only_regular_files_are_opened(tmp_path):
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"pipe.jpg: is a FIFO \(named pipe\), not a regular file"):
        resolve_source(str(fifo))
    with pytest.raises(ConfigError, match=r"/dev/zero: is a character device, not a regular file"):
        resolve_source("/dev/zero")
    with pytest.raises(DataError, match=r"nope.jpg does not exist"):
        resolve_source(str(tmp_path / "nope.jpg"))
    # inside a folder or a list: skipped by name, the regular files used
    _image(tmp_path / "ok.jpg")
    (tmp_path / "zero.jpg").symlink_to("/dev/zero")
    resolved = resolve_source(str(tmp_path))
    assert [f.path.name for f in resolved.files] == ["ok.jpg"]
    assert sorted(resolved.skipped) == [
        f"{fifo}: is a FIFO (named pipe), not a regular file",
        f"{tmp_path / 'zero.jpg'}: is a character device, not a regular file",
    ]
    assert not_regular(tmp_path / "ok.jpg") is None


def test_video_frames_with_a_stride(tmp_path):
    clip = write_video(tmp_path / "clip", 7)
    (video,) = resolve_source(str(clip)).files
    got = [(f.frame, int(round(f.pixels.mean() / 10)), f.fps) for f in frames([video], 2**27, vid_stride=3)]
    assert got == [(0, 0, 10.0), (3, 3, 10.0), (6, 6, 10.0)]
    assert [f.frame for f in frames([video], 2**27)] == list(range(7))
    (over,) = frames([video], 96 * 64 - 1)
    assert over.pixels is None and over.problem == "96x64 frames exceed --max-image-pixels 6143"


def test_a_file_opencv_cannot_open_as_video_is_one_problem(tmp_path):
    fake = tmp_path / "fake.mp4"
    fake.write_bytes(b"\x00\x00\x00\x18ftypmp42 but nothing after")
    (video,) = resolve_source(str(fake)).files
    (frame,) = frames([video], 2**27)
    assert frame.pixels is None and frame.problem == "OpenCV cannot open it as a video"
    assert frame.name == str(fake)
