"""Running out of memory, the failure every YOLOv5 user meets first, as one line instead of a traceback:
CUDA out of memory names the rank, the GPU, its memory, the per-GPU batch and image size and what to change;
host memory (MemoryError) names the per-GPU batch, the loader workers and what to change. Both are
OutOfMemory (a MemoryExhausted, a UserError: exit 2 and the failure file, like every input the user must change)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from yolov5_smddp.errors import UserError

GIB = 1024**3


# ---- any error that reports memory exhaustion, wherever it was raised (failure.py's fallback) ----
# A run runs out of memory in several shapes: Python's MemoryError, torch's CPU allocator ("DefaultCPUAllocator:
# can't allocate memory"), oneDNN's "could not create a primitive" (its scratch buffer refused under an
# address-space limit, `ulimit -v`, or strict overcommit) and CUDA's OutOfMemoryError. `as_memory_problem(exc)`
# turns each into `MemoryExhausted`, a known problem (exit 2, one `error:` line, the reason in
# /opt/ml/output/failure); anything else is None. Inside the trainer, `named` gives the richer OutOfMemory.

HOST_MARKS = (
    "could not create a primitive",  # oneDNN (mkldnn) under an address-space limit
    "DefaultCPUAllocator: can't allocate memory",
    "DefaultCPUAllocator: not enough memory",
    "std::bad_alloc",
)
GPU_MARKS = ("CUDA out of memory", "CUDA error: out of memory", "HIP out of memory")

HOST_ADVICE = (
    "lower the batch (--batch-size), --imgsz or --workers, drop --cache ram, or choose an instance type "
    "with more memory (where `ulimit -v` or a container memory limit is set, raise it)"
)
GPU_ADVICE = "lower the batch per GPU (--batch-size) or --imgsz, or choose an instance type with larger GPUs"


class MemoryExhausted(UserError):
    """The run ran out of host or GPU memory; the message says which and what to change."""

    kind = "Out of memory"
    """The failure reason's first words (sagemaker/failure.py)."""


def _chain(exc: BaseException):
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def memory_line(text: str) -> str | None:
    """The one line for an error text that reports memory exhaustion ("MemoryError: ...", a worker's
    recorded error), or None."""
    flat = " ".join(text.split())
    if any(mark in flat for mark in GPU_MARKS) or "OutOfMemoryError" in flat:
        return f"out of GPU memory ({flat[:200]}): {GPU_ADVICE}"
    if "MemoryError" in flat or any(mark in flat for mark in HOST_MARKS):
        return f"out of host memory ({flat[:200]}): {HOST_ADVICE}"
    return None


def as_memory_problem(exc: BaseException) -> MemoryExhausted | None:
    """`exc` (or an exception in its cause/context chain) as MemoryExhausted when it reports memory
    exhaustion; None otherwise."""
    for current in _chain(exc):
        if isinstance(current, MemoryExhausted):
            return current
        text = " ".join(str(current).split()) or "no message"
        if isinstance(current, MemoryError):
            return MemoryExhausted(f"out of host memory (MemoryError: {text[:200]}): {HOST_ADVICE}")
        name = type(current).__name__
        if isinstance(current, RuntimeError | OSError):
            line = memory_line(f"{name}: {text}")
            if line is not None:
                return MemoryExhausted(line)
    return None


class OutOfMemory(MemoryExhausted):
    """Out of GPU or host memory; the message says which, with the numbers and what to change."""

    kind = "Out of memory"
    """The failure reason's first words (sagemaker/failure.py)."""


@dataclass
class MemoryFacts:
    """What the message names, filled in as the run decides it (the trainer updates it)."""

    rank: int = 0
    imgsz: int = 640
    per_rank: int | None = None
    """images per GPU (per rank) in one micro-step; None before the batch is decided."""
    global_batch: int | None = None
    device: Any = None
    workers: int | None = None


def _gpu(device: Any) -> tuple[str, float | None, float | None]:
    """(name, total GiB, free GiB) of `device`, as far as CUDA still answers after the failure."""
    try:
        import torch

        index = (
            device.index if device is not None and device.index is not None else torch.cuda.current_device()
        )
        name = torch.cuda.get_device_name(index)
        free, total = torch.cuda.mem_get_info(index)
        return f"cuda:{index} {name}", total / GIB, free / GIB
    except Exception:  # noqa: BLE001 - a message is built from what is known
        return str(device or "the GPU"), None, None


def gpu_message(facts: MemoryFacts, gpu: tuple[str, float | None, float | None] | None = None) -> str:
    """The one line for CUDA out of memory (`gpu`: name, total and free GiB, for tests; else asked)."""
    name, total, free = gpu if gpu is not None else _gpu(facts.device)
    memory = f"{total:.1f} GiB" if total is not None else "memory unknown"
    if free is not None:
        memory += f", {free:.1f} GiB free after the failure"
    batch = facts.per_rank
    if batch is not None and batch > 1:
        smaller = max(batch // 2, 1)
        global_hint = (
            f" or --batch-size {smaller * (facts.global_batch // batch)}" if facts.global_batch else ""
        )
        change = f"lower the per-GPU batch (--batch-per-gpu {smaller}{global_hint}; --batch-size -1 sizes it to the GPU)"
    else:
        change = "the batch is 1 image per GPU already"
    shape = f"{batch} image(s)" if batch is not None else "a batch"
    return (
        f"out of GPU memory on rank {facts.rank}'s {name} ({memory}) with {shape} of {facts.imgsz}x{facts.imgsz} "
        f"per GPU: {change}, lower --imgsz, or use an instance type with more GPU memory per GPU"
    )


def host_message(facts: MemoryFacts) -> str:
    """The one line for host memory exhaustion (MemoryError)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
        memory = f"{total:.1f} GiB on this host"
    except (ValueError, OSError, AttributeError):
        memory = "this host's memory"
    workers = f", {facts.workers} loader worker(s) per rank" if facts.workers is not None else ""
    batch = f"{facts.per_rank} image(s)" if facts.per_rank is not None else "a batch"
    return (
        f"out of host memory on rank {facts.rank} ({memory}) with {batch} of {facts.imgsz}x{facts.imgsz} per GPU"
        f"{workers}: lower --workers, use --cache disk instead of --cache ram, lower the batch, or use an "
        "instance type with more memory"
    )


@contextmanager
def named(facts: MemoryFacts) -> Iterator[MemoryFacts]:
    """Turn CUDA out of memory and MemoryError inside the block into OutOfMemory with the one line."""
    try:
        yield facts
    except MemoryError as exc:
        raise OutOfMemory(host_message(facts)) from exc
    except Exception as exc:
        if not is_cuda_oom(exc):
            raise
        try:
            import torch

            torch.cuda.empty_cache()  # the line's free memory and the exit after it
        except Exception:  # noqa: BLE001, S110 - the message is what matters
            pass
        raise OutOfMemory(gpu_message(facts)) from exc


def is_cuda_oom(exc: BaseException) -> bool:
    """torch's CUDA out of memory (torch.OutOfMemoryError / torch.cuda.OutOfMemoryError)."""
    try:
        import torch
    except ImportError:
        return False
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(exc, oom)
