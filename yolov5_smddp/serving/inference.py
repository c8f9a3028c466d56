"""SageMaker PyTorch serving handler for a YOLOv5 detector trained with yolov5-smddp.

Copied into the model folder as code/inference.py. It runs in the SageMaker PyTorch inference container,
which does not have the yolov5_smddp package: it needs only torch, torchvision, numpy and OpenCV, and loads
best.pt2 (a torch.export program, the default from torch 2.10 on) or else the TorchScript file
best.torchscript (for each, its config.txt gives the input size and class names).

Requests: an encoded JPEG, PNG, BMP, WebP or TIFF image (content types image/jpeg, image/png, image/bmp,
image/webp, image/tiff, application/x-image; the format is read from the bytes), or application/x-npy (a
uint8 [H, W, 3] RGB array saved with numpy.save). Response (application/json), the schema of
`yolov5-smddp predict`: {"width", "height", "detections": [{"box_xyxy", "class_id", "class_name", "score"}]}
with boxes in the original image's pixels. Thresholds: environment variables YOLOV5_CONF (0.25), YOLOV5_IOU
(0.45), YOLOV5_MAX_DET (300).

Limits, checked before anything is decoded (a PNG under 2 MB can claim 20000 x 20000 pixels, 1.2 GB
decoded): the pixels an image's header (or an .npy header's shape) claims, YOLOV5_MAX_IMAGE_PIXELS (default
2^27 = 134,217,728, training's --max-image-pixels default), and the request body's bytes,
YOLOV5_MAX_REQUEST_BYTES (default 3 bytes per admitted pixel plus 1 MiB: an .npy array at the pixel limit).
A refused request raises RequestRefused, which SageMaker's inference toolkit answers with its 4xx status
code and one-line reason; any other exception is answered 500.
"""

from __future__ import annotations

import io
import json
import os
import struct
from http import HTTPStatus

import cv2
import numpy as np
import torch
from torchvision.ops import batched_nms

MODEL_FILE = "best.torchscript"
PROGRAM_FILE = "best.pt2"
CONFIG_FILE = "config.txt"
PAD_VALUE = 114
MAX_NMS = 30000
JSON = "application/json"
NPY = "application/x-npy"
IMAGE_TYPES = (
    "image/jpeg",
    "image/jpg",
    "image/png",
    "image/bmp",
    "image/webp",
    "image/tiff",
    "application/x-image",
)
MAX_PIXELS_ENV = "YOLOV5_MAX_IMAGE_PIXELS"
MAX_BYTES_ENV = "YOLOV5_MAX_REQUEST_BYTES"
DEFAULT_MAX_PIXELS = 2**27
"""training's --max-image-pixels default: 384 MiB as a decoded RGB array."""
METADATA_BYTES = 2**20
"""room above the raw pixels in the default byte limit: .npy header, EXIF, ICC profiles."""

try:  # the SageMaker inference toolkit answers this class with its status_code, any other exception with 500
    from sagemaker_inference.errors import BaseInferenceToolkitError as _StatusError
except ImportError:  # outside the serving container: the same attributes, without the toolkit

    class _StatusError(Exception):
        def __init__(self, status_code: int, message: str, phrase: str) -> None:
            self.status_code, self.message, self.phrase = status_code, message, phrase
            super().__init__(status_code, message, phrase)


class RequestRefused(_StatusError, ValueError):
    """A request this handler does not serve: a client error with an HTTP status (`status_code`, 4xx) and
    a one-line reason (`message`, the response body the toolkit sends, followed by the traceback)."""

    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(int(status), reason, status.phrase)

    def __str__(self) -> str:
        return self.message


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def thresholds() -> tuple[float, float, int]:
    """(conf, iou, max_det) from the environment, with predict's defaults."""
    conf, iou = _env_float("YOLOV5_CONF", 0.25), _env_float("YOLOV5_IOU", 0.45)
    max_det = int(_env_float("YOLOV5_MAX_DET", 300))
    if not (0 <= conf <= 1 and 0 <= iou <= 1) or max_det < 1:
        raise ValueError(f"YOLOV5_CONF {conf} / YOLOV5_IOU {iou} must lie in [0, 1], YOLOV5_MAX_DET >= 1")
    return conf, iou, max_det


def model_fn(model_dir: str) -> dict:
    """The detector (best.pt2, else best.torchscript) and its config: {"module", "device", "imgsz" (h, w),
    "names", "half", "torchscript"}."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    extra = {CONFIG_FILE: ""}
    program = os.path.join(model_dir, PROGRAM_FILE)
    torchscript = not os.path.isfile(program)
    if torchscript:
        module = torch.jit.load(os.path.join(model_dir, MODEL_FILE), map_location=device, _extra_files=extra)
    else:
        module = torch.export.load(program, extra_files=extra).module().to(device)
    config = json.loads(extra[CONFIG_FILE] or "{}")
    shape = config.get("shape", [1, 3, 640, 640])
    imgsz = config.get("imgsz", shape[2:4])
    names = config.get("names", {})
    if isinstance(names, dict):
        names = [str(names[k]) for k in sorted(names, key=int)]
    return {
        "module": module.eval() if torchscript else module,  # an exported program has no train/eval modes
        "device": device,
        "imgsz": (int(imgsz[0]), int(imgsz[1])),
        "names": list(names),
        "half": bool(config.get("half", False)),
        "torchscript": torchscript,
    }


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"{name}={value!r} must be a whole number >= 1")
    return number


def limits() -> tuple[int, int]:
    """(max_pixels, max_bytes) of one request from the environment: YOLOV5_MAX_IMAGE_PIXELS (2^27) and
    YOLOV5_MAX_REQUEST_BYTES (3 * max_pixels + 1 MiB: an .npy RGB array at the pixel limit fits)."""
    max_pixels = _env_int(MAX_PIXELS_ENV, DEFAULT_MAX_PIXELS)
    return max_pixels, _env_int(MAX_BYTES_ENV, 3 * max_pixels + METADATA_BYTES)


def _malformed(kind: str, why: str) -> RequestRefused:
    return RequestRefused(HTTPStatus.BAD_REQUEST, f"request body is not a readable {kind} image: {why}")


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_TIFF_SIGNATURES = (b"II*\x00", b"MM\x00*")
_JPEG_SOF = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))
_JPEG_NO_LENGTH = frozenset((0x01, *range(0xD0, 0xD8)))  # TEM, RST0-7: markers without a length field
_TIFF_WIDTH, _TIFF_LENGTH, _TIFF_SHORT, _TIFF_LONG = 256, 257, 3, 4
_TIFF_MAX_ENTRIES = 4096


def _png_size(body: bytes) -> tuple[int, int]:
    if body[12:16] != b"IHDR":
        raise _malformed("PNG", "the first chunk is not IHDR")
    return struct.unpack_from(">II", body, 16)


def _jpeg_size(body: bytes) -> tuple[int, int]:
    """(w, h) of the first frame header (SOF0-15), walking the marker segments before it."""
    pos = 2
    while pos + 4 <= len(body):
        if body[pos] != 0xFF:
            raise _malformed("JPEG", f"no marker at byte {pos}")
        marker = body[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
        elif marker in _JPEG_NO_LENGTH:
            pos += 2
        elif marker in _JPEG_SOF:
            height, width = struct.unpack_from(">HH", body, pos + 5)
            return width, height
        elif marker in (0xD8, 0xD9, 0xDA):  # SOI, EOI, SOS before any frame header
            raise _malformed("JPEG", f"marker 0x{marker:02X} before the frame header")
        else:
            (length,) = struct.unpack_from(">H", body, pos + 2)
            if length < 2:
                raise _malformed("JPEG", f"segment length {length} at byte {pos}")
            pos += 2 + length
    raise _malformed("JPEG", "no frame header")


def _bmp_size(body: bytes) -> tuple[int, int]:
    (dib_size,) = struct.unpack_from("<I", body, 14)
    if dib_size == 12:  # OS/2 BITMAPCOREHEADER: unsigned 16-bit sides
        return struct.unpack_from("<HH", body, 18)
    width, height = struct.unpack_from("<ii", body, 18)  # a negative height: rows stored top-down
    return abs(width), abs(height)


def _webp_size(body: bytes) -> tuple[int, int]:
    chunk = body[12:16]
    if chunk == b"VP8 ":  # lossy: 14-bit sides after the key frame's start code
        if body[23:26] != b"\x9d\x01\x2a":
            raise _malformed("WebP", "no VP8 key frame start code")
        width, height = struct.unpack_from("<HH", body, 26)
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L":  # lossless: 14-bit (side - 1) each after the 0x2F signature
        if body[20] != 0x2F:
            raise _malformed("WebP", "no VP8L signature")
        (bits,) = struct.unpack_from("<I", body, 21)
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":  # extended: 24-bit (canvas side - 1) each
        if len(body) < 30:
            raise _malformed("WebP", "VP8X chunk cut short")
        return int.from_bytes(body[24:27], "little") + 1, int.from_bytes(body[27:30], "little") + 1
    raise _malformed("WebP", f"unknown first chunk {bytes(chunk)!r}")


def _tiff_size(body: bytes) -> tuple[int, int]:
    """(w, h) of the first image directory (the page OpenCV decodes)."""
    endian = "<" if body[:2] == b"II" else ">"
    (directory,) = struct.unpack_from(endian + "I", body, 4)
    (count,) = struct.unpack_from(endian + "H", body, directory)
    sides = {}
    for entry in range(directory + 2, directory + 2 + 12 * min(count, _TIFF_MAX_ENTRIES), 12):
        tag, kind = struct.unpack_from(endian + "HH", body, entry)
        if tag in (_TIFF_WIDTH, _TIFF_LENGTH) and kind in (_TIFF_SHORT, _TIFF_LONG):
            (sides[tag],) = struct.unpack_from(
                endian + ("H" if kind == _TIFF_SHORT else "I"), body, entry + 8
            )
    if len(sides) < 2:
        raise _malformed("TIFF", "its first image directory has no width and length")
    return sides[_TIFF_WIDTH], sides[_TIFF_LENGTH]


def image_size(body: bytes) -> tuple[str, int, int]:
    """(format, width, height) the header of an encoded image claims, read without decoding it.
    Raises RequestRefused (400) for a format other than JPEG, PNG, BMP, WebP, TIFF or a broken header."""
    if body[:8] == _PNG_SIGNATURE:
        kind, read = "PNG", _png_size
    elif body[:2] == b"\xff\xd8":
        kind, read = "JPEG", _jpeg_size
    elif body[:2] == b"BM":
        kind, read = "BMP", _bmp_size
    elif body[:4] == b"RIFF" and body[8:12] == b"WEBP":
        kind, read = "WebP", _webp_size
    elif body[:4] in _TIFF_SIGNATURES:
        kind, read = "TIFF", _tiff_size
    else:
        raise RequestRefused(
            HTTPStatus.BAD_REQUEST,
            f"request body ({len(body):,} bytes, starting {bytes(body[:8])!r}) is not a JPEG, PNG, BMP, "
            "WebP or TIFF image",
        )
    try:
        width, height = read(body)
    except (struct.error, IndexError):  # the body ends inside the header
        raise _malformed(kind, f"its header is cut short ({len(body):,} bytes)") from None
    return kind, width, height


def _check_pixels(what: str, width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise RequestRefused(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"{what} claims {width}x{height} px ({width * height:,} pixels), over the limit of "
            f"{max_pixels:,}; not decoded (the endpoint's environment variable {MAX_PIXELS_ENV} raises it)",
        )


_NPY_HEADER_BYTES = 10 + 10_000  # magic + length field + numpy's own default cap on the header text


def _npy_array(body: bytes, max_pixels: int) -> np.ndarray:
    """The uint8 [H, W, 3] array of an .npy body, its declared dtype and shape checked before any copy."""
    stream = io.BytesIO(bytes(body[:_NPY_HEADER_BYTES]))
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(f"format version {version[0]}.{version[1]} (1.0 and 2.0 are read)")
    except ValueError as exc:
        raise RequestRefused(
            HTTPStatus.BAD_REQUEST, f"{NPY}: request body is not an .npy array ({exc})"
        ) from None
    if dtype != np.uint8 or len(shape) != 3 or shape[2] != 3 or min(shape) < 1:
        raise RequestRefused(
            HTTPStatus.BAD_REQUEST, f"{NPY}: expected a uint8 [H, W, 3] RGB array, got {dtype} {list(shape)}"
        )
    height, width = shape[:2]
    _check_pixels(f"{NPY}: its header", width, height, max_pixels)
    offset, size = stream.tell(), height * width * 3
    if len(body) - offset != size:
        raise RequestRefused(
            HTTPStatus.BAD_REQUEST,
            f"{NPY}: its header declares {list(shape)} ({size:,} bytes of pixels) but {len(body) - offset:,} "
            "bytes follow it",
        )
    pixels = np.frombuffer(body, np.uint8, count=size, offset=offset)
    return np.array(pixels.reshape(shape, order="F" if fortran_order else "C"), order="C")  # a writable copy


def input_fn(request_body: bytes, content_type: str) -> np.ndarray:
    """Request body → uint8 [H, W, 3] RGB image. Raises RequestRefused (4xx) for a body over the byte
    limit, an image whose header claims more than the pixel limit, or anything unreadable."""
    max_pixels, max_bytes = limits()
    if len(request_body) > max_bytes:
        raise RequestRefused(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"request body of {len(request_body):,} bytes is over the limit of {max_bytes:,} bytes (the "
            f"endpoint's environment variable {MAX_BYTES_ENV} raises it)",
        )
    content_type = (content_type or "").split(";")[0].strip().lower()
    if content_type == NPY:
        return _npy_array(request_body, max_pixels)
    if content_type not in IMAGE_TYPES:
        raise RequestRefused(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            f"unsupported content type {content_type!r}: use {', '.join(IMAGE_TYPES)} or {NPY}",
        )
    kind, width, height = image_size(request_body)
    _check_pixels(f"{kind} image: its header", width, height, max_pixels)
    try:
        bgr = cv2.imdecode(np.frombuffer(request_body, np.uint8), cv2.IMREAD_COLOR)
    except cv2.error:  # OpenCV raises for some broken files instead of returning None
        bgr = None
    if bgr is None:
        raise _malformed(kind, "OpenCV cannot decode it")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB, dst=bgr)  # in place: one image-sized buffer, not two


def letterbox(
    image: np.ndarray, shape: tuple[int, int]
) -> tuple[np.ndarray, tuple[float, float], tuple[float, float]]:
    """Resize keeping the aspect ratio and pad with grey to `shape` (h, w) → (image, (rw, rh), (pw, ph))."""
    h0, w0 = image.shape[:2]
    gain = min(shape[0] / h0, shape[1] / w0)
    w, h = round(w0 * gain), round(h0 * gain)
    pad_w, pad_h = (shape[1] - w) / 2, (shape[0] - h) / 2
    if (w0, h0) != (w, h):
        image = cv2.resize(image, (w, h), interpolation=cv2.INTER_LINEAR)
    top, bottom = round(pad_h - 0.1), round(pad_h + 0.1)
    left, right = round(pad_w - 0.1), round(pad_w + 0.1)
    if top or bottom or left or right:
        image = cv2.copyMakeBorder(
            image, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(PAD_VALUE,) * 3
        )
    return image, (w / w0, h / h0), (pad_w, pad_h)


def nms(pred: torch.Tensor, conf: float, iou: float, max_det: int) -> torch.Tensor:
    """pred [N, 5 + nc] (xywh, objectness, class scores) of one image → [n, 6] (x1, y1, x2, y2, score,
    class): best class per box, score = objectness * class score > conf, class-aware NMS."""
    x = pred[pred[:, 4] > conf]
    scores = x[:, 5:] * x[:, 4:5]
    xy, half = x[:, :2], x[:, 2:4] / 2
    box = torch.cat((xy - half, xy + half), 1)
    best, cls = scores.max(1, keepdim=True)
    det = torch.cat((box, best, cls.to(x.dtype)), 1)[best.view(-1) > conf]
    if len(det) > MAX_NMS:
        det = det[det[:, 4].argsort(descending=True)[:MAX_NMS]]
    keep = batched_nms(det[:, :4], det[:, 4], det[:, 5].long(), iou)
    return det[keep[:max_det]]


def forward(model: dict, x: torch.Tensor) -> torch.Tensor:
    """The detector's raw predictions [1, anchors, 5 + nc] for the batch `x`, the same bits on every request.

    TorchScript's profiling executor runs a module's first call(s) as written and later ones through the
    graph it optimized from them; the two differ in the last bits (torch 2.6 on the CPU: 3e-8), enough to
    flip a near-tie at the score or IoU threshold, so the first request could be answered differently from
    the next ones with the same image, and from `yolov5-smddp predict`. Optimization off: every request runs
    the graph as exported (what predict computes; on the CPU no slower within noise, measured); a conv-SiLU
    detector leaves the fuser little to gain."""
    if model.get("torchscript", True):
        with torch.jit.optimized_execution(False):
            pred = model["module"](x)
    else:  # an exported program runs as exported: no profiling executor
        pred = model["module"](x)
    return pred[0] if isinstance(pred, list | tuple) else pred


def predict_fn(data: np.ndarray, model: dict) -> dict:
    """RGB image → predict's JSON object (boxes in original pixels)."""
    conf, iou, max_det = thresholds()
    h0, w0 = data.shape[:2]
    padded, (rw, rh), (pw, ph) = letterbox(data, model["imgsz"])
    x = torch.from_numpy(padded).permute(2, 0, 1)[None].to(model["device"])
    x = x.half() / 255 if model["half"] else x.float() / 255
    with torch.inference_mode():
        pred = forward(model, x)
        det = nms(pred[0].float(), conf, iou, max_det).cpu()
        det[:, [0, 2]] = ((det[:, [0, 2]] - pw) / rw).clamp(0, w0)
        det[:, [1, 3]] = ((det[:, [1, 3]] - ph) / rh).clamp(0, h0)
    names = model["names"]
    detections = [
        {
            "box_xyxy": [round(v, 2) for v in row[:4]],
            "class_id": int(row[5]),
            "class_name": names[int(row[5])] if int(row[5]) < len(names) else str(int(row[5])),
            "score": round(row[4], 5),
        }
        for row in det.tolist()
    ]
    return {"width": w0, "height": h0, "detections": detections}


def output_fn(prediction: dict, accept: str) -> str:
    """The prediction as JSON (accept application/json or anything)."""
    accept = (accept or JSON).split(";")[0].strip().lower()
    if accept not in (JSON, "*/*"):
        raise RequestRefused(HTTPStatus.NOT_ACCEPTABLE, f"unsupported accept type {accept!r}: use {JSON}")
    return json.dumps(prediction)
