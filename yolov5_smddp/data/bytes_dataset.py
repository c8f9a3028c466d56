"""The worker side of `--loader gpu`: items that carry a JPEG's BYTES and the geometry, not pixels.

`BytesDataset` is a `YoloDataset` whose items are `SamplePlan`s instead of images: the loader workers
read the files (one read each), pick the mosaic partners and draw every random number exactly as the
CPU path does, in the same order (the same `mosaic_plan`, `draw_mosaic_geometry`, `random_affine_matrix`,
`draw_color_params` calls on the same generator), and compute the labels with the CPU path's functions
(`tile_placement`, `transform_boxes`, `box_candidates`, `xywhn_to_xyxy`, `xyxy_to_xywhn`, `flip_labels`):
the boxes are the CPU path's, bit for bit (tests/unit/test_data_gpu_batch.py). The device then decodes
the JPEGs of a batch in one call and builds the images (`data.gpu_batch`).

Which files the device decodes (`device_decodable`): sequential (baseline or extended) Huffman JPEGs with
three components and no EXIF rotation, which nvJPEG's batched (hardware on A100/H100) decoder takes.
Everything else the CPU path accepts — progressive, grey, CMYK or EXIF-rotated JPEGs, PNG, BMP, TIFF,
WebP — is decoded here, in the worker, by the CPU path's own
`load_image` (the same pixels, the same "skipped:" handling of a file that cannot be decoded), and rides
along as pixels; so are images of the RAM or disk cache.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import cv2
import numpy as np

from yolov5_smddp.data.augment import (
    box_candidates,
    draw_color_params,
    draw_mosaic_geometry,
    flip_labels,
    random_affine_matrix,
    tile_placement,
    transform_boxes,
    xywhn_to_xyxy,
    xyxy_to_xywhn,
)
from yolov5_smddp.data.dataset import YoloDataset
from yolov5_smddp.data.decode import ImageProblem, read_bytes
from yolov5_smddp.data.imageinfo import _exif_orientation
from yolov5_smddp.errors import DataError

_DEVICE_SOF = {0xC0, 0xC1}  # baseline and extended sequential Huffman
# (progressive JPEGs go to the workers: torchvision hands them to nvJPEG's host-side decoder one file at a
# time, in the training process, where the workers decode them in parallel)
_HEADER_LIMIT = 256 * 1024  # bytes searched for the frame header
_DCT_SCALE = {cv2.IMREAD_REDUCED_COLOR_2: 2, cv2.IMREAD_REDUCED_COLOR_4: 4, cv2.IMREAD_REDUCED_COLOR_8: 8}


def device_decodable(data: bytes | memoryview) -> bool:
    """Whether the batched device decode takes this file and gives the CPU path's image: a JPEG with a
    sequential Huffman frame of three components and no EXIF orientation other than 1 (OpenCV rotates by it; the
    device decode does not). False for anything else (decoded on the CPU instead)."""
    head = bytes(data[:_HEADER_LIMIT])
    if head[:2] != b"\xff\xd8":
        return False
    pos, orientation = 2, 1
    while pos + 4 <= len(head):
        if head[pos] != 0xFF:
            return False
        marker = head[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            pos += 2
            continue
        (length,) = struct.unpack(">H", head[pos + 2 : pos + 4])
        if marker == 0xE1 and orientation == 1:
            orientation = _exif_orientation(head[pos + 4 : pos + 2 + length])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a frame header
            if pos + 10 > len(head):
                return False
            return marker in _DEVICE_SOF and head[pos + 9] == 3 and orientation == 1
        if marker == 0xDA:
            return False
        pos += 2 + length
    return False


@dataclass(frozen=True)
class TileSource:
    """One source image of an output image and where it goes.

    Exactly one of `data` (the file's bytes, decoded on the device) and `pixels` (BGR uint8 [h, w, 3],
    already decoded and resized on the CPU) is set, or, between the worker and the batch, `span`."""

    index: int
    """Dataset index of the image (remembered when its decode fails)."""
    path: str
    data: np.ndarray | None
    """uint8 [n]: the JPEG file, or None."""
    pixels: np.ndarray | None
    """BGR uint8 [h, w, 3] of `resized_hw`, or None."""
    reduce: int
    """1, 2, 4 or 8: the DCT scale the CPU path decodes this JPEG at (`YoloDataset.decode_flag`)."""
    resized_hw: tuple[int, int]
    """(h, w) after the first resize (long side img_size): what the CPU path's `load_image` returns."""
    scaled_hw: tuple[int, int]
    """(h, w) after the letterbox's resize (= resized_hw in a mosaic)."""
    src_xy: tuple[int, int]
    """(x, y) of the first tile pixel pasted (in the scaled image)."""
    dst: tuple[int, int, int, int]
    """(x0, y0, x1, y1): the canvas rectangle it fills (may be empty)."""
    span: tuple[str, int, int] | None = None
    """In a collated batch (`gpu_batch.collate_plans`): ("jpeg" or "pixels", offset, bytes) of `data` or
    `pixels` in the batch's one shared buffer, which then replaces them (None here)."""


@dataclass(frozen=True)
class ImagePlan:
    """One output image: its tiles pasted on a canvas of grey 114, then warped by `matrix` (None: the
    canvas is the output)."""

    canvas_hw: tuple[int, int]
    tiles: tuple[TileSource, ...]
    matrix: np.ndarray | None
    """float64 [3, 3]: canvas pixels -> output pixels, or None."""
    out_hw: tuple[int, int]


@dataclass(frozen=True)
class SamplePlan:
    """A training sample: an image plan, and for MixUp a second one blended with weight `mix_r`."""

    first: ImagePlan
    second: ImagePlan | None = None
    mix_r: float = 1.0


def _boxes_through(
    labels: np.ndarray, tile_of: np.ndarray, m: np.ndarray, scale: float, out_wh: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """The CPU path's box transform (augment's `_apply_box_transform`: `transform_boxes` then
    `box_candidates`), also returning which tile each kept box came from."""
    new = transform_boxes(labels[:, 1:5], m, out_wh)
    keep = box_candidates(labels[:, 1:5] * scale, new)
    kept = np.concatenate([labels[keep, :1], new[keep]], axis=1).astype(np.float32)
    return kept, tile_of[keep]


class BytesDataset(YoloDataset):
    """A training `YoloDataset` whose items are (SamplePlan, targets [n, 6], path, shapes, colour [6],
    tile [n]): `tile` says which tile of the plan (0..3, 4..7 for the MixUp image) each box comes from,
    so the batch can drop the boxes of a tile whose file turns out undecodable. HSV and flips are always
    left to the batch (the labels are flipped here)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["color_on_device"] = True
        kwargs["region_decode"] = False  # the device decodes whole files
        kwargs["restart_cache"] = None
        super().__init__(*args, **kwargs)
        if not self.augment:
            raise DataError("the GPU data path (--loader gpu) is for training batches only")
        if self.mosaic_partners != "random":
            raise DataError(
                f"--loader gpu takes --mosaic-partners random only, got {self.mosaic_partners!r} (the "
                "recent-image pool is made of images decoded in the worker)"
            )

    def tile_source(self, j: int, scaled_hw: tuple[int, int], src_xy, dst) -> TileSource:
        """Image j as bytes for the device, or (cached, not a device JPEG, unreadable) as the CPU
        path's resized pixels. An image that cannot be read or decoded here raises UndecodableImage
        (logged by `load_image`), which `YoloDataset.__getitem__` handles as the CPU path does."""
        hw = self.resized_hw(j)
        common = dict(
            index=j, path=str(self.images[j]), resized_hw=hw, scaled_hw=scaled_hw, src_xy=src_xy, dst=dst
        )
        cached = j in self._ram or self.disk_cache is not None or j in self._undecodable
        if not cached:
            try:
                data = read_bytes(self.images[j])
            except ImageProblem:
                data = b""
            if data and device_decodable(data):
                reduce = _DCT_SCALE.get(self.decode_flag(j), 1)
                return TileSource(data=np.frombuffer(data, np.uint8), pixels=None, reduce=reduce, **common)
        return TileSource(data=None, pixels=self.load_image(j), reduce=1, **common)

    def _mosaic_plan_sample(self, i: int, first_tile: int) -> tuple[ImagePlan, np.ndarray, np.ndarray]:
        """The CPU path's `_mosaic_sample` without pixels: (plan, labels [n, 5] cls+xyxy px, tile [n])."""
        plan = self.mosaic_plan(i)
        g = draw_mosaic_geometry(self.img_size, self.params, self.rng)
        s = g.size
        tiles, all_labels, owners = [], [], []
        for k, j in enumerate(plan):
            hw = self.resized_hw(j)
            x1a, y1a, x2a, y2a, x1b, y1b = tile_placement(k, hw, g.centre, s)
            tiles.append(self.tile_source(j, hw, (x1b, y1b), (x1a, y1a, x2a, y2a)))
            shifted = xywhn_to_xyxy(self.labels[j], hw[1], hw[0])
            shifted[:, [1, 3]] += x1a - x1b
            shifted[:, [2, 4]] += y1a - y1b
            all_labels.append(shifted)
            owners.append(np.full(len(shifted), first_tile + k, np.int64))
        labels = np.concatenate(all_labels)
        labels[:, 1:] = labels[:, 1:].clip(0, 2 * s)
        labels, owner = _boxes_through(labels, np.concatenate(owners), g.matrix, g.scale, (s, s))
        image = ImagePlan(canvas_hw=(2 * s, 2 * s), tiles=tuple(tiles), matrix=g.matrix, out_hw=(s, s))
        return image, labels, owner

    def _letterbox_plan_sample(self, i: int):
        """The CPU path's letterbox + `random_perspective` without pixels (same draws, same boxes)."""
        h, w = self.resized_hw(i)
        h0, w0 = (int(v) for v in self.shapes[i])
        shape = self.batch_shapes[i // self.batch_size] if self.rect else (self.img_size, self.img_size)
        sh, sw = (int(v) for v in shape)
        gain = min(sh / h, sw / w)  # scaleup: training
        uw, uh = round(w * gain), round(h * gain)
        pad_w, pad_h = (sw - uw) / 2, (sh - uh) / 2
        top, bottom = round(pad_h - 0.1), round(pad_h + 0.1)
        left, right = round(pad_w - 0.1), round(pad_w + 0.1)
        out_h, out_w = uh + top + bottom, uw + left + right
        rw, rh = uw / w, uh / h
        labels = xywhn_to_xyxy(self.labels[i], rw * w, rh * h, pad_w, pad_h)
        shapes = ((h0, w0), ((rh * h / h0, rw * w / w0), (pad_w, pad_h)))
        tile = self.tile_source(i, (uh, uw), (0, 0), (left, top, left + uw, top + uh))
        m, scale = random_affine_matrix((out_w, out_h), (out_w, out_h), self.params, self.rng)
        matrix = None if np.allclose(m, np.eye(3)) else m
        labels, owner = _boxes_through(labels, np.zeros(len(labels), np.int64), m, scale, (out_w, out_h))
        plan = ImagePlan(canvas_hw=(out_h, out_w), tiles=(tile,), matrix=matrix, out_hw=(out_h, out_w))
        return plan, labels, owner, shapes

    def _item(self, i: int):
        """`YoloDataset._item` with a plan in place of the image: the same draws in the same order."""
        p = self.params
        use_mosaic = not self.rect and self.rng.random() < p.mosaic
        if use_mosaic:
            first, labels, owner = self._mosaic_plan_sample(i, 0)
            sample = SamplePlan(first)
            if self.rng.random() < p.mixup:
                second, labels2, owner2 = self._mosaic_plan_sample(self._uniform_indices(1)[0], 4)
                r = float(self.rng.beta(32.0, 32.0))
                sample = SamplePlan(first, second, r)
                labels, owner = np.concatenate([labels, labels2]), np.concatenate([owner, owner2])
            shapes = None
        else:
            first, labels, owner, shapes = self._letterbox_plan_sample(i)
            sample = SamplePlan(first)
        out_h, out_w = sample.first.out_hw
        labels = xyxy_to_xywhn(labels, out_w, out_h)
        color = draw_color_params(p, self.rng)
        labels = flip_labels(labels, bool(color[4]), bool(color[5]))
        targets = np.zeros((len(labels), 6), np.float32)
        targets[:, 1:] = labels
        return sample, targets, str(self.images[i]), shapes, color, owner
