"""Pure box arithmetic on tensors. Formats: xywh = (xc, yc, w, h); xyxy = (x1, y1, x2, y2); pixels unless
a name says normalised."""

from __future__ import annotations

import torch


def xywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """boxes (Tensor[..., 4]) in (xc, yc, w, h) → (x1, y1, x2, y2)."""
    xy, half = boxes[..., :2], boxes[..., 2:4] / 2
    return torch.cat((xy - half, xy + half), dim=-1)


def xyxy_to_xywh(boxes: torch.Tensor) -> torch.Tensor:
    """boxes (Tensor[..., 4]) in (x1, y1, x2, y2) → (xc, yc, w, h)."""
    return torch.cat(((boxes[..., :2] + boxes[..., 2:4]) / 2, boxes[..., 2:4] - boxes[..., :2]), dim=-1)


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
