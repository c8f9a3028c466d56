"""Deterministic, non-trivial weights for any model, from each state-dict key's name alone (an integer
hash, no random generator, no dependence on key order), so that the release's code (bench/release_reference/
make_model_fixtures.py) and ours fill two independently built models identically and their outputs can be
compared. Values are representable in float16, so a half-precision checkpoint of them is exact.
"""

from __future__ import annotations

import zlib

import torch

FIXED_INPUT_SIZE = 128  # a multiple of every stride a v7.0 detection yaml has (P7: 128)


def _uniform(key: str, numel: int) -> torch.Tensor:
    """numel values in [-1, 1) from an integer hash of (key, index): exact integer arithmetic, so every
    machine and library computes the same bits."""
    seed = zlib.crc32(key.encode())
    h = (torch.arange(numel, dtype=torch.int64) * 2654435761 + seed) % 2**32
    h = ((h ^ (h >> 15)) * 2246822519) % 2**32
    h = ((h ^ (h >> 13)) * 3266489917) % 2**32
    h = h ^ (h >> 16)
    return h.to(torch.float64) / 2**31 - 1.0


def fixed_value(key: str, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    """float32 values for the tensor named `key`, pseudo-random from its name, scaled by role: BatchNorm
    statistics and scales near their usual values, small biases, weights He-uniform (by 1/sqrt(fan-in))
    so that features keep their scale through the network and the output depends on the input."""
    numel = 1
    for d in shape:
        numel *= d
    u = _uniform(key, numel).view(*shape)
    leaf = key.rsplit(".", 1)[-1]
    if leaf == "running_var":
        value = 1.0 + 0.25 * (u + 1.0)
    elif leaf == "running_mean":
        value = 0.1 * u
    elif len(shape) == 1 and leaf == "weight":  # BatchNorm scale
        value = 1.0 + 0.2 * u
    elif len(shape) <= 1:  # biases
        value = 0.1 * u
    else:
        fan_in = numel // shape[0]
        value = u * (6.0 / fan_in) ** 0.5
    return value.to(torch.float16).to(torch.float32)


def fill_fixed(model: torch.nn.Module) -> torch.nn.Module:
    """Overwrite every floating parameter and buffer of `model` (except anchor buffers) with
    `fixed_value`. Returns the model."""
    with torch.no_grad():
        for key, tensor in model.state_dict().items():
            if tensor.is_floating_point() and not key.endswith(("anchors", "anchor_grid")):
                tensor.copy_(fixed_value(key, tensor.shape).to(tensor.dtype))
    return model


def fixed_input(height: int = FIXED_INPUT_SIZE, width: int = FIXED_INPUT_SIZE) -> torch.Tensor:
    """A [1, 3, height, width] image in [0, 1] with structure at several scales, in steps of 1/255 (so an
    8-bit image file holds it exactly)."""
    y = torch.arange(height, dtype=torch.float64).view(1, 1, height, 1)
    x = torch.arange(width, dtype=torch.float64).view(1, 1, 1, width)
    c = torch.arange(3, dtype=torch.float64).view(1, 3, 1, 1)
    image = (
        0.5
        + 0.25 * torch.sin(x * 0.11 + c) * torch.cos(y * 0.07 - c)
        + 0.2 * torch.sin((x + y) * 0.013 * (c + 1))
    )
    return (image.clamp(0, 1) * 255).round().to(torch.float32) / 255
