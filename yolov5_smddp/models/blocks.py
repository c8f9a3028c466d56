"""The YOLOv5 building blocks, one class per module name a release model yaml can use. Every block maps
`x` (Tensor[B, c1, H, W]) to Tensor[B, c2, H', W']; attribute names (`conv`, `bn`, `cv1`.., `m`) fix the
state-dict keys, which must equal the release's, and constructor arguments follow the order of the yaml's
`args` after the builder put the input channels first (`[c1, c2, ...]`; CSP blocks take the repeat count
third).

Activations: a Conv built with `act=True` gets SiLU; the builder replaces it when the config names another
activation (`activation: nn.LeakyReLU(0.1)`), see `yolo.parse_activation`. `act=False` means no activation
(GhostBottleneck's inner convolutions)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

BN_EPS = 1e-3
BN_MOMENTUM = 0.03


def same_padding(k: int | Sequence[int], d: int = 1) -> int | list[int]:
    """Padding that keeps the spatial size at stride 1: half the (dilated) kernel, per dimension."""
    if isinstance(k, int):
        return (d * (k - 1) + 1) // 2
    return [(d * (v - 1) + 1) // 2 for v in k]


def _batchnorm(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=BN_EPS, momentum=BN_MOMENTUM)


class Conv(nn.Module):
    """Conv2d (no bias) → BatchNorm2d → activation (SiLU; none when `act` is False). Padding defaults to
    "same" at stride 1; `g` groups, `d` dilation."""

    def __init__(
        self,
        c1: int,
        c2: int,
        k: int | Sequence[int] = 1,
        s: int = 1,
        p: int | Sequence[int] | None = None,
        g: int = 1,
        d: int = 1,
        act: bool = True,
    ) -> None:
        super().__init__()
        padding = same_padding(k, d) if p is None else p
        self.conv = nn.Conv2d(c1, c2, k, s, padding, groups=g, dilation=d, bias=False)
        self.bn = _batchnorm(c2)
        self.act: nn.Module = nn.SiLU(inplace=True) if act else nn.Identity()
        self.activated = bool(act)  # whether a config's `activation` applies to this convolution

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))

    def fuse(self) -> None:
        """Fold the BatchNorm into the convolution (inference only): `conv` gains a bias, `bn` becomes
        an identity."""
        if isinstance(self.bn, nn.BatchNorm2d):
            self.conv = fuse_conv_bn(self.conv, self.bn)
            self.bn = nn.Identity()


class DWConv(Conv):
    """Depth-wise Conv: groups = gcd(c1, c2)."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, d: int = 1, act: bool = True) -> None:
        super().__init__(c1, c2, k, s, g=math.gcd(c1, c2), d=d, act=act)


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
    """1×1 Conv to c2*e → 3×3 Conv (g groups) to c2, plus the input when `shortcut` and c1 == c2."""

    def __init__(self, c1: int, c2: int, shortcut: bool = True, g: int = 1, e: float = 0.5) -> None:
        super().__init__()
        hidden = int(c2 * e)
        self.cv1 = Conv(c1, hidden, 1, 1)
        self.cv2 = Conv(hidden, c2, 3, 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """CSP block: cv3(cat(m(cv1(x)), cv2(x))) with `n` Bottlenecks of width c2*e inside `m`."""

    def __init__(
        self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1, e: float = 0.5
    ) -> None:
        super().__init__()
        hidden = int(c2 * e)
        self.cv1 = Conv(c1, hidden, 1, 1)
        self.cv2 = Conv(c1, hidden, 1, 1)
        self.cv3 = Conv(2 * hidden, c2, 1, 1)
        self.m: nn.Module = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, g, e=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), dim=1))


class BottleneckCSP(nn.Module):
    """The older CSP block (v3.0 layouts): cv4(act(bn(cat(cv3(m(cv1(x))), cv2(x))))), where cv2 and cv3
    are bare 1×1 convolutions and `bn`/`act` act on the concatenation."""

    def __init__(
        self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1, e: float = 0.5
    ) -> None:
        super().__init__()
        hidden = int(c2 * e)
        self.cv1 = Conv(c1, hidden, 1, 1)
        self.cv2 = nn.Conv2d(c1, hidden, 1, 1, bias=False)
        self.cv3 = nn.Conv2d(hidden, hidden, 1, 1, bias=False)
        self.cv4 = Conv(2 * hidden, c2, 1, 1)
        self.bn = _batchnorm(2 * hidden)
        self.act: nn.Module = nn.SiLU()
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, g, e=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat((self.cv3(self.m(self.cv1(x))), self.cv2(x)), dim=1)
        return self.cv4(self.act(self.bn(y)))


class TransformerLayer(nn.Module):
    """Self-attention over the sequence (q, k, v projections, `num_heads` heads) and a two-layer linear
    feed-forward, each with a residual; no normalisation. Input [seq, B, c]."""

    def __init__(self, c: int, num_heads: int) -> None:
        super().__init__()
        self.q = nn.Linear(c, c, bias=False)
        self.k = nn.Linear(c, c, bias=False)
        self.v = nn.Linear(c, c, bias=False)
        self.ma = nn.MultiheadAttention(embed_dim=c, num_heads=num_heads)
        self.fc1 = nn.Linear(c, c, bias=False)
        self.fc2 = nn.Linear(c, c, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ma(self.q(x), self.k(x), self.v(x), need_weights=False)[0] + x
        return self.fc2(self.fc1(x)) + x


class TransformerBlock(nn.Module):
    """Optional 1×1 Conv to c2 (only when c1 != c2), then the pixels as a sequence: a learned linear
    position term added, `num_layers` TransformerLayers, back to [B, c2, H, W]."""

    def __init__(self, c1: int, c2: int, num_heads: int, num_layers: int) -> None:
        super().__init__()
        if c1 != c2:
            self.conv = Conv(c1, c2)
        else:
            self.conv = None
        self.linear = nn.Linear(c2, c2)
        self.tr = nn.Sequential(*(TransformerLayer(c2, num_heads) for _ in range(num_layers)))
        self.c2 = c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv is not None:
            x = self.conv(x)
        batch, _, h, w = x.shape
        seq = x.flatten(2).permute(2, 0, 1)  # [h * w, B, c2]
        out = self.tr(seq + self.linear(seq))
        return out.permute(1, 2, 0).reshape(batch, self.c2, h, w)


class C3TR(C3):
    """C3 whose bottlenecks are one TransformerBlock (4 heads, `n` layers)."""

    def __init__(
        self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1, e: float = 0.5
    ) -> None:
        super().__init__(c1, c2, n, shortcut, g, e)
        hidden = int(c2 * e)
        self.m = TransformerBlock(hidden, hidden, 4, n)


class GhostConv(nn.Module):
    """Half the output channels from a Conv, the other half from a cheap 5×5 depth-wise Conv of those."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, g: int = 1, act: bool = True) -> None:
        super().__init__()
        hidden = c2 // 2
        self.cv1 = Conv(c1, hidden, k, s, None, g, act=act)
        self.cv2 = Conv(hidden, hidden, 5, 1, None, hidden, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv1(x)
        return torch.cat((y, self.cv2(y)), dim=1)


class GhostBottleneck(nn.Module):
    """GhostConv → (depth-wise k×k stride-s Conv when s == 2) → GhostConv without activation, plus a
    shortcut (the input, or a depth-wise + 1×1 Conv path when s == 2)."""

    def __init__(self, c1: int, c2: int, k: int = 3, s: int = 1) -> None:
        super().__init__()
        hidden = c2 // 2
        self.conv = nn.Sequential(
            GhostConv(c1, hidden, 1, 1),
            DWConv(hidden, hidden, k, s, act=False) if s == 2 else nn.Identity(),
            GhostConv(hidden, c2, 1, 1, act=False),
        )
        self.shortcut = (
            nn.Sequential(DWConv(c1, c1, k, s, act=False), Conv(c1, c2, 1, 1, act=False))
            if s == 2
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) + self.shortcut(x)


class C3Ghost(C3):
    """C3 whose bottlenecks are `n` GhostBottlenecks."""

    def __init__(
        self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1, e: float = 0.5
    ) -> None:
        super().__init__(c1, c2, n, shortcut, g, e)
        hidden = int(c2 * e)
        self.m = nn.Sequential(*(GhostBottleneck(hidden, hidden) for _ in range(n)))


class SPP(nn.Module):
    """Spatial pyramid pooling: 1×1 Conv to c1/2, its stride-1 max-pools of each kernel in `k`
    concatenated with it, 1×1 Conv to c2."""

    def __init__(self, c1: int, c2: int, k: Sequence[int] = (5, 9, 13)) -> None:
        super().__init__()
        hidden = c1 // 2
        self.cv1 = Conv(c1, hidden, 1, 1)
        self.cv2 = Conv(hidden * (len(k) + 1), c2, 1, 1)
        self.m = nn.ModuleList(nn.MaxPool2d(kernel_size=v, stride=1, padding=v // 2) for v in k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        return self.cv2(torch.cat([x, *(pool(x) for pool in self.m)], dim=1))


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


class Focus(nn.Module):
    """Space-to-depth (each 2×2 pixel block's four pixels as channels: even/even, odd rows, odd columns,
    odd/odd), then a Conv: the older layouts' first layer, downsampling by 2 before the Conv's stride."""

    def __init__(
        self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None, g: int = 1, act: bool = True
    ) -> None:
        super().__init__()
        self.conv = Conv(c1 * 4, c2, k, s, p, g, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(
            torch.cat((x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]), dim=1)
        )


class ZeroPad2d(nn.ZeroPad2d):
    """torch's ZeroPad2d, except in an ONNX export, where the zeros are concatenated instead of a Pad
    node: onnxruntime's graph optimizer folds a Pad followed by a MaxPool into the pool's own padding,
    which pads with -inf, not zeros (yolov3-tiny's ZeroPad2d + MaxPool2d(2, 1) came out 3.5 px off)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.onnx.is_in_onnx_export() or min(self.padding) < 0:
            return super().forward(x)
        left, right, top, bottom = self.padding
        zero = x[..., :1, :1] * 0  # [B, C, 1, 1], shape-agnostic (dynamic axes)
        row = [zero.expand(-1, -1, x.shape[2], n) for n in (left, right)]
        x = torch.cat([t for t in (row[0], x, row[1]) if t.shape[-1]], dim=3)
        col = [zero.expand(-1, -1, n, x.shape[3]) for n in (top, bottom)]
        return torch.cat([t for t in (col[0], x, col[1]) if t.shape[-2]], dim=2)


class Concat(nn.Module):
    """Concatenate a list of tensors along `dim` (channels by default)."""

    def __init__(self, dim: int = 1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs, dim=self.dim)
