"""Operators dispatched by a piece of PyTorch code: the host-side cost proxy of a training step.

Every ATen operator that reaches the dispatcher below autograd (forward, backward, optimizer, EMA,
views and detaches included) counts once; a foreach or fused operator counts once however many tensors
it covers. On a GPU each counted operator is roughly one kernel launch or one piece of host work, so the
count tracks the launch-bound part of a step on any machine, the CPU included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from torch.utils._python_dispatch import TorchDispatchMode


class OperatorCounter(TorchDispatchMode):
    """`with OperatorCounter() as counter: ...`, then `counter.total` and `counter.by_name` (operator
    overload name → calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_name: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.by_name[str(func)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_name.values())


def count_operators(fn: Callable[[], object]) -> OperatorCounter:
    """Run `fn()` once under an OperatorCounter and return the counter."""
    with OperatorCounter() as counter:
        fn()
    return counter
