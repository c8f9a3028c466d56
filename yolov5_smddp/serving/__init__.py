"""The model folder that deploys: best.pt2 (a torch.export program) on torch >= 2.10, best.torchscript on
older torch or on request (YOLOV5_SMDDP_TORCHSCRIPT=1: for serving stacks that only load TorchScript), + ONNX
when the onnx package is present, and the self-contained serving handler `code/inference.py`, written beside
best.pt at the end of training (on SageMaker /opt/ml/model, packed into model.tar.gz). Nothing on the default
path uses an API that torch deprecates (torch.jit warns from 2.10 on)."""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path

import torch
from torch import nn

from yolov5_smddp.errors import OutputError
from yolov5_smddp.files.atomic import atomic_write
from yolov5_smddp.inference import export
from yolov5_smddp.inference.export import ExportOptions, export_model
from yolov5_smddp.models.wrappers import unwrap

log = logging.getLogger(__name__)

HANDLER = "inference.py"
CODE_DIR = "code"
STEM = "best"


def handler_source() -> str:
    """The text of the serving handler (`yolov5_smddp/serving/inference.py`)."""
    return resources.files("yolov5_smddp.serving").joinpath(HANDLER).read_text(encoding="utf-8")


TORCHSCRIPT_ENV = "YOLOV5_SMDDP_TORCHSCRIPT"
PT2_FROM = (2, 10)
"""The first torch whose model folder holds best.pt2 instead of best.torchscript (torch.jit deprecated)."""


def serving_formats(
    torch_version: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """pt2 on torch >= 2.10, else torchscript; torchscript as well on request ($YOLOV5_SMDDP_TORCHSCRIPT=1);
    onnx when the onnx package (and on torch >= 2.10 onnxscript) can be imported. Cheapest first."""
    environ = os.environ if environ is None else environ
    release = tuple(int(p) for p in (torch_version or torch.__version__).split("+")[0].split(".")[:2])
    formats = ["pt2"] if release >= PT2_FROM else ["torchscript"]
    if release >= PT2_FROM and environ.get(TORCHSCRIPT_ENV, "").strip() == "1":
        formats.append("torchscript")
    onnx_packages = (
        ("onnx", "onnxscript") if release >= PT2_FROM else ("onnx",)
    )  # onnxscript: the new exporter
    if all(importlib.util.find_spec(name) is not None for name in onnx_packages):
        formats.append("onnx")
    return tuple(formats)


EXPORT_MARGIN_S = 30.0
"""After a SIGTERM an export starts only while at least this many seconds of the stop window remain
(the export itself, the process's exit and the job's report must fit before SIGKILL)."""


def write_handler(model_dir: Path) -> Path:
    """code/inference.py (the serving handler) in `model_dir`."""
    handler = Path(model_dir) / CODE_DIR / HANDLER
    with atomic_write(handler, "w", encoding="utf-8") as out:
        out.write(handler_source())
    return handler


def write_model_folder(
    model_dir: Path,
    model: nn.Module,
    imgsz: int,
    *,
    float16_weights: bool = False,
    time_left: Callable[[], float | None] | None = None,
) -> dict[str, Path]:
    """Write code/inference.py, then best.pt2 or best.torchscript (+ best.onnx; `serving_formats()`) for a
    float32 CPU copy of `model` at
    imgsz × imgsz, in order of cost; returns {name: path}. `model` itself is left untouched.
    `float16_weights` rounds the copy's weights through float16 first, so the files compute what a
    float16 best.pt computes. `time_left()`: seconds until SIGKILL after a SIGTERM (None without one);
    an export is skipped, and named in the log, when fewer than EXPORT_MARGIN_S remain."""
    model_dir = Path(model_dir)
    written = {"handler": write_handler(model_dir)}
    export_copy = copy.deepcopy(unwrap(model)).cpu().eval()
    if float16_weights:
        export_copy.half()
    export_copy.float()
    shape = (imgsz, imgsz)
    skipped = []
    for fmt in serving_formats():  # pt2 / torchscript, then onnx: cheapest first
        left = time_left() if time_left is not None else None
        if left is not None and left < EXPORT_MARGIN_S:
            skipped.append(f"{STEM}{export.SUFFIXES[fmt]}")
            continue
        try:
            written.update(
                export_model(export_copy, model_dir / STEM, ExportOptions(include=(fmt,), imgsz=shape))
            )
        except OutputError:  # the model folder itself cannot be written: the job fails (exit 2)
            raise
        except Exception as exc:  # an exporter's own failures: best.pt and the other files still stand
            log.warning(
                "model folder: %s%s not written (%s: %s)", STEM, export.SUFFIXES[fmt], type(exc).__name__, exc
            )
    if skipped:
        log.warning(
            "model folder: %s skipped: %.0f s left before SIGKILL after the SIGTERM, under the %.0f s an "
            "export may need (yolov5-smddp export writes them from best.pt)",
            ", ".join(skipped),
            max(left, 0.0),
            EXPORT_MARGIN_S,
        )
    return written


def write_serving_files(
    model_dir: Path, model: nn.Module, imgsz: int, time_left: Callable[[], float | None] | None = None
) -> bool:
    """`write_model_folder` at the end of training (float16-rounded weights, as best.pt holds them);
    an exporter's failure is logged as a warning and does not fail the run, whose best.pt is already
    written; a file that cannot be written (OutputError: a full or read-only model folder) fails it."""
    try:
        written = write_model_folder(model_dir, model, imgsz, float16_weights=True, time_left=time_left)
    except OutputError:  # a full or failing model folder is never success
        raise
    except Exception as exc:  # export covers many torch / onnx code paths; the weights are safe already
        log.warning(
            "model folder: code/inference.py / pt2 / TorchScript / ONNX not written (%s: %s)",
            type(exc).__name__,
            exc,
        )
        return False
    log.info("model folder: %s", ", ".join(str(p) for p in written.values()))
    return True
