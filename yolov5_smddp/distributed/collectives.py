"""The few collectives the trainer needs, each on the default group and with float32 alone on the wire
(SMDDP's documented support; docs/CLUSTER.md): rows gathered from every rank, tensors, integers and a
module's parameters and buffers broadcast from one rank. Alone (no group), each returns its input."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from yolov5_smddp.distributed import process_group

# # SMDDP supports all_reduce, broadcast, all_gather, all_to_all_single and barrier (AWS's list); nothing
# is documented for the *_object collectives, gather/scatter/reduce_scatter, or for integer tensors. So
# whatever crosses the wire here is a dense float32 tensor, and only through all_gather / broadcast /
# all_reduce(SUM) / barrier. Other dtypes travel EXACTLY as float32 values: their bytes, read as int16
# numbers (every one of -32768..32767 is a float32 exactly), one float32 per two bytes. The test stand-in
# (tests/standin_smddp) refuses anything else, so the integration tests under it prove this.

WIRE_DTYPE_NAME = "float32"
"""The one dtype our collectives put on the wire."""


def encode_exact(tensor: Any) -> Any:
    """`tensor` [n, ...] (at least one dimension, any dtype) as float32 [n, k], row by row, exactly.

    float32 is returned as it is ([n, prod(rest)], a view where possible); any other dtype becomes its
    bytes, row by row, zero-padded to an even count and read as int16 numbers: k = ceil(row_bytes / 2).
    `decode_exact` inverts it bit for bit (NaN payloads and -0.0 included)."""
    import torch

    if tensor.dim() == 0:
        raise ValueError("encode_exact: a tensor with at least one dimension (rows) is needed")
    rows = tensor.reshape(tensor.shape[0], math.prod(tensor.shape[1:]))
    if tensor.dtype == torch.float32:
        return rows
    raw = rows.contiguous().view(torch.uint8)
    if raw.shape[1] % 2:
        raw = torch.cat([raw, raw.new_zeros((raw.shape[0], 1))], 1)
    return raw.view(torch.int16).to(torch.float32)


def decode_exact(encoded: Any, dtype: Any, row_shape: tuple[int, ...]) -> Any:
    """The inverse of `encode_exact`: float32 [n, k] -> `dtype` [n, *row_shape]."""
    import torch

    n = encoded.shape[0]
    if dtype == torch.float32:
        return encoded.reshape(n, *row_shape)
    row_bytes = math.prod(row_shape) * torch.empty((), dtype=dtype).element_size()
    raw = encoded.to(torch.int16).view(torch.uint8)[:, :row_bytes].contiguous()
    if row_bytes == 0:
        return torch.zeros((n, *row_shape), dtype=dtype, device=encoded.device)
    return raw.view(dtype).reshape(n, *row_shape)


def all_gather_rows(tensor: Any) -> list[Any]:
    """Every rank's `tensor` [n_r, ...] (n_r may differ between ranks; the other dimensions and the dtype
    may not), in rank order, on every rank, on the CPU, exactly (any dtype: see encode_exact).

    Two all_gathers of float32 on the default group: the row counts, then the encoded rows zero-padded to
    the longest. Runs on this rank's device (CUDA for nccl/smddp). Not initialized → [tensor]."""
    if not process_group.is_initialized():
        return [tensor.cpu()]
    import torch
    import torch.distributed as dist

    device = process_group.wire_device()
    rows = encode_exact(tensor).to(device)
    count = torch.tensor([float(rows.shape[0])], dtype=torch.float32, device=device)
    counts = [torch.zeros_like(count) for _ in range(process_group.world_size())]
    dist.all_gather(counts, count)
    sizes = [int(c.item()) for c in counts]
    padded = torch.zeros((max(sizes), rows.shape[1]), dtype=torch.float32, device=device)
    padded[: rows.shape[0]] = rows
    gathered = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(gathered, padded)
    row_shape = tuple(tensor.shape[1:])
    return [decode_exact(g[:n].cpu(), tensor.dtype, row_shape) for g, n in zip(gathered, sizes)]


def broadcast_tensor(tensor: Any, src: int = 0) -> Any:
    """Rank `src`'s `tensor` on every rank, exactly (one float32 broadcast; any dtype). Every rank passes
    a tensor of the same shape and dtype (the others' contents are ignored); the result is a new tensor
    on `tensor`'s device, the input is left as it is. Not initialized → a copy of `tensor`."""
    if not process_group.is_initialized():
        return tensor.clone()
    import torch.distributed as dist

    wire = encode_exact(tensor.reshape(1, -1)).to(process_group.wire_device(), copy=True)
    dist.broadcast(wire, src=src)
    return decode_exact(wire, tensor.dtype, (tensor.numel(),)).reshape(tensor.shape).to(tensor.device)


def broadcast_ints(values: Sequence[int], src: int = 0) -> tuple[int, ...]:
    """Rank `src`'s integers (int64 range, exact) on every rank; every rank passes as many (the others'
    values are ignored). Flags travel as 0/1."""
    import torch

    return tuple(broadcast_tensor(torch.tensor([int(v) for v in values], dtype=torch.int64)).tolist())


def broadcast_module(module: Any, src: int = 0) -> Any:
    """Copy rank `src`'s parameters and buffers (integer ones such as BatchNorm's num_batches_tracked
    too) into `module` on every rank, in place, with ONE broadcast of one flat float32 buffer (module on
    this rank's device; same architecture everywhere). Returns the module."""
    if not process_group.is_initialized():
        return module
    import torch
    import torch.distributed as dist

    tensors = [t.data for t in list(module.parameters()) + list(module.buffers())]
    parts = [encode_exact(t.reshape(1, -1)).reshape(-1).to(process_group.wire_device()) for t in tensors]
    flat = torch.cat(parts) if parts else torch.zeros(0, device=process_group.wire_device())
    dist.broadcast(flat, src=src)
    for tensor, part in zip(tensors, flat.split([p.numel() for p in parts])):
        value = decode_exact(part.view(1, -1), tensor.dtype, (tensor.numel(),)).reshape(tensor.shape)
        tensor.copy_(value)
    return module
