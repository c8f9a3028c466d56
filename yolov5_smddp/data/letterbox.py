"""Letterbox: resize keeping the aspect ratio, then pad to the target shape with a constant colour."""

from __future__ import annotations

import cv2
import numpy as np

PAD_VALUE = 114


def letterbox(
    img: np.ndarray,
    new_shape: int | tuple[int, int] = 640,
    *,
    auto: bool = False,
    scaleup: bool = True,
    stride: int = 32,
    color: int = PAD_VALUE,
) -> tuple[np.ndarray, tuple[float, float], tuple[float, float]]:
    """img (uint8 HWC) → (padded image, (ratio_w, ratio_h), (pad_w, pad_h) per side).

    `new_shape` is (h, w) or one int for a square. With `auto` the padding is reduced to the smallest
    multiple of `stride` (minimum rectangle); `scaleup=False` only ever shrinks (as for validation).
    """
    shape = img.shape[:2]
    if isinstance(new_shape, int):
        new_shape = (new_shape, new_shape)
    gain = min(new_shape[0] / shape[0], new_shape[1] / shape[1])
    if not scaleup:
        gain = min(gain, 1.0)
    unpadded_w, unpadded_h = round(shape[1] * gain), round(shape[0] * gain)
    pad_w, pad_h = new_shape[1] - unpadded_w, new_shape[0] - unpadded_h
    if auto:
        pad_w, pad_h = pad_w % stride, pad_h % stride
    pad_w, pad_h = pad_w / 2, pad_h / 2
    if (shape[1], shape[0]) != (unpadded_w, unpadded_h):
        img = cv2.resize(img, (unpadded_w, unpadded_h), interpolation=cv2.INTER_LINEAR)
    top, bottom = round(pad_h - 0.1), round(pad_h + 0.1)
    left, right = round(pad_w - 0.1), round(pad_w + 0.1)
    if top or bottom or left or right:
        img = cv2.copyMakeBorder(img, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(color,) * 3)
    return img, (unpadded_w / shape[1], unpadded_h / shape[0]), (pad_w, pad_h)
