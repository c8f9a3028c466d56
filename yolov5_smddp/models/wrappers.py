"""The model inside its training wrappers (DDP, DataParallel, torch.compile)."""

from __future__ import annotations

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
