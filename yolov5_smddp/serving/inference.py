"""SageMaker PyTorch serving handler for a YOLOv5 detector trained with yolov5-smddp.

Copied into the model folder as code/inference.py. It runs in the SageMaker PyTorch inference container,
which does not have the yolov5_smddp package: it needs only torch, torchvision, numpy and OpenCV, and loads
the TorchScript file best.torchscript (its config.txt gives the input size and class names).

Requests: image/jpeg, image/png (encoded images), application/x-npy (a uint8 [H, W, 3] RGB array saved
with numpy.save). Response (application/json), the schema of `yolov5-smddp predict`:
{"width", "height", "detections": [{"box_xyxy", "class_id", "class_name", "score"}]} with boxes in the
original image's pixels. Thresholds: environment variables YOLOV5_CONF (0.25), YOLOV5_IOU (0.45),
YOLOV5_MAX_DET (300).
"""

from __future__ import annotations

import io
import json
import os

import cv2
import numpy as np
import torch
from torchvision.ops import batched_nms

MODEL_FILE = "best.torchscript"
CONFIG_FILE = "config.txt"
PAD_VALUE = 114
MAX_NMS = 30000
JSON = "application/json"


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
    """The TorchScript detector and its config: {"module", "device", "imgsz" (h, w), "names", "half"}."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    extra = {CONFIG_FILE: ""}
    module = torch.jit.load(os.path.join(model_dir, MODEL_FILE), map_location=device, _extra_files=extra)
    config = json.loads(extra[CONFIG_FILE] or "{}")
    shape = config.get("shape", [1, 3, 640, 640])
    imgsz = config.get("imgsz", shape[2:4])
    names = config.get("names", {})
    if isinstance(names, dict):
        names = [str(names[k]) for k in sorted(names, key=int)]
    return {
        "module": module.eval(),
        "device": device,
        "imgsz": (int(imgsz[0]), int(imgsz[1])),
        "names": list(names),
        "half": bool(config.get("half", False)),
    }


def input_fn(request_body: bytes, content_type: str) -> np.ndarray:
    """Request body → uint8 [H, W, 3] RGB image."""
    content_type = (content_type or "").split(";")[0].strip().lower()
    if content_type in ("image/jpeg", "image/jpg", "image/png"):
        bgr = cv2.imdecode(np.frombuffer(request_body, np.uint8), cv2.IMREAD_COLOR)
        if bgr is None:
            raise ValueError(f"request body is not a decodable {content_type} image")
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    if content_type == "application/x-npy":
        array = np.load(io.BytesIO(request_body), allow_pickle=False)
        if array.ndim != 3 or array.shape[2] != 3 or array.dtype != np.uint8:
            raise ValueError(
                f"application/x-npy: expected a uint8 [H, W, 3] RGB array, got {array.dtype} "
                f"{list(array.shape)}"
            )
        return np.ascontiguousarray(array)
    raise ValueError(
        f"unsupported content type {content_type!r}: use image/jpeg, image/png or application/x-npy"
    )


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


def predict_fn(data: np.ndarray, model: dict) -> dict:
    """RGB image → predict's JSON object (boxes in original pixels)."""
    conf, iou, max_det = thresholds()
    h0, w0 = data.shape[:2]
    padded, (rw, rh), (pw, ph) = letterbox(data, model["imgsz"])
    x = torch.from_numpy(padded).permute(2, 0, 1)[None].to(model["device"])
    x = x.half() / 255 if model["half"] else x.float() / 255
    with torch.inference_mode():
        pred = model["module"](x)
        if isinstance(pred, list | tuple):
            pred = pred[0]
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
        raise ValueError(f"unsupported accept type {accept!r}: use {JSON}")
    return json.dumps(prediction)
