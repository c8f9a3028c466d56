"""The YOLOv5 building blocks. Every block maps `x` (Tensor[B, c1, H, W]) to Tensor[B, c2, H', W'];
attribute names (`conv`, `bn`, `cv1`.., `m`) fix the state-dict keys, which must equal the release's."""

from __future__ import annotations

import torch
from torch import nn

BN_EPS = 1e-3
BN_MOMENTUM = 0.03


class Conv(nn.Module):
    """Conv2d (no bias) → BatchNorm2d → SiLU. Padding defaults to k // 2 ("same" for odd k, stride 1)."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2 if p is None else p, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.act = nn.SiLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))

    def fuse(self) -> None:
        """Fold the BatchNorm into the convolution (inference only): `conv` gains a bias, `bn` becomes
        an identity."""
        if isinstance(self.bn, nn.BatchNorm2d):
            self.conv = fuse_conv_bn(self.conv, self.bn)
            self.bn = nn.Identity()


def fuse_conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A Conv2d with bias computing bn(conv(x)) in eval mode: w' = w * g / sqrt(var + eps),
    b' = beta + (b - mean) * g / sqrt(var + eps)."""
    fused = nn.Conv2d(
        conv.in_channels,
        conv.out_channels,
        conv.kernel_size,
        conv.stride,
        conv.padding,
        conv.dilation,
        conv.groups,
        bias=True,
    ).to(device=conv.weight.device, dtype=conv.weight.dtype)
    with torch.no_grad():
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)  # [c2]
        fused.weight.copy_(conv.weight * scale.view(-1, 1, 1, 1))
        conv_bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
        fused.bias.copy_(bn.bias + (conv_bias - bn.running_mean) * scale)
    fused.requires_grad_(False)
    return fused


class Bottleneck(nn.Module):
    """1×1 Conv to c2*e → 3×3 Conv to c2, plus the input when `shortcut` and c1 == c2."""

    def __init__(self, c1: int, c2: int, shortcut: bool = True, e: float = 0.5) -> None:
        super().__init__()
        hidden = int(c2 * e)
        self.cv1 = Conv(c1, hidden, 1, 1)
        self.cv2 = Conv(hidden, c2, 3, 1)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """CSP block: cv3(cat(m(cv1(x)), cv2(x))) with `n` Bottlenecks of width c2/2 inside `m`."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True, e: float = 0.5) -> None:
        super().__init__()
        hidden = int(c2 * e)
        self.cv1 = Conv(c1, hidden, 1, 1)
        self.cv2 = Conv(c1, hidden, 1, 1)
        self.cv3 = Conv(2 * hidden, c2, 1, 1)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, e=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), dim=1))


class SPPF(nn.Module):
    """Fast spatial pyramid pooling: three chained k×k stride-1 max-pools, concatenated with the input."""

    def __init__(self, c1: int, c2: int, k: int = 5) -> None:
        super().__init__()
        hidden = c1 // 2
        self.cv1 = Conv(c1, hidden, 1, 1)
        self.cv2 = Conv(hidden * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), dim=1))


class Concat(nn.Module):
    """Concatenate a list of tensors along `dim` (channels by default)."""

    def __init__(self, dim: int = 1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs, dim=self.dim)


class Upsample(nn.Upsample):
    """Nearest-neighbour upsampling by an integer factor (no parameters)."""

    def __init__(self, scale_factor: int = 2, mode: str = "nearest") -> None:
        super().__init__(scale_factor=scale_factor, mode=mode)
