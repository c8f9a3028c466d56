"""Memory exhaustion as one line that names memory and what to change, not a traceback (issue 50).

A run that runs out of memory fails in several shapes: Python's MemoryError, torch's CPU allocator
("DefaultCPUAllocator: can't allocate memory"), oneDNN's "could not create a primitive" (its scratch buffer
refused under an address-space limit, `ulimit -v`, or strict overcommit) and CUDA's OutOfMemoryError.
`as_memory_problem(exc)` turns each into `MemoryExhausted`, a known problem (exit 2, one `error:` line,
the reason in /opt/ml/output/failure); anything else is None.
"""

from __future__ import annotations

from yolov5_smddp.errors import UserError

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
