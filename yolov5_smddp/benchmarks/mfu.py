"""Model FLOP utilisation: training FLOPs per sample (counted, not estimated) against the device's peak.

MFU = FLOPs per training sample × samples/s per device ÷ the device's dense peak. The peak is the
datasheet's dense (no sparsity) bf16/fp16 tensor-core figure, whatever `--amp` is, so runs with AMP off
show how far fp32 is from the tensor cores.
"""

from __future__ import annotations

from yolov5_smddp.errors import ConfigError

# Dense bf16/fp16 tensor-core TFLOP/s from NVIDIA datasheets; the first substring found in the device
# name wins, so the more specific names come first.
PEAK_TFLOPS_BY_NAME: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM and NVL
    ("H200", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("V100", 125.0),  # fp16 only
    ("T4", 65.0),  # fp16 only
)


def peak_tflops(device_name: str, override: float | None = None) -> float | None:
    """`override` when given (must be > 0), else the table entry whose name is in `device_name`, else
    None (e.g. a CPU: MFU is then not reported)."""
    if override is not None:
        if override <= 0:
            raise ConfigError(f"--peak-tflops must be > 0, got {override}")
        return float(override)
    for name, tflops in PEAK_TFLOPS_BY_NAME:
        if name in device_name:
            return tflops
    return None


def model_flop_utilisation(flops_per_sample: float, samples_per_s: float, peak: float | None) -> float | None:
    """Achieved training FLOP/s over the peak (TFLOP/s), or None without a peak."""
    if peak is None:
        return None
    return flops_per_sample * samples_per_s / (peak * 1e12)


def training_flops_per_sample(model_factory, imgsz: int) -> tuple[float, float]:
    """(forward + backward, forward) FLOPs of one sample at `imgsz`, counted with
    torch.utils.flop_counter.FlopCounterMode on the meta device (shapes only: instant, no memory).

    `model_factory()` returns a fresh model in training mode; the backward runs from the sum of the raw
    outputs' means: the loss changes the values of the gradients, not the work of the backward."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model = model_factory().train().to("meta")
    images = torch.zeros(1, 3, imgsz, imgsz, device="meta")
    with FlopCounterMode(display=False) as forward_counter:
        outputs = model(images)
    with FlopCounterMode(display=False) as backward_counter:
        sum(o.float().mean() for o in outputs).backward()
    forward = float(forward_counter.get_total_flops())
    return forward + float(backward_counter.get_total_flops()), forward
