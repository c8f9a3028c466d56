"""The Detect head: one 1×1 convolution per pyramid level, the box decoding, and the bias prior."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


class Detect(nn.Module):
    """Detection head over `len(ch)` levels with `na` anchors each and `nc` classes.

    Training mode: `forward(xs)` → list of raw logits, level i of shape [B, na, ny_i, nx_i, 5 + nc]
    (channels: x, y, w, h, objectness, classes).
    Eval mode: → (pred [B, sum(na * ny_i * nx_i), 5 + nc], raw list) where pred holds (xc, yc, w, h) in
    input pixels, then objectness and class probabilities (sigmoids). `pred` is always float32: the
    decode runs outside autocast (the 1×1 convolutions may run in bf16/fp16), because bf16 centres at
    640 px inputs come in steps of up to 4 px — enough to move perfect small boxes below the 0.95 IoU
    threshold and understate mAP50-95.

    `anchors_px` holds per level the (w, h) pairs in pixels; the `anchors` buffer keeps them in grid units
    (pixels / stride), shape [nl, na, 2], as the release's checkpoints do.
    """

    def __init__(
        self, nc: int, anchors_px: Sequence[Sequence[float]], ch: Sequence[int], strides: Sequence[float]
    ) -> None:
        super().__init__()
        if len(anchors_px) != len(ch) or len(strides) != len(ch):
            raise ValueError(
                f"Detect: {len(anchors_px)} anchor levels, {len(ch)} inputs, {len(strides)} strides"
            )
        self.nc = nc
        self.no = nc + 5
        self.nl = len(ch)
        self.na = len(anchors_px[0]) // 2
        self.strides = tuple(float(s) for s in strides)
        anchors = torch.tensor(anchors_px, dtype=torch.float32).view(self.nl, self.na, 2)
        self.register_buffer("anchors", anchors / torch.tensor(self.strides).view(-1, 1, 1))
        self.m = nn.ModuleList(nn.Conv2d(c, self.na * self.no, 1) for c in ch)

    def initialize_biases(self, image_size: int = 640, objects_per_image: float = 8.0) -> None:
        """Prior for training from scratch: objectness bias += log(8 / cells per image at 640),
        class biases += log(0.6 / (nc - 0.99999))."""
        with torch.no_grad():
            for conv, stride in zip(self.m, self.strides):
                bias = conv.bias.view(self.na, self.no)
                bias[:, 4] += math.log(objects_per_image / (image_size / stride) ** 2)
                bias[:, 5:] += math.log(0.6 / (self.nc - 0.99999))

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        raw = []
        for conv, x in zip(self.m, xs):
            batch, _, ny, nx = x.shape
            # [B, na * no, ny, nx] → [B, na, ny, nx, no]
            raw.append(conv(x).view(batch, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous())
        if self.training:
            return raw
        return torch.cat([self.decode(level, r) for level, r in enumerate(raw)], dim=1), raw

    def decode(self, level: int, raw: torch.Tensor) -> torch.Tensor:
        """raw [B, na, ny, nx, no] logits of one level (any float dtype) → float32 [B, na * ny * nx, no]
        (xywh pixels, sigmoids), computed in float32 even inside an autocast region."""
        if raw.device.type not in ("cpu", "cuda"):  # e.g. "meta" (FLOP counting): no autocast there
            return self._decode_float32(level, raw.float())
        with torch.autocast(device_type=raw.device.type, enabled=False):
            return self._decode_float32(level, raw.float())

    def _decode_float32(self, level: int, raw: torch.Tensor) -> torch.Tensor:
        batch, na, ny, nx, _ = raw.shape
        stride = self.strides[level]
        # cell indices from the tensor itself, not torch.arange(device=...): a traced TorchScript / ONNX
        # graph then holds no device constant and runs on CPU and GPU alike (exact integers in float).
        # One grid per image (no Python branch on the batch size, which tracing would freeze and warn
        # about): an empty batch (every image undecodable, left out by collate) gives an empty output.
        ones = torch.ones_like(raw[:, 0, :, :, 0])  # [B, ny, nx]
        grid = torch.stack((ones.cumsum(2) - 1, ones.cumsum(1) - 1), dim=-1).unsqueeze(1)  # [B, 1, ny, nx, 2]
        anchor_px = (self.anchors[level] * stride).to(raw.dtype).view(1, na, 1, 1, 2)
        s = raw.sigmoid()
        xy = (s[..., :2] * 2 - 0.5 + grid) * stride
        wh = (s[..., 2:4] * 2) ** 2 * anchor_px
        return torch.cat((xy, wh, s[..., 4:]), dim=-1).view(batch, na * ny * nx, self.no)
