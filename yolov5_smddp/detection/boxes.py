"""Pure box arithmetic on tensors. Formats: xywh = (xc, yc, w, h); xyxy = (x1, y1, x2, y2); pixels unless
a name says normalised."""

from __future__ import annotations

import math

import torch


def xywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """boxes (Tensor[..., 4]) in (xc, yc, w, h) → (x1, y1, x2, y2)."""
    xy, half = boxes[..., :2], boxes[..., 2:4] / 2
    return torch.cat((xy - half, xy + half), dim=-1)


def clip_boxes(boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Clip xyxy boxes (Tensor[N, 4]) to an image of the given size; returns a new tensor."""
    out = boxes.clone()
    out[..., 0::2] = out[..., 0::2].clamp(0, width)
    out[..., 1::2] = out[..., 1::2].clamp(0, height)
    return out


def scale_boxes(
    boxes: torch.Tensor,
    input_hw: tuple[int, int],
    original_hw: tuple[int, int],
    ratio_pad: tuple[tuple[float, float], tuple[float, float]] | None = None,
) -> torch.Tensor:
    """Map xyxy boxes (Tensor[N, 4]) from a letterboxed network input of size `input_hw` back to the
    original image of size `original_hw`, clipped to it.

    `ratio_pad` = ((ratio_h, ratio_w), (pad_w, pad_h)) as recorded by the letterbox; when None it is
    recomputed the way `letterbox(auto=False)` pads (one gain for both axes, padding split evenly).
    """
    if ratio_pad is None:
        gain = min(input_hw[0] / original_hw[0], input_hw[1] / original_hw[1])
        pad_w = (input_hw[1] - round(original_hw[1] * gain)) / 2
        pad_h = (input_hw[0] - round(original_hw[0] * gain)) / 2
        gain_h = gain_w = gain
    else:
        (gain_h, gain_w), (pad_w, pad_h) = ratio_pad
    out = boxes[..., :4].clone()
    out[..., 0::2] = (out[..., 0::2] - pad_w) / gain_w
    out[..., 1::2] = (out[..., 1::2] - pad_h) / gain_h
    return clip_boxes(out, original_hw[0], original_hw[1])


def complete_iou(pred: torch.Tensor, target: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Complete IoU (Zheng et al., 2020) of paired boxes pred, target (Tensor[N, 4]) in (xc, yc, w, h)
    → Tensor[N]: IoU - centre distance² / enclosing diagonal² - alpha * v, where v measures the
    aspect-ratio mismatch and alpha = v / (1 - IoU + v) is treated as a constant.

    torchvision's `complete_box_iou_loss` computes the same on xyxy boxes but divides w / h with no
    epsilon, so a predicted box whose side underflows to 0 gives NaN loss and gradients; `eps` here
    keeps every term finite for degenerate boxes.
    """
    (px, py, pw, ph), (tx, ty, tw, th) = pred.unbind(-1), target.unbind(-1)
    left, right = torch.max(px - pw / 2, tx - tw / 2), torch.min(px + pw / 2, tx + tw / 2)
    top, bottom = torch.max(py - ph / 2, ty - th / 2), torch.min(py + ph / 2, ty + th / 2)
    inter = (right - left).clamp(min=0) * (bottom - top).clamp(min=0)
    iou = inter / (pw * ph + tw * th - inter + eps)
    enclose_w = torch.max(px + pw / 2, tx + tw / 2) - torch.min(px - pw / 2, tx - tw / 2)
    enclose_h = torch.max(py + ph / 2, ty + th / 2) - torch.min(py - ph / 2, ty - th / 2)
    diagonal2 = enclose_w**2 + enclose_h**2 + eps
    centre2 = (px - tx) ** 2 + (py - ty) ** 2
    v = (4 / math.pi**2) * (torch.atan(tw / (th + eps)) - torch.atan(pw / (ph + eps))) ** 2
    with torch.no_grad():
        alpha = v / (v - iou + 1 + eps)
    return iou - centre2 / diagonal2 - alpha * v
