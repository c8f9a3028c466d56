"""Test support: JPEG files of every kind the region and restart-marker paths meet, made by real writers
(PIL and OpenCV) from photo-like images. `from jpegs import photo, pil_jpeg, jpeg_variants`."""

from __future__ import annotations

import io

import cv2
import numpy as np
from PIL import Image

SIZES = ((640, 480), (203, 151), (157, 117), (33, 17), (16, 16), (8, 40))
"""MCU-aligned and odd sizes, down to one MCU and a column of them."""


def photo(w: int, h: int, seed: int) -> np.ndarray:
    """A photo-like BGR image: smooth colour fields (chroma that upsampling interpolates) plus noise."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    img = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC)
    return cv2.add(img, rng.integers(0, 40, img.shape, dtype=np.uint8))


def pil_jpeg(img_bgr: np.ndarray, **kwargs) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img_bgr[:, :, ::-1]).save(buf, format="JPEG", **kwargs)
    return buf.getvalue()


def jpeg_variants(sizes=SIZES) -> dict[str, bytes]:
    """Per size: PIL 4:2:0 / 4:2:2 / 4:4:4, progressive 4:2:0 and 4:4:4, OpenCV's default; plus a file
    with OpenCV's restart markers (every 3 MCUs) and one with an Exif orientation of 1 (upright)."""
    out = {}
    for w, h in sizes:
        img = photo(w, h, seed=w + h)
        for sub, name in ((2, "420"), (1, "422"), (0, "444")):
            out[f"{name}_{w}x{h}"] = pil_jpeg(img, quality=90, subsampling=sub)
        out[f"progressive_420_{w}x{h}"] = pil_jpeg(img, quality=80, subsampling=2, progressive=True)
        out[f"progressive_444_{w}x{h}"] = pil_jpeg(img, quality=85, subsampling=0, progressive=True)
        out[f"opencv_{w}x{h}"] = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes()
    img = photo(203, 151, seed=9)
    out["restart3_203x151"] = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_RST_INTERVAL, 3])[1].tobytes()
    exif = Image.Exif()
    exif[0x0112] = 1  # upright: OpenCV does not turn it, so the region path may take it
    out["exif1_203x151"] = pil_jpeg(img, exif=exif)
    return out
