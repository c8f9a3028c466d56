"""The model folder that deploys: TorchScript (+ ONNX when the onnx package is present) and the
self-contained SageMaker PyTorch serving handler `code/inference.py`, written beside best.pt at the end of
training (on SageMaker /opt/ml/model, packed into model.tar.gz)."""

from __future__ import annotations

import copy
import importlib.util
import logging
from importlib import resources
from pathlib import Path

from torch import nn

from yolov5_smddp.atomic import atomic_write
from yolov5_smddp.ema import unwrap
from yolov5_smddp.export import ExportOptions, export_model

log = logging.getLogger(__name__)

HANDLER = "inference.py"
CODE_DIR = "code"
STEM = "best"


def handler_source() -> str:
    """The text of the serving handler (`yolov5_smddp/serving/inference.py`)."""
    return resources.files("yolov5_smddp.serving").joinpath(HANDLER).read_text(encoding="utf-8")


def serving_formats() -> tuple[str, ...]:
    """torchscript always; onnx when the onnx package can be imported."""
    return ("torchscript", "onnx") if importlib.util.find_spec("onnx") is not None else ("torchscript",)


def write_model_folder(
    model_dir: Path, model: nn.Module, imgsz: int, *, float16_weights: bool = False
) -> dict[str, Path]:
    """Write best.torchscript (+ best.onnx) for a float32 CPU copy of `model` at imgsz × imgsz, and
    code/inference.py; returns {name: path}. `model` itself is left untouched. `float16_weights` rounds
    the copy's weights through float16 first, so the files compute what a float16 best.pt computes."""
    model_dir = Path(model_dir)
    export_copy = copy.deepcopy(unwrap(model)).cpu().eval()
    if float16_weights:
        export_copy.half()
    export_copy.float()
    shape = (imgsz, imgsz)
    written = export_model(
        export_copy, model_dir / STEM, ExportOptions(include=("torchscript",), imgsz=shape)
    )
    handler = model_dir / CODE_DIR / HANDLER
    with atomic_write(handler, "w", encoding="utf-8") as out:
        out.write(handler_source())
    written["handler"] = handler
    if "onnx" in serving_formats():
        try:
            written.update(
                export_model(export_copy, model_dir / STEM, ExportOptions(include=("onnx",), imgsz=shape))
            )
        except Exception as exc:  # the ONNX exporter's own failures: the TorchScript folder still deploys
            log.warning("model folder: best.onnx not written (%s: %s)", type(exc).__name__, exc)
    return written


def write_serving_files(model_dir: Path, model: nn.Module, imgsz: int) -> bool:
    """`write_model_folder` at the end of training (float16-rounded weights, as best.pt holds them);
    a failure is logged as a warning and does not fail the run, whose best.pt is already written."""
    try:
        written = write_model_folder(model_dir, model, imgsz, float16_weights=True)
    except Exception as exc:  # export covers many torch / onnx code paths; the weights are safe already
        log.warning(
            "model folder: TorchScript / ONNX / code/inference.py not written (%s: %s)",
            type(exc).__name__,
            exc,
        )
        return False
    log.info("model folder: %s", ", ".join(str(p) for p in written.values()))
    return True
