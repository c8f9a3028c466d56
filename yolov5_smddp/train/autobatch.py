"""--batch-size -1 (AutoBatch): the per-GPU batch sized to the GPU's memory, as the release's AutoBatch
does it: train steps (forward + backward) of the run's model at a few batch sizes, the peak memory of each,
a straight line fitted through them, and the batch where the line meets a fraction of the GPU's memory.
Every rank probes its own GPU; all ranks take the smallest (an all_gather: SMDDP's all_reduce has no MIN).
On a CPU it is refused: there is no GPU memory to size the batch to."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np

from yolov5_smddp.distributed import collectives
from yolov5_smddp.errors import ConfigError
from yolov5_smddp.train.out_of_memory import GIB, is_cuda_oom

log = logging.getLogger("yolov5_smddp")

AUTO_BATCH = -1
"""--batch-size -1."""
FRACTION = 0.8
"""Of the GPU's memory, the part the batch may fill (the release's default; the rest absorbs mosaic
sizes, the allocator's fragments and the validation batch)."""
PROBE_SIZES = (1, 2, 4, 8, 16)
MAX_BATCH = 1024
CPU_REFUSAL = (
    "--batch-size -1 (AutoBatch) sizes the per-GPU batch to a GPU's memory, and this run has no CUDA device: "
    "give the batch, e.g. --batch-size 16"
)


def fit_batch(sizes: Sequence[int], peaks: Sequence[float], budget: float) -> int:
    """The largest batch whose peak memory, on the straight line through (sizes, peaks), stays within
    `budget` bytes; 0 when even one image does not fit. Pure."""
    if len(sizes) == 1:
        slope, intercept = peaks[0], 0.0
    else:
        slope, intercept = np.polyfit(np.asarray(sizes, float), np.asarray(peaks, float), 1)
    if (
        slope < 1.0
    ):  # (under a byte an image) memory that does not grow with the batch: the probes' largest is the best known
        return int(max(sizes))
    return int(min(max((budget - intercept) // slope, 0), MAX_BATCH))


def agree_smallest(batch: int) -> int:
    """The smallest of every rank's `batch` (all_gather_rows, then min), on every rank."""
    import torch

    gathered = collectives.all_gather_rows(torch.tensor([[batch]], dtype=torch.int64))
    return int(min(int(g[0, 0]) for g in gathered))


def probe_peaks(step: Callable[[int], None], device, sizes: Sequence[int] = PROBE_SIZES) -> tuple[list, list]:
    """Peak CUDA memory (bytes) of `step(batch)` for each size, up to the first that runs out of memory."""
    import torch

    done, peaks = [], []
    for size in sizes:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            step(size)
            torch.cuda.synchronize(device)
        except Exception as exc:
            if not is_cuda_oom(exc):
                raise
            break
        done.append(size)
        peaks.append(float(torch.cuda.max_memory_allocated(device)))
    torch.cuda.empty_cache()
    return done, peaks


def size_batch(
    model, imgsz: int, device, *, amp_dtype=None, fraction: float = FRACTION, rank: int = 0
) -> int:
    """This rank's largest per-GPU batch for `model` at imgsz x imgsz on CUDA `device` (not agreed yet)."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        raise ConfigError(CPU_REFUSAL)
    model = model.to(device).train()
    params = sum(p.numel() * p.element_size() for p in model.parameters())

    def step(batch: int) -> None:
        images = torch.zeros((batch, 3, imgsz, imgsz), device=device)
        with torch.autocast("cuda", dtype=amp_dtype or torch.float16, enabled=amp_dtype is not None):
            outputs = model(images)
        sum(o.float().sum() for o in outputs).backward()
        model.zero_grad(set_to_none=True)

    sizes, peaks = probe_peaks(step, device)
    free, total = torch.cuda.mem_get_info(device)
    # the optimizer's momentum and the EMA are not in the probes: two more copies of the weights
    budget = total * fraction - (total - free) - 2 * params
    batch = fit_batch(sizes, peaks, budget) if sizes else 0
    log.info(
        "autobatch rank %d: %s %.1f GiB (%.1f GiB free), peak memory at batch %s: %s GiB -> %d image(s) per GPU "
        "at %.0f%% of its memory",
        rank,
        torch.cuda.get_device_name(device),
        total / GIB,
        free / GIB,
        ",".join(map(str, sizes)),
        ",".join(f"{p / GIB:.2f}" for p in peaks),
        batch,
        fraction * 100,
    )
    return batch
