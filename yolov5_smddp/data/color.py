"""HSV jitter and flips on the device batch (`--color-aug device`), instead of in the loader workers.

The loader workers then only draw each sample's parameters (`augment.draw_color_params`, as they do for
their own path `augment.apply_color_hwc`), flip the LABELS, and hand over the image unflipped in BGR;
`apply_color` does the rest on the batch, wherever the batch is (the GPU). That takes ~3 ms of CPU per 640 x 640 sample out of every worker (two colour conversions, a table
lookup, a flip), which on GPU nodes is what the loader is short of.

The model sees the same pixels: the conversions follow OpenCV's 8-bit ones. BGR -> HSV is OpenCV's
integer arithmetic (H in [0, 180), fixed-point reciprocals with a 12-bit shift), exact; the gain tables are
the worker path's (float, truncated to uint8); HSV -> RGB is OpenCV's float formula as its vectorised
loop computes it, exact (see `hsv_to_rgb` for the few pixels at the end of a row OpenCV rounds instead).

Per-sample parameters: float64 [B, 6] rows (gain_h, gain_s, gain_v, hsv_on, flip_ud, flip_lr); float64 so
that the gains make the same tables as the worker path's.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_SHIFT = 12  # OpenCV's hsv_shift: fixed-point bits of its 8-bit BGR -> HSV division tables
_HUE_RANGE = 180
_CHUNK = 16  # images converted at once: bounds the int32 temporaries to ~40 bytes per pixel of 16 images


def runs_on_device(mode: str, device_type: str) -> bool:
    """Whether `--color-aug mode` puts HSV and flips on the device batch: 'device' always, 'workers'
    never, 'auto' on CUDA only (on a CPU the workers' OpenCV costs ~3 ms a 640 px sample, these tensor
    ops ~40x that)."""
    return mode == "device" or (mode == "auto" and device_type == "cuda")


@lru_cache(maxsize=16)
def _division_table(numerator: float, n: int, device) -> torch.Tensor:
    """OpenCV's int table round(numerator / i) for i in 0..n-1 (0 at i = 0), as int32."""
    import torch

    i = torch.arange(n, dtype=torch.float64, device=device)
    table = torch.where(i > 0, numerator / i.clamp(min=1), torch.zeros_like(i))
    return torch.round(table).to(torch.int32)  # cvRound: ties to even; no table value is a tie


def bgr_to_hsv(b: torch.Tensor, g: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """int32 B, G, R (0..255, any same shape) → int32 H (0..179), S, V (0..255): OpenCV's
    COLOR_BGR2HSV for 8-bit images, bit for bit."""
    import torch

    v = torch.maximum(torch.maximum(b, g), r)
    diff = v - torch.minimum(torch.minimum(b, g), r)
    half = 1 << (_SHIFT - 1)
    sdiv = _division_table(float(255 << _SHIFT), 256, v.device)
    hdiv = _division_table(float(_HUE_RANGE << _SHIFT) / 6.0, 256, v.device)
    s = (diff * sdiv[v.long()] + half) >> _SHIFT
    h = torch.where(v == r, g - b, torch.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
    h = (h * hdiv[diff.long()] + half) >> _SHIFT
    h = torch.where(h < 0, h + _HUE_RANGE, h)
    return h, s, v


def hsv_to_rgb(h: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """int H (0..179), S, V (0..255) → uint8 [3, ...] (R, G, B): OpenCV's COLOR_HSV2RGB for 8-bit images
    as its vectorised x86 loop computes it: float32, the two `1 - s * t` terms fused (one rounding, as the
    compiler contracts them into FMAs), scaled by 255 and truncated. Equal to OpenCV 4.10 on all 2^24
    inputs (AVX2 build). OpenCV's scalar loop, which only takes the last width % (4 x SIMD lanes) pixels of
    a row (none at widths that are multiples of 64), rounds instead: there the two may differ by one."""
    import torch

    hf = h.float() * (6.0 / _HUE_RANGE)
    sf = s.float() * (1.0 / 255.0)
    vf = v.float() * (1.0 / 255.0)
    sector = torch.trunc(hf)
    frac = hf - sector

    def one_minus(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # 1 - a * b with one rounding
        return (1.0 - a.double() * b.double()).float()  # the float32 product is exact in float64

    tab = torch.stack([vf, vf * (1.0 - sf), vf * one_minus(sf, frac), vf * one_minus(sf, 1.0 - frac)])
    rows = _sector_picks(h.device)[sector.long().clamp_(0, 5)]  # [..., 3]
    rgb = torch.gather(tab, 0, rows.movedim(-1, 0))  # [3, ...]
    return torch.trunc(rgb * 255.0).clamp_(0, 255).to(torch.uint8)


@lru_cache(maxsize=16)
def _sector_picks(device) -> torch.Tensor:
    """int64 [6, 3]: which of the four values R, G and B take in each of the six hue sectors."""
    import torch

    return torch.tensor([[0, 3, 1], [2, 0, 1], [1, 0, 3], [1, 2, 0], [3, 1, 0], [0, 1, 2]], device=device)


def _gain_tables(params: torch.Tensor) -> torch.Tensor:
    """int64 [B, 3, 256]: the worker path's per-sample lookup tables (hue wraps at 180; S, V clip)."""
    import torch

    x = torch.arange(256, dtype=torch.float64, device=params.device)
    gains = params[:, :3].double()
    hue = torch.remainder(x * gains[:, :1], float(_HUE_RANGE))
    sat = (x * gains[:, 1:2]).clamp(0, 255)
    val = (x * gains[:, 2:3]).clamp(0, 255)
    return torch.stack([hue, sat, val], dim=1).to(torch.uint8).long()  # float → uint8 truncates, as numpy


def apply_color(imgs: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """uint8 [B, 3, H, W] BGR (any memory format, any device) + float64 [B, 6] → uint8 RGB with the
    HSV jitter (samples with hsv_on) and flips applied, in the memory format of `imgs` (channels-last for
    the loader's batches; the caller picks the model's, engine.prepare_images)."""
    import torch

    params = params.to(imgs.device, non_blocking=True)  # pinned by the loader: no host sync
    out = torch.empty_like(imgs, memory_format=torch.preserve_format)
    tables = _gain_tables(params)
    for start in range(0, imgs.shape[0], _CHUNK):
        sl = slice(start, start + _CHUNK)
        chunk = imgs[sl].int()
        b, g, r = chunk[:, 0], chunk[:, 1], chunk[:, 2]
        h, s, v = bgr_to_hsv(b, g, r)
        t = tables[sl]
        n, hw = h.shape[0], h.shape[1:]
        h = torch.gather(t[:, 0], 1, h.reshape(n, -1).long()).reshape(n, *hw)
        s = torch.gather(t[:, 1], 1, s.reshape(n, -1).long()).reshape(n, *hw)
        v = torch.gather(t[:, 2], 1, v.reshape(n, -1).long()).reshape(n, *hw)
        jittered = hsv_to_rgb(h, s, v).movedim(0, 1)  # [n, 3, H, W] RGB
        plain = chunk.flip(1).to(torch.uint8)  # BGR → RGB only
        hsv_on = params[sl, 3].bool().view(-1, 1, 1, 1)
        rgb = torch.where(hsv_on, jittered, plain)
        up_down = params[sl, 4].bool().view(-1, 1, 1, 1)
        left_right = params[sl, 5].bool().view(-1, 1, 1, 1)
        rgb = torch.where(up_down, rgb.flip(2), rgb)
        rgb = torch.where(left_right, rgb.flip(3), rgb)
        out[sl] = rgb
    return out
