"""Decode only the part of a JPEG a mosaic tile shows (libjpeg-turbo's scanline cropping and skipping).

A mosaic tile usually shows a fraction of its image (the centre and the affine are drawn before
decoding: `augment.draw_mosaic_geometry`, `augment.tile_source_rect`). libjpeg-turbo (>= 1.5) can
leave out the rows above a rectangle (`jpeg_skip_scanlines`: entropy-decoded, but no IDCT, upsampling
or colour conversion), stop after its last row (nothing more is read), and convert only the iMCU
columns around it (`jpeg_crop_scanline`). With OpenCV's decoder settings (JDCT_ISLOW, fancy upsampling,
BGR out) the pixels inside the rectangle are the full decode's pixels, once the rectangle is widened by
`CONTEXT_MARGIN` (the chroma upsampling at a crop or skip edge sees its neighbours through it):
tests/unit/test_data_jpeg_roi.py proves it on 4:2:0 / 4:2:2 / 4:4:4, odd sizes, progressive files and
edges, against `cv2.imdecode`.

Reduced-DCT-scale decoding (libjpeg's scale_num / scale_denom) is NOT used here: its pixels differ from
a full decode followed by a resize, and this path must give exactly the full decode's pixels.

The decoder is in the loader's small C library (`native.c`, built by the Dockerfile; `native.py` loads
it). It is used only when it loads AND passes a self-check at first use (an embedded 4:2:0 JPEG decoded in regions, compared with OpenCV's full
decode, so a libjpeg differing from OpenCV's own is caught); otherwise one line is logged and the
caller decodes whole images with OpenCV, as before. Files it does not handle — not 8-bit 3-component
YCbCr (greyscale, CMYK, 12-bit), an Exif orientation other than 1 (OpenCV rotates those), a size other
than the index's — and any libjpeg error or warning are answered "fall back" (`decode_region` returns
None), never with pixels.

Restart-marker copies (issue 25): `jpeg_skip_scanlines` still entropy-decodes every row it skips, and
the top tiles of a mosaic show the bottom of their images. `transcode_with_restarts` makes a lossless
copy of a file this path accepts (the same DCT coefficients and quantisation tables, so the same pixels,
tests/unit/test_data_jpeg_restart.py) with a restart marker after every MCU;
`decode_region_restarts` then decodes a rectangle of such a copy from just the restart segments of
its MCUs (a JPEG of those segments is built in a reused scratch buffer), with a margin of one pixel
(`RESTART_CONTEXT_MARGIN`). Where the copies live is `data.restart_cache`'s business.
"""

from __future__ import annotations

import ctypes
import logging

import numpy as np

from yolov5_smddp.data import native

log = logging.getLogger(__name__)

CONTEXT_MARGIN = 16
"""Pixels added on each side of a wanted rectangle before decoding: one iMCU of the largest common
sampling (16 px for 4:2:0), so the upsampling context at the region's edges is the full decode's."""
RESTART_CONTEXT_MARGIN = 1
"""The same for `decode_region_restarts`, which decodes a JPEG of the whole MCUs holding the rectangle
(no column cropping, no rows skipped across MCUs): libjpeg's fancy upsampling reads one chroma sample
either side of a pixel and replicates at the image's edges, so in such a JPEG only its first and last
rows and columns can differ from the full decode, and MCUs holding the rectangle widened by one pixel
keep those outside it (tested at and beside MCU boundaries in tests/unit/test_data_jpeg_restart.py)."""
_OK = 0

# per process: "lib": the checked library, or None when the path is off; "rst": the library when its
# restart-marker path also passed its own check, else None
_state: dict[str, object] = {}
_scratch: dict[str, np.ndarray] = {}  # "buf": the reused scratch buffer for yv5_rst_decode


def _call(lib: ctypes.CDLL, data: bytes, out: np.ndarray, rect: tuple[int, int, int, int]) -> int:
    h, w = out.shape[:2]
    if out.dtype != np.uint8 or out.ndim != 3 or out.shape[2] != 3 or out.strides[1:] != (3, 1):
        raise ValueError(
            f"out must be a uint8 [h, w, 3] array with packed pixels, got {out.dtype} {out.strides}"
        )
    box = (ctypes.c_int * 4)(*rect)
    return lib.yv5_roi_decode(data, len(data), w, h, box, out.ctypes.data, out.strides[0])


def widen(
    rect: tuple[int, int, int, int], w: int, h: int, m: int = CONTEXT_MARGIN
) -> tuple[int, int, int, int]:
    """`rect` with `m` pixels more on each side, clipped to a w x h image."""
    x0, y0, x1, y1 = rect
    return max(x0 - m, 0), max(y0 - m, 0), min(x1 + m, w), min(y1 + m, h)


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]  # cheaper than a.ctypes.data, which builds an object


def _call_restarts(
    lib: ctypes.CDLL, data: bytes | np.ndarray, out: np.ndarray, rect: tuple[int, int, int, int]
) -> int:
    h, w = out.shape[:2]
    if out.dtype != np.uint8 or out.ndim != 3 or out.shape[2] != 3 or out.strides[1:] != (3, 1):
        raise ValueError(
            f"out must be a uint8 [h, w, 3] array with packed pixels, got {out.dtype} {out.strides}"
        )
    if not isinstance(data, np.ndarray):
        data = np.frombuffer(data, np.uint8)
    if data.dtype != np.uint8 or data.ndim != 1 or not data.flags.c_contiguous:
        raise ValueError(f"data must be bytes or a contiguous uint8 [n] array, got {data.dtype} {data.shape}")
    scratch = _scratch.get("buf")
    if scratch is None or scratch.size < data.size + 2:
        scratch = _scratch["buf"] = np.empty(max(2 * (data.size + 2), 1 << 16), np.uint8)  # grows rarely
    box = (ctypes.c_int * 4)(*rect)
    return lib.yv5_rst_decode(
        _address(data), data.size, w, h, box, _address(out), out.strides[0], _address(scratch), scratch.size
    )


def _transcode(lib: ctypes.CDLL, data: bytes, w: int, h: int) -> bytes | None:
    result, size = ctypes.c_void_p(), ctypes.c_ulong()
    code = lib.yv5_rst_transcode(data, len(data), w, h, ctypes.byref(result), ctypes.byref(size))
    if code != _OK or not result.value:
        return None
    try:
        return ctypes.string_at(result.value, size.value)
    finally:
        lib.yv5_free(result)


def _check_images() -> list[tuple[bytes, np.ndarray]]:
    """The self-checks' embedded images: (a 203x151 JPEG at 4:2:0 and at 4:2:2, OpenCV's full decode)."""
    import cv2

    rng = np.random.default_rng(0)
    base = cv2.resize(
        rng.integers(0, 256, (13, 17, 3), dtype=np.uint8), (203, 151), interpolation=cv2.INTER_CUBIC
    )
    base = cv2.add(base, rng.integers(0, 24, base.shape, dtype=np.uint8))
    images = []
    for sampling in (cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422):
        params = [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, sampling]
        ok, enc = cv2.imencode(".jpg", base, params)
        if not ok:
            raise RuntimeError("OpenCV cannot encode the test image")
        images.append((enc.tobytes(), cv2.imdecode(enc, cv2.IMREAD_COLOR)))
    return images


def _self_check(lib) -> str | None:
    """None when regions decoded by `lib` equal OpenCV's full decode on embedded test images, else why not."""
    for data, full in _check_images():
        for rect in ((37, 45, 101, 99), (0, 0, 60, 30), (150, 120, 203, 151), (5, 70, 203, 90)):
            out = np.zeros_like(full)
            code = _call(lib, data, out, widen(rect, 203, 151))
            x0, y0, x1, y1 = rect
            if code != _OK:
                return f"status {code} on a plain JPEG"
            if not np.array_equal(out[y0:y1, x0:x1], full[y0:y1, x0:x1]):
                return f"region {rect} differs from OpenCV's decode"
    return None


def _self_check_restarts(lib) -> str | None:
    """None when regions of restart-marker copies of the embedded test images decoded by `lib` equal
    OpenCV's full decode of the originals, else why not."""
    for data, full in _check_images():
        h, w = full.shape[:2]
        copy = _transcode(lib, data, w, h)
        if copy is None:
            return "the copy with restart markers could not be written"
        for rect in ((37, 45, 101, 99), (0, 0, 60, 30), (150, 120, 203, 151), (5, 70, 203, 90), (0, 0, w, h)):
            out = np.zeros_like(full)
            code = _call_restarts(lib, copy, out, widen(rect, w, h, RESTART_CONTEXT_MARGIN))
            x0, y0, x1, y1 = rect
            if code != _OK:
                return f"status {code} on a copy with restart markers"
            if not np.array_equal(out[y0:y1, x0:x1], full[y0:y1, x0:x1]):
                return f"region {rect} of the copy with restart markers differs from OpenCV's decode"
    return None


def region_decoder() -> ctypes.CDLL | None:
    """The checked library, self-checked on first use in this process; None (said once) when it is
    missing or its pixels are not OpenCV's."""
    return native.checked(
        _state, "lib", _self_check, "JPEG region decoding off (%s): tiles are decoded whole with OpenCV", log
    )


def decode_region(data: bytes, out: np.ndarray, rect: tuple[int, int, int, int]) -> bool:
    """Decode the pixels of `rect` (x0, y0, x1, y1 in the image) of JPEG `data` into `out`, a uint8
    [h, w, 3] buffer of the image's size, at their own coordinates: afterwards out[y0:y1, x0:x1] holds
    exactly what `cv2.imdecode(data, IMREAD_COLOR)` gives there (other pixels: anything). False when
    the caller must decode the whole image instead (no checked library, a file this path does not
    handle, a decoder error or warning)."""
    lib = region_decoder()
    if lib is None:
        return False
    h, w = out.shape[:2]
    return _call(lib, data, out, widen(rect, w, h)) == _OK


def restart_decoder() -> ctypes.CDLL | None:
    """The checked library when its restart-marker path (transcode, then region decodes of the copy)
    also passed a check against OpenCV in this process; None (said once) otherwise."""
    return native.checked(
        _state,
        "rst",
        _self_check_restarts,
        "JPEG restart-marker copies off (%s): regions are decoded from the original files",
        log,
        base=region_decoder,
    )


def transcode_with_restarts(data: bytes, w: int, h: int) -> bytes | None:
    """A lossless copy of JPEG `data` (w x h) with a restart marker after every MCU: the same DCT
    coefficients and quantisation tables, so a decoder gives the same pixels; None when the restart
    path is off or the file is not one `decode_region` takes (or a progressive file with coefficient
    bits never sent)."""
    lib = restart_decoder()
    return None if lib is None else _transcode(lib, data, w, h)


def decode_region_restarts(
    data: bytes | np.ndarray, out: np.ndarray, rect: tuple[int, int, int, int]
) -> bool:
    """`decode_region` for a copy made by `transcode_with_restarts` (bytes, or a contiguous uint8 [n]
    array), entropy-decoding only the MCUs that hold `rect` plus its margin. False when the caller
    must decode otherwise (the restart path off, a file of another layout, a decoder error or
    warning)."""
    lib = restart_decoder()
    if lib is None:
        return False
    h, w = out.shape[:2]
    return _call_restarts(lib, data, out, widen(rect, w, h, RESTART_CONTEXT_MARGIN)) == _OK
