"""The HSV table fused with the flips in one native pass (native.c `yv5_lut3_flip`) gives exactly the
pixels of OpenCV's table then flip (augment.apply_color_hwc's fallback), for every flip and on strided
images; a library whose table pass differs is not used."""

from __future__ import annotations

import numpy as np
import pytest
from native_part import required

from yolov5_smddp.data import augment, native
from yolov5_smddp.data.augment import AugmentParams, apply_color_hwc, color_lut, draw_color_params


@pytest.fixture(scope="module")
def lib():
    return required(color_lut())


def test_native_colour_equals_opencv_table_and_flip(lib, monkeypatch):
    rng = np.random.default_rng(0)
    p = AugmentParams(flipud=0.5, fliplr=0.5)
    flips = set()
    for trial in range(40):
        h, w = int(rng.integers(1, 90)), int(rng.integers(1, 90))
        big = rng.integers(0, 256, (h + 3, w + 5, 3), dtype=np.uint8)
        img = big[1 : h + 1, 2 : w + 2]  # a strided view, as the mosaic's crops are
        color = draw_color_params(p, rng)
        flips.add((bool(color[4]), bool(color[5])))
        fast = apply_color_hwc(img, color)
        with monkeypatch.context() as patched:
            patched.setitem(augment._native_color, "lib", None)  # OpenCV's LUT and flip
            slow = apply_color_hwc(img, color)
        assert fast.flags.c_contiguous and np.array_equal(fast, slow), trial
    assert len(flips) == 4


def test_a_table_pass_with_other_pixels_is_not_used(lib, monkeypatch):
    class OffByOne:
        def yv5_lut3_flip(self, src, ss, dst, ds, h, w, table, lr, ud):
            code = lib.yv5_lut3_flip(src, ss, dst, ds, h, w, table, lr, ud)
            arr = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * (ds * h)).from_address(dst))
            arr[5] ^= 1
            return code

    assert augment._color_check(lib)
    assert not augment._color_check(OffByOne())
    monkeypatch.setattr(augment, "_native_color", {})
    monkeypatch.setattr(native, "library", lambda: OffByOne())
    assert color_lut() is None


def test_lut3_flip_refuses_overlap_and_bad_tables(lib):
    img = np.zeros((4, 4, 3), np.uint8)
    table = np.zeros((256, 1, 3), np.uint8)
    with pytest.raises(ValueError, match="overlap"):
        native.lut3_flip(lib, img, img, table, True, False)
    with pytest.raises(ValueError, match="table"):
        native.lut3_flip(lib, img, np.zeros_like(img), table[::2], True, False)


@pytest.mark.parametrize("shape", [(640, 640), (64, 96), (37, 48), (20, 643), (9, 57)])
def test_left_right_flip_before_hsv_to_rgb_only_where_it_gives_the_same_pixels(lib, monkeypatch, shape):
    """The left-right flip rides on the table pass where OpenCV's HSV -> RGB treats every pixel of a row
    alike (widths a multiple of its SIMD block, like 640), else it runs after it: either way the pixels
    of OpenCV's table, conversion, then flip. Widths with a scalar tail (643, 57) decline the fold."""
    rng = np.random.default_rng(shape[1])
    img = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
    p = AugmentParams(flipud=0.0, fliplr=1.0)
    for trial in range(6):
        color = draw_color_params(p, rng)
        assert color[3] and color[5] and not color[4]
        fast = apply_color_hwc(img, color)
        with monkeypatch.context() as patched:
            patched.setitem(augment._native_color, "lib", None)  # OpenCV's LUT, conversion, then flip
            slow = apply_color_hwc(img, color)
        assert np.array_equal(fast, slow), (shape, trial)
    commutes = augment.mirror_commutes_with_hsv2rgb(shape)
    if shape[1] in (640, 96):
        assert commutes  # the mosaic's widths (multiples of 32) take the fold
    if shape[1] in (643, 57):
        assert not commutes
