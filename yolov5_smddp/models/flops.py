"""Model size report: the layer table, parameter count and forward GFLOPs.

GFLOPs come from `torch.utils.flop_counter.FlopCounterMode` on a copy of the architecture built on the
meta device (shapes only, no compute), for one image. The counter counts a multiply-accumulate as 2
FLOPs (the convention of the release's table: 16.5 for yolov5s at 640) and counts convolutions and
matrix products only; BatchNorm, activations, pooling and additions are not counted, so folding the
BatchNorm into the convolutions (fuse) does not change the number.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from yolov5_smddp.errors import ConfigError
from yolov5_smddp.models.yolo import DetectionModel, LayerSpec, build_model


@dataclass(frozen=True)
class LayerRow:
    """One row of the layer table."""

    index: int
    source: str  # "-1" = the previous layer, else absolute indices as in the config
    repeats: int
    params: int
    block: str
    args: str


@dataclass(frozen=True)
class ModelReport:
    name: str
    layers: list[LayerRow]
    parameters: int
    gflops: float
    imgsz: tuple[int, int]  # (h, w)
    fused: bool  # whether GFLOPs were counted on a fused model (never: see the module docstring)


def _source_text(spec: LayerSpec) -> str:
    """As a config writes it: the previous layer as -1 when it is the first source."""
    shown = list(spec.sources)
    if shown[0] == spec.index - 1:
        shown[0] = -1
    return str(shown[0]) if len(shown) == 1 else str(shown)


def count_gflops(model: DetectionModel, imgsz: tuple[int, int]) -> float:
    """Forward GFLOPs of one [1, 3, h, w] image through `model`'s architecture (eval mode)."""
    with torch.device("meta"):
        shadow = build_model(model.cfg).eval()
        image = torch.zeros(1, 3, *imgsz)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        shadow(image)
    return counter.get_total_flops() / 1e9


def model_report(model: DetectionModel, imgsz: int | tuple[int, int] = 640) -> ModelReport:
    """Layer table, parameter count and GFLOPs at `imgsz` (int or (h, w), multiples of the max stride)."""
    hw = (imgsz, imgsz) if isinstance(imgsz, int) else tuple(imgsz)
    stride = int(max(model.detect.strides))
    if any(v <= 0 or v % stride for v in hw):
        raise ConfigError(f"imgsz {imgsz}: must be positive multiples of the model's stride {stride}")
    rows = [
        LayerRow(
            index=spec.index,
            source=_source_text(spec),
            repeats=spec.repeats,
            params=sum(p.numel() for p in layer.parameters()),
            block=spec.block,
            args=str(list(spec.args)),
        )
        for spec, layer in zip(model.layers, model.model)
    ]
    return ModelReport(
        name=str(model.cfg.get("name", "model")),
        layers=rows,
        parameters=sum(p.numel() for p in model.parameters()),
        gflops=count_gflops(model, hw),
        imgsz=hw,
        fused=False,
    )


def format_report(report: ModelReport) -> str:
    """The report as a text table plus a summary line."""
    lines = [f"{'idx':>4}  {'from':<12} {'n':>3} {'params':>11}  {'module':<9} arguments"]
    for row in report.layers:
        lines.append(
            f"{row.index:>4}  {row.source:<12} {row.repeats:>3} {row.params:>11,}  {row.block:<9} {row.args}"
        )
    h, w = report.imgsz
    lines.append(
        f"{report.name}: {len(report.layers)} layers, {report.parameters:,} parameters, "
        f"{report.gflops:.1f} GFLOPs at {h}x{w} ({'fused' if report.fused else 'unfused'} eval model; "
        f"FLOPs = 2 x multiply-accumulates of convolutions, torch.utils.flop_counter)"
    )
    return "\n".join(lines)
