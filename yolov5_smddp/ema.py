"""Exponential moving average of a model's weights (the weights that are validated and exported)."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DDP / DataParallel (`.module`) and/or torch.compile (`._orig_mod`) wrappers
    (the one unwrapper: training, checkpoints and weight files use it)."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
            model = model.module
        else:
            return model


class ModelEMA:
    """ema = d * ema + (1 - d) * model over every floating-point state tensor (BatchNorm buffers too),
    with d = decay * (1 - exp(-updates / tau)) so early updates follow the model closely."""

    def __init__(
        self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0
    ) -> None:
        self.module = copy.deepcopy(unwrap(model)).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.decay, self.tau, self.updates = decay, tau, updates

    def current_decay(self) -> float:
        return self.decay * (1 - math.exp(-self.updates / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        d = self.current_decay()
        source = unwrap(model).state_dict()
        ema_float, model_float = [], []
        for key, value in self.module.state_dict().items():
            if value.is_floating_point():
                ema_float.append(value)
                model_float.append(source[key].detach().to(value.dtype))
            else:
                value.copy_(source[key])
        torch._foreach_lerp_(ema_float, model_float, 1.0 - d)

    def state_dict(self) -> dict:
        return {"state_dict": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["state_dict"])
        self.updates = int(state["updates"])
