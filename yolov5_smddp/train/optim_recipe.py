"""The optimiser recipe a run trains with: parameter groups and optimizer, frozen layers, weight decay
scaled to the global batch, the loss (gains scaled to the model), EMA and AMP scaler (`TrainingStack`),
and the DDP wrapper with its loss factor. The trainer, `bench train` and bench/cluster_check.py build
their steps from here, so a benchmark times exactly what training runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from yolov5_smddp.config.hyp import Hyp
from yolov5_smddp.detection.loss import LossHyp, YoloLoss
from yolov5_smddp.distributed import process_group
from yolov5_smddp.errors import ConfigError
from yolov5_smddp.train.ema import ModelEMA
from yolov5_smddp.train.engine import NOMINAL_BATCH, AmpPolicy, accumulation


def build_optimizer(
    model: nn.Module, name: str, lr: float, momentum: float, weight_decay: float
) -> torch.optim.Optimizer:
    """Three parameter groups named for the schedule: "weight" (conv/linear weights, with decay),
    "norm" (normalisation weights, no decay) and "bias" (all biases, no decay). Frozen parameters are left out."""
    weights, norms, biases = [], [], []
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            if pname == "bias":
                biases.append(p)
            elif isinstance(module, nn.modules.batchnorm._NormBase | nn.GroupNorm | nn.LayerNorm):
                norms.append(p)
            else:
                weights.append(p)
    groups = [
        {"params": biases, "name": "bias", "weight_decay": 0.0},
        {"params": weights, "name": "weight", "weight_decay": weight_decay},
        {"params": norms, "name": "norm", "weight_decay": 0.0},
    ]
    # fused: one kernel per group and device (engine.use_fused_kernels says why the step relies on it)
    if name == "SGD":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True, fused=True)
    if name == "Adam":
        return torch.optim.Adam(groups, lr=lr, betas=(momentum, 0.999), fused=True)
    return torch.optim.AdamW(groups, lr=lr, betas=(momentum, 0.999), fused=True)


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """DDP as the trainer uses it: default buckets (1 MiB first, then 25 MiB, which the scaling model
    follows) and gradients that live in the all-reduce buckets (one gradient copy fewer per step, less
    memory).

    broadcast_buffers=False: DDP would otherwise broadcast every buffer (BatchNorm's running statistics
    and its int64 num_batches_tracked) from rank 0 before each forward: one more collective per step, and
    an int64 one, which SMDDP does not document. Training-mode BatchNorm normalises with the batch's own
    statistics, so the running statistics feed only the EMA, and the EMA that is validated and saved is
    rank 0's, broadcast to every rank as float32 before each validation (collectives.broadcast_module).
    The parameters, the same on every rank, are still broadcast once at construction."""
    return nn.parallel.DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True,
        broadcast_buffers=False,
    )


def loss_multiplier(info: process_group.DistInfo) -> float:
    """The loss factor under DDP: the world size, cancelling DDP's gradient average over the ranks, so an
    optimizer step applies the sum of the per-batch gradients, as one process with the global batch does."""
    return float(info.world_size) if info.distributed else 1.0


def check_freeze(freeze: list[int], layer_count: int, model_name: str) -> None:
    """--freeze (layer indices, after `--freeze N` became 0..N-1) against the model it applies to:
    every index an existing layer, and the last layer (Detect) left to train."""
    if not freeze:
        return
    if max(freeze) >= layer_count:
        raise ConfigError(
            f"--freeze: layer {max(freeze)} does not exist: {model_name} has {layer_count} layers "
            f"(0..{layer_count - 1})"
        )
    if layer_count - 1 in freeze:
        raise ConfigError(
            f"--freeze: layer {layer_count - 1} is the Detect head of {model_name}; with it frozen nothing "
            f"learns the classes (freeze at most the first {layer_count - 1} layers)"
        )


def freeze_layers(model: nn.Module, layers: list[int]) -> int:
    """Stop gradients for every parameter of the listed top-level layers (`model.{i}.`); returns the count."""
    prefixes = tuple(f"model.{i}." for i in layers)
    frozen = 0
    for pname, p in model.named_parameters():
        if prefixes and pname.startswith(prefixes):
            p.requires_grad_(False)
            frozen += 1
    return frozen


def scale_weight_decay(hyp: Hyp, global_batch: int, accumulate: int) -> Hyp:
    """A copy of `hyp` with weight_decay scaled by the images per optimizer step / the nominal 64."""
    return dataclasses.replace(hyp, weight_decay=hyp.weight_decay * global_batch * accumulate / NOMINAL_BATCH)


@dataclass(frozen=True)
class TrainingStack:
    """What the steps of a run need besides the model and the data; the trainer and `bench train` build it
    with `build_training_stack`, so a benchmark times exactly what training runs."""

    hyp: Hyp
    """the run's hyperparameters: weight_decay scaled to the global batch (as checkpoints record them)."""
    accumulate: int
    criterion: YoloLoss
    ema: ModelEMA
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler


def build_training_stack(
    model: nn.Module,
    hyp: Hyp,
    *,
    nc: int,
    imgsz: int,
    global_batch: int,
    amp: AmpPolicy,
    optimizer: str = "SGD",
    label_smoothing: float = 0.0,
) -> TrainingStack:
    """Loss (gains scaled to layers, classes and image size; label smoothing), EMA, optimizer groups (weight
    decay scaled to the global batch and accumulation) and the AMP scaler for `model` (already on its device)."""
    accumulate = accumulation(global_batch)
    hyp = scale_weight_decay(hyp, global_batch, accumulate)
    loss_hyp = LossHyp.for_model(hyp, nl=model.detect.nl, nc=nc, imgsz=imgsz, label_smoothing=label_smoothing)
    return TrainingStack(
        hyp=hyp,
        accumulate=accumulate,
        criterion=YoloLoss(model, loss_hyp),
        ema=ModelEMA(model),
        optimizer=build_optimizer(model, optimizer, hyp.lr0, hyp.momentum, hyp.weight_decay),
        scaler=amp.make_scaler(),
    )
