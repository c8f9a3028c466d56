"""Exponential moving average of a model's weights (the weights that are validated and exported)."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from yolov5_smddp.models.wrappers import unwrap


class ModelEMA:
    """ema = d * ema + (1 - d) * model over every floating-point state tensor (BatchNorm buffers too),
    with d = decay * (1 - exp(-updates / tau)) so early updates follow the model closely; the other state
    tensors (BatchNorm's num_batches_tracked) are copied.

    An update is two foreach operations over flat lists of the EMA's and the model's state tensors, paired
    by name once per source module (rebuilt when `update` sees another module, e.g. after unwrapping a new
    wrapper): no state_dict copies per step. Parameters are paired as objects, so moving the model moves
    what is read; a module whose buffers are replaced after its first update must not be passed again.
    """

    def __init__(
        self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0
    ) -> None:
        self.module = copy.deepcopy(unwrap(model)).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.decay, self.tau, self.updates = decay, tau, updates
        self._source: nn.Module | None = None
        self._pairs: tuple[list[torch.Tensor], ...] = ([], [], [], [])

    def current_decay(self) -> float:
        return self.decay * (1 - math.exp(-self.updates / self.tau))

    def _pair(self, source: nn.Module) -> None:
        """(EMA floats, model floats, EMA others, model others), in state_dict order."""
        theirs = source.state_dict(keep_vars=True)
        pairs: tuple[list[torch.Tensor], ...] = ([], [], [], [])
        for key, value in self.module.state_dict(keep_vars=True).items():
            other = theirs[key]
            if value.is_floating_point() and other.dtype != value.dtype:
                raise ValueError(
                    f"ModelEMA: {key} is {other.dtype} in the model but {value.dtype} in the EMA"
                )
            at = 0 if value.is_floating_point() else 2
            pairs[at].append(value)
            pairs[at + 1].append(other)
        self._source, self._pairs = source, pairs

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        source = unwrap(model)
        if source is not self._source:
            self._pair(source)
        self.updates += 1
        ema_float, model_float, ema_other, model_other = self._pairs
        torch._foreach_lerp_(ema_float, model_float, 1.0 - self.current_decay())
        if ema_other:
            torch._foreach_copy_(ema_other, model_other)

    def state_dict(self) -> dict:
        return {"state_dict": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["state_dict"])
        self.updates = int(state["updates"])
