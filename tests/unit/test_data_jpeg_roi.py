"""Region decoding (data/jpeg_roi.py over the C library data/native.c, built by the Dockerfile) gives exactly the pixels of
OpenCV's full decode inside the wanted rectangle, on every sampling and size it accepts, at the image's
edges; and the files it must not handle (greyscale, Exif-rotated, another size, corrupt) are declined, so
the caller decodes them whole."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
from jpegs import jpeg_variants, photo, pil_jpeg
from native_part import required
from PIL import Image

from yolov5_smddp.data import jpeg_roi, native
from yolov5_smddp.data.jpeg_roi import decode_region, region_decoder


@pytest.fixture(scope="module")
def lib():
    return required(region_decoder())


def _rects(w: int, h: int, rng: np.random.Generator) -> list[tuple[int, int, int, int]]:
    """Edges, corners, single pixels and single rows/columns, the whole image, and random rectangles."""
    rects = [
        (0, 0, w, h),
        (0, 0, 1, 1),
        (w - 1, h - 1, w, h),
        (0, h - 1, w, h),
        (w - 1, 0, w, h),
        (0, 0, w, 1),
        (0, 0, 1, h),
        (w // 2, 0, w, h // 2),
        (0, h // 2, w // 2, h),
        (w // 3, h // 3, w // 3 + 1, h // 3 + 1),
    ]
    for _ in range(12):
        x0, x1 = sorted(rng.integers(0, w + 1, 2))
        y0, y1 = sorted(rng.integers(0, h + 1, 2))
        if x1 > x0 and y1 > y0:
            rects.append((int(x0), int(y0), int(x1), int(y1)))
    return rects


def test_region_pixels_equal_the_full_decode(lib):
    rng = np.random.default_rng(0)
    checked = 0
    for name, data in jpeg_variants().items():
        full = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        h, w = full.shape[:2]
        for rect in _rects(w, h, rng):
            out = rng.integers(0, 256, full.shape, dtype=np.uint8)  # stale pixels: whatever was there
            assert decode_region(data, out, rect), (name, rect)
            x0, y0, x1, y1 = rect
            assert np.array_equal(out[y0:y1, x0:x1], full[y0:y1, x0:x1]), (name, rect)
            checked += 1
    assert checked > 500


def test_region_into_a_view_of_a_larger_buffer(lib):
    """The dataset decodes into a [:h, :w] view of one square buffer (row stride wider than the image)."""
    img = photo(203, 151, seed=3)
    data = pil_jpeg(img, quality=90)
    full = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    big = np.full((256, 256, 3), 7, np.uint8)
    view = big[:151, :203]
    assert decode_region(data, view, (40, 30, 120, 100))
    assert np.array_equal(view[30:100, 40:120], full[30:100, 40:120])
    assert (big[151:] == 7).all() and (big[:, 203:] == 7).all()  # nothing written outside the image


def test_only_the_widened_rectangle_is_written(lib):
    """Rows outside the rectangle plus its context margin are never touched (skipped or never read):
    the saving, and the proof that the buffer's other pixels are left to whatever was there."""
    img = photo(640, 480, seed=4)
    data = pil_jpeg(img, quality=90)
    out = np.zeros((480, 640, 3), np.uint8)
    assert decode_region(data, out, (300, 200, 360, 260))
    m = jpeg_roi.CONTEXT_MARGIN
    assert not out[: 200 - m].any() and not out[260 + m :].any()
    assert not out[:, : 300 - m - 16].any() and not out[:, 360 + m + 16 :].any()  # iMCU-rounded columns
    assert out[200:260, 300:360].any()


@pytest.mark.parametrize("case", ["grey", "exif6", "exif3", "other_size", "truncated", "png", "cmyk"])
def test_files_it_must_not_handle_are_declined(lib, case):
    img = photo(120, 90, seed=5)
    if case == "grey":
        buf = io.BytesIO()
        Image.fromarray(img[:, :, 0]).save(buf, format="JPEG")
        data = buf.getvalue()
    elif case.startswith("exif"):
        exif = Image.Exif()
        exif[0x0112] = int(case[-1])  # 6: turned 90 degrees (sizes swap), 3: 180 (sizes stay)
        data = pil_jpeg(img, exif=exif)
    elif case == "other_size":
        data = pil_jpeg(photo(121, 90, seed=5))
    elif case == "truncated":
        data = pil_jpeg(img)[:-600]
    elif case == "cmyk":
        buf = io.BytesIO()
        Image.fromarray(img).convert("CMYK").save(buf, format="JPEG")
        data = buf.getvalue()
    else:
        data = cv2.imencode(".png", img)[1].tobytes()
    out = np.zeros((90, 120, 3), np.uint8)
    assert not decode_region(data, out, (10, 10, 60, 50))


def test_a_missing_library_turns_the_path_off(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(jpeg_roi, "_state", {})
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setenv(native.LIBRARY_ENV, str(tmp_path / "absent.so"))
    with caplog.at_level("INFO", logger="yolov5_smddp.data.jpeg_roi"):
        assert region_decoder() is None
        assert region_decoder() is None
    [said] = [r.message for r in caplog.records if "region decoding off" in r.message]  # once
    assert "cannot load the library" in said and "absent.so" in said and "decoded whole" in said
    assert not decode_region(b"\xff\xd8", np.zeros((4, 4, 3), np.uint8), (0, 0, 2, 2))


def test_a_library_whose_pixels_differ_fails_the_self_check(lib, monkeypatch, caplog):
    """A libjpeg giving other pixels than OpenCV's (stood in for by a shifted copy) is not used."""

    class Shifted:
        def __init__(self, real):
            self.real = real

        def yv5_roi_decode(self, data, size, w, h, box, ptr, stride):
            code = self.real.yv5_roi_decode(data, size, w, h, box, ptr, stride)
            arr = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * (stride * h)).from_address(ptr))
            arr[: stride * h : 7] ^= 1  # one bit off here and there
            return code

    assert jpeg_roi._self_check(lib) is None
    assert "differs" in jpeg_roi._self_check(Shifted(lib))


def test_a_self_check_that_raises_turns_the_path_off(lib, monkeypatch, caplog):
    """E.g. an OpenCV without a flag the check uses: the path is off, the job goes on with OpenCV."""

    def broken(_lib):
        raise AttributeError("module 'cv2' has no attribute 'IMWRITE_JPEG_SAMPLING_FACTOR'")

    monkeypatch.setattr(jpeg_roi, "_state", {})
    monkeypatch.setattr(jpeg_roi, "_self_check", broken)
    with caplog.at_level("INFO", logger="yolov5_smddp.data.jpeg_roi"):
        assert region_decoder() is None
    assert "self-check failed: AttributeError" in caplog.text
