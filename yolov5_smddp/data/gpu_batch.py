"""The device side of `--loader gpu`: a batch of `SamplePlan`s (data.bytes_dataset) → the uint8 image batch.

Per batch, on the device (`GpuBatcher.assemble`):
1. decode: every distinct JPEG of the batch in ONE `torchvision.io.decode_jpeg(list, device=...)` call
   (nvJPEG on CUDA; libjpeg on the CPU device), its bytes staged in one pinned host buffer (CUDA only)
   of bounded size (`max_staging_bytes`; a batch with more bytes is decoded in several calls). A file
   the batched call refuses is retried alone, then decoded on the CPU with OpenCV exactly as the CPU
   path decodes it (counted; logged once per process). A file OpenCV cannot decode either is corrupt:
   "skipped: <path>: <why>" once per file, its tile stays grey (114) and its boxes are dropped, and the
   dataset's `undecodable_samples` counts it (the loader's end-of-pass line reports it).
2. resize: the CPU path decodes a JPEG at least twice the target at reduced DCT scale (1/2, 1/4, 1/8)
   and resizes bilinearly; here the full decode is averaged over f x f blocks (`avg_pool2d`, partial
   blocks at the edge as libjpeg's ceil sizes) and resized bilinearly (`interpolate`, half-pixel centres,
   as cv2.INTER_LINEAR). Worker-decoded tiles (PNG, grey, CMYK, EXIF-rotated, cached) arrive resized.
3. mosaic/letterbox: tiles pasted on a canvas of 114 at the CPU path's rectangles (`tile_placement`).
4. warp: one sampling grid per output image from the inverse of the SAME 3x3 matrix the CPU path draws
   (`grid_sample`, bilinear, pixel centres at integers as cv2.warpAffine/warpPerspective, outside = 114).
5. MixUp (when drawn), then HSV and flips: `data.color.apply_color` (OpenCV's 8-bit arithmetic).

Pixels against the CPU path (cv2), measured on the CPU device (tests/unit/test_data_gpu_batch.py asserts
these bounds with a margin; docs/PERFORMANCE.md "GPU data path"):
- decode (libjpeg on the CPU device): identical. nvJPEG's IDCT/upsampling may differ by a few levels:
  measured by bench/gpu_all.sh (its GPU loader phase).
- resize at stored size / at 2x (DCT scale vs block average): see `PIXEL_BOUNDS`.
- warp: cv2 quantises coordinates to 1/32 px and weights to 1/1024, grid_sample does not: see
  `PIXEL_BOUNDS`.
- HSV: `apply_color` is exact given the same input pixels.

The batch that comes out is what the training step takes today: uint8 [B, 3, H, W] RGB (HSV and flips
applied, so the colour slot of the batch is None), on the device.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from dataclasses import dataclass, field

import cv2
import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
import torchvision
from torchvision.io import ImageReadMode, decode_jpeg

from yolov5_smddp.data.augment import PAD_VALUE
from yolov5_smddp.data.bytes_dataset import ImagePlan, SamplePlan, TileSource
from yolov5_smddp.data.color import apply_color
from yolov5_smddp.data.decode import ImageProblem
from yolov5_smddp.data.device_streams import DecodeStreams

log = logging.getLogger(__name__)

DEFAULT_STAGING_BYTES = 64 << 20
"""Pinned host bytes for one decode call's files (a 640 px COCO JPEG is ~160 KB: ~400 files)."""
DEFAULT_CHUNK = 8
"""Output images warped at once: bounds the float canvas (3 x 2s x 2s x 4 bytes each, 19.7 MB at 640)."""
BATCHED_DECODE = tuple(int(v) for v in re.findall(r"\d+", torchvision.__version__)[:2]) >= (0, 19)
"""torchvision 0.19 and newer decode a list of JPEGs in one call (older: one call per file)."""
_RESIZE_CHUNK = 32  # decoded images resized at once (float temporaries: 4 bytes a decoded pixel each)
_REDUCED = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}

PIXEL_BOUNDS = {
    # stage: (mean, max) absolute difference to the cv2 path, measured on the CPU device
    "decode": (0.0, 0),  # libjpeg both sides: identical
    "resize": (0.13, 1),  # bilinear, 640 px long side from 333 x 500 (photo-like)
    "resize_reduced": (0.84, 13),  # 1280 x 960 -> 640: block average vs DCT scale 1/2, then bilinear
    "warp_photo": (0.13, 1),  # photo-like 1280^2 canvas, affine or perspective
    "warp_noise": (0.84, 7),  # uniform noise canvas (worst case for the 1/32 px coordinate grid)
    "hsv": (0.0, 0),  # apply_color is OpenCV's arithmetic
}
"""Measured bounds per stage on the CPU device (tests assert them, with a margin)."""


@dataclass
class GpuBatchStats:
    """What the GPU data path did, for logs and the bench."""

    batches: int = 0
    images: int = 0
    device_decoded: int = 0
    """files decoded by the batched device call."""
    worker_pixels: int = 0
    """tiles decoded on the CPU in the workers (not device JPEGs, or cached)."""
    fallback_decodes: int = 0
    """files the device refused, decoded on the CPU here."""
    corrupt: int = 0
    staging_bytes: int = 0
    """pinned host staging buffer held (0 off CUDA)."""
    peak_batch_bytes: int = 0
    """the most encoded bytes one batch brought."""
    peak_decoded_bytes: int = 0
    """the most device bytes of full-size decodes alive at once (one decode call's outputs)."""
    canvas_bytes: int = 0
    """float canvas of one warp chunk."""
    stage_seconds: dict[str, float] = field(default_factory=dict)


class _Staging:
    """One reusable host buffer (pinned on CUDA) for a call's files or pixels: at most `limit` bytes, or
    the one item of a call when that alone is larger (callers split their items into calls by `limit`)."""

    def __init__(self, device: torch.device, limit: int) -> None:
        self.pinned = device.type == "cuda"
        self.limit = int(limit)
        self.buffer: torch.Tensor | None = None
        self.done: torch.cuda.Event | None = None  # the last upload from it (reused only after)

    def views(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        total = sum(a.nbytes for a in arrays)
        if self.done is not None:
            self.done.synchronize()  # one wait per call, for the previous call's copies
            self.done = None
        if self.buffer is None or self.buffer.numel() < total:  # grows by doubling, up to the limit
            held = 0 if self.buffer is None else self.buffer.numel()
            size = max(total, min(self.limit, max(2 * held, 1 << 20)))
            self.buffer = torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned)
        out, pos = [], 0
        host = self.buffer.numpy()
        for a in arrays:
            host[pos : pos + a.nbytes] = a.reshape(-1).view(np.uint8)
            out.append(self.buffer[pos : pos + a.nbytes])
            pos += a.nbytes
        return out

    def mark_used(self) -> None:
        if self.pinned:
            self.done = torch.cuda.Event()
            self.done.record()


def _split_by_bytes(order: list[int], sizes: dict[int, int], limit: int):
    """`order` cut into consecutive groups of at most `limit` bytes (a larger item alone)."""
    group, size = [], 0
    for idx in order:
        if group and size + sizes[idx] > limit:
            yield group
            group, size = [], 0
        group.append(idx)
        size += sizes[idx]
    if group:
        yield group


def resize_like_cpu(rgb: torch.Tensor, reduce: int, hw: tuple[int, int]) -> torch.Tensor:
    """uint8 [3, H, W] or [n, 3, H, W] (full decodes) → uint8 [(n,) 3, h, w]: the DCT scale 1/reduce as
    a block average, then bilinear (half-pixel centres) to hw, rounded."""
    x = rgb if rgb.dim() == 4 else rgb[None]
    if reduce > 1:
        x = F.avg_pool2d(x.float(), reduce, reduce, ceil_mode=True)
        x = x.round_().clamp_(0, 255).to(torch.uint8)  # libjpeg's scaled output is 8-bit
    if tuple(x.shape[2:]) != tuple(hw):
        x = F.interpolate(x.float(), size=hw, mode="bilinear", align_corners=False)
        x = x.round_().clamp_(0, 255).to(torch.uint8)
    return x if rgb.dim() == 4 else x[0]


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small host array on `device` without a host sync: through pinned memory, non-blocking, on CUDA
    (a copy from pageable memory waits for the stream)."""
    host = torch.from_numpy(np.ascontiguousarray(array))
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def warp_batch(
    canvas: torch.Tensor,
    matrices: np.ndarray | torch.Tensor,
    out_hw: tuple[int, int],
    *,
    inverse: bool = False,
) -> torch.Tensor:
    """uint8 [n, 3, Hc, Wc] canvases + float64 [n, 3, 3] (canvas pixels → output pixels; with `inverse`
    already inverted and on the device) → uint8 [n, 3, H, W]: out(x, y) = canvas(M^-1 (x, y)), bilinear,
    114 outside (cv2's warp with BORDER_CONSTANT)."""
    n, _, hc, wc = canvas.shape
    h, w = out_hw
    dev = canvas.device
    inv = matrices if inverse else to_device(np.linalg.inv(matrices), dev)  # [n, 3, 3] float64
    ys, xs = torch.meshgrid(
        torch.arange(h, dtype=torch.float64, device=dev),
        torch.arange(w, dtype=torch.float64, device=dev),
        indexing="ij",
    )
    pts = torch.stack([xs.reshape(-1), ys.reshape(-1), torch.ones(h * w, dtype=torch.float64, device=dev)])
    src = inv @ pts  # [n, 3, h*w]
    sx, sy = src[:, 0] / src[:, 2], src[:, 1] / src[:, 2]
    grid = torch.stack([sx * (2.0 / max(wc - 1, 1)) - 1.0, sy * (2.0 / max(hc - 1, 1)) - 1.0], dim=-1)
    grid = grid.reshape(n, h, w, 2).float()
    shifted = canvas.float().sub_(PAD_VALUE)
    out = F.grid_sample(shifted, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
    return out.add_(PAD_VALUE).round_().clamp_(0, 255).to(torch.uint8)


class GpuBatcher:
    """Turns collated plans into image batches on `device` (see the module docstring)."""

    def __init__(
        self,
        device: torch.device | str,
        *,
        max_staging_bytes: int = DEFAULT_STAGING_BYTES,
        chunk: int = DEFAULT_CHUNK,
        counter=None,
    ) -> None:
        self.device = torch.device(device)
        self.staging = _Staging(self.device, max_staging_bytes)
        self.pinned = self.device.type == "cuda"
        self.pixel_staging = _Staging(self.device, max_staging_bytes)  # worker-decoded tiles (cached, PNG...)
        self.chunk = max(int(chunk), 1)
        self.counter = counter  # the dataset's shared undecodable_samples, or None
        self.streams = DecodeStreams(self.device)  # the decode ordered against the queued training step
        self.stats = GpuBatchStats()
        self.bad: dict[int, str] = {}  # dataset index -> why it cannot be decoded (this process)
        self._fallback_logged = False

    # -- stage 1 and 2: every distinct source image of the batch, decoded and resized
    def _decode_all(self, tiles: list[TileSource]) -> dict[tuple[int, tuple[int, int]], torch.Tensor]:
        """(index, scaled_hw) → BGR uint8 [3, h, w] on the device; failed indices go to self.bad."""
        jpegs: dict[int, TileSource] = {}
        pixels: dict[int, TileSource] = {}
        for t in tiles:
            if t.index in self.bad:
                continue
            (jpegs if t.data is not None else pixels)[t.index] = t
        resized = self._upload_all(pixels)
        self.stats.worker_pixels += len(pixels)
        order = list(jpegs)
        self.stats.peak_batch_bytes = max(
            self.stats.peak_batch_bytes, sum(jpegs[i].data.nbytes for i in order)
        )
        sizes = {i: jpegs[i].data.nbytes for i in order}
        for group in _split_by_bytes(order, sizes, self.staging.limit):
            decoded = self._decode_group([jpegs[i] for i in group])
            held = sum(rgb.numel() for rgb in decoded if rgb is not None)
            self.stats.peak_decoded_bytes = max(self.stats.peak_decoded_bytes, held)
            same_size: dict[tuple, list[tuple[int, torch.Tensor]]] = {}  # resized together
            for idx, rgb in zip(group, decoded):
                t = jpegs[idx]
                if rgb is None:
                    bgr = self._cpu_fallback(t)
                    if bgr is not None:
                        resized[idx] = bgr
                    continue
                self.stats.device_decoded += 1
                same_size.setdefault((tuple(rgb.shape), t.reduce, t.resized_hw), []).append((idx, rgb))
            del decoded  # the full-size decodes live for one group (<= max_staging_bytes of JPEG) at most
            for (_, reduce, hw), members in same_size.items():
                for start in range(0, len(members), _RESIZE_CHUNK):  # bounds the float temporaries
                    part = members[start : start + _RESIZE_CHUNK]
                    stacked = torch.stack([rgb for _, rgb in part])
                    for (idx, _), img in zip(part, resize_like_cpu(stacked, reduce, hw).flip(1)):
                        resized[idx] = img
        out = {}
        for t in tiles:
            img = resized.get(t.index)
            if img is None:
                continue
            key = (t.index, t.scaled_hw)
            if key not in out:
                out[key] = (
                    resize_like_cpu(img, 1, t.scaled_hw) if tuple(img.shape[1:]) != t.scaled_hw else img
                )
        return out

    def _decode_group(self, tiles: list[TileSource]) -> list[torch.Tensor | None]:
        """One batched decode; on refusal each file alone; None for a file the device does not take."""
        views = self.staging.views([t.data for t in tiles])
        self.stats.staging_bytes = self._pinned_bytes()
        out = self.streams.run(lambda: self._decode_views(views))  # a side stream (data.device_streams)
        self.staging.mark_used()
        return out

    def _decode_views(self, views: list[torch.Tensor]) -> list[torch.Tensor | None]:
        try:
            if not BATCHED_DECODE:
                raise RuntimeError("this torchvision decodes one file per call")
            return list(decode_jpeg(views, mode=ImageReadMode.RGB, device=self.device))
        except RuntimeError:
            out = []
            for v in views:
                try:
                    out.append(decode_jpeg(v, mode=ImageReadMode.RGB, device=self.device))
                except RuntimeError:
                    out.append(None)
            return out

    def _pinned_bytes(self) -> int:
        held = [
            b.buffer.numel() for b in (self.staging, self.pixel_staging) if b.pinned and b.buffer is not None
        ]
        return sum(held)

    def _cpu_fallback(self, t: TileSource) -> torch.Tensor | None:
        """The CPU path's decode of a file the device refused (its pixels exactly); None when corrupt."""
        self.stats.fallback_decodes += 1
        if not self._fallback_logged:
            log.info("GPU data path: %s: the device decoder refused it; decoded on the CPU (counted)", t.path)
            self._fallback_logged = True
        flag = _REDUCED.get(t.reduce, cv2.IMREAD_COLOR)
        try:
            img = cv2.imdecode(t.data, flag)
            if img is None:
                raise ImageProblem("unreadable image (OpenCV cannot decode it)")
        except (cv2.error, MemoryError, ImageProblem) as exc:
            reason = str(exc) if isinstance(exc, ImageProblem) else f"decoder error: {exc}"
            self._corrupt(t, f"{reason} (it passed the label scan)")
            return None
        h, w = t.resized_hw
        if img.shape[:2] != (h, w):
            img = cv2.resize(img, (w, h), interpolation=cv2.INTER_LINEAR)
        return self._upload(img)

    def _corrupt(self, t: TileSource, reason: str) -> None:
        self.bad[t.index] = reason
        self.stats.corrupt += 1
        log.warning("skipped: %s: %s; its mosaic tile is left grey and its boxes dropped", t.path, reason)

    def _upload(self, bgr_hwc: np.ndarray) -> torch.Tensor:
        """One CPU-decoded image (a fallback) → uint8 [3, h, w] on the device."""
        return to_device(bgr_hwc, self.device).permute(2, 0, 1)

    def _upload_all(self, pixels: dict[int, TileSource]) -> dict[int, torch.Tensor]:
        """The worker-decoded tiles → uint8 [3, h, w] each on the device, through the (pinned on CUDA)
        pixel staging buffer: one copy per `max_staging_bytes` of pixels."""
        if not pixels:
            return {}
        out: dict[int, torch.Tensor] = {}
        items = list(pixels.items())
        sizes = {i: t.pixels.nbytes for i, t in items}
        for group in _split_by_bytes([i for i, _ in items], sizes, self.pixel_staging.limit):
            arrays = [np.ascontiguousarray(pixels[i].pixels) for i in group]
            self.pixel_staging.views(arrays)
            used = sum(a.nbytes for a in arrays)
            staged = self.pixel_staging.buffer[:used]
            device_bytes = staged.to(self.device, non_blocking=True) if self.pinned else staged.clone()
            self.pixel_staging.mark_used()
            pos = 0
            for i, a in zip(group, arrays):
                out[i] = device_bytes[pos : pos + a.nbytes].view(a.shape).permute(2, 0, 1)
                pos += a.nbytes
        self.stats.staging_bytes = self._pinned_bytes()
        return out

    # -- stages 3 and 4: canvases and warps
    def _images(self, plans: list[ImagePlan], decoded) -> torch.Tensor:
        out_h, out_w = plans[0].out_hw
        out = torch.empty((len(plans), 3, out_h, out_w), dtype=torch.uint8, device=self.device)
        groups: dict[tuple, list[int]] = {}
        for b, p in enumerate(plans):
            groups.setdefault((p.canvas_hw, p.matrix is None), []).append(b)
        warped = [b for b, p in enumerate(plans) if p.matrix is not None]
        inverses = None
        if warped:  # every inverse of the batch in one upload (no host sync)
            inverses = to_device(np.linalg.inv(np.stack([plans[b].matrix for b in warped])), self.device)
        row_of = {b: k for k, b in enumerate(warped)}
        for (canvas_hw, plain), members in groups.items():
            for start in range(0, len(members), self.chunk):
                part = members[start : start + self.chunk]
                canvas = torch.full(
                    (len(part), 3, *canvas_hw), PAD_VALUE, dtype=torch.uint8, device=self.device
                )
                for c, b in enumerate(part):
                    for t in plans[b].tiles:
                        self._paste(canvas[c], t, decoded.get((t.index, t.scaled_hw)))
                if not plain:
                    self.stats.canvas_bytes = max(self.stats.canvas_bytes, canvas.numel() * 4)
                    rows = [row_of[b] for b in part]
                    inv = inverses[rows[0] : rows[-1] + 1]  # members of a group are in batch order
                    if len(inv) != len(part):
                        inv = torch.stack([inverses[r] for r in rows])
                    canvas = warp_batch(canvas, inv, (out_h, out_w), inverse=True)
                for c, b in enumerate(part):  # plain indexing: a list index would upload (and sync)
                    out[b] = canvas[c]
        return out

    @staticmethod
    def _paste(canvas: torch.Tensor, t: TileSource, img: torch.Tensor | None) -> None:
        x0, y0, x1, y1 = t.dst
        if img is None or x1 <= x0 or y1 <= y0:
            return  # an undecodable tile stays grey
        sx, sy = t.src_xy
        canvas[:, y0:y1, x0:x1] = img[:, sy : sy + (y1 - y0), sx : sx + (x1 - x0)]

    def assemble(self, batch, timed: bool = False):
        """A collated plan batch (`collate_plans`) → (imgs uint8 [B, 3, H, W] RGB on the device, targets,
        paths, shapes, None). `timed`: synchronise after each stage and add its seconds to
        stats.stage_seconds (the bench; never in training)."""
        samples, targets, owners, paths, shapes, colors, blob = batch
        samples = attach_plans(samples, blob)
        clock = _StageClock(self.device, self.stats.stage_seconds if timed else None)
        tiles = [t for s in samples for p in (s.first, s.second) if p is not None for t in p.tiles]
        decoded = self._decode_all(tiles)
        clock.lap("decode")
        imgs = self._images([s.first for s in samples], decoded)
        mixed = [b for b, s in enumerate(samples) if s.second is not None]
        if mixed:
            second = self._images([samples[b].second for b in mixed], decoded)
            r = to_device(np.array([samples[b].mix_r for b in mixed], np.float32), self.device)
            for k, b in enumerate(mixed):
                imgs[b] = (imgs[b].float() * r[k] + second[k].float() * (1 - r[k])).to(torch.uint8)
        clock.lap("mosaic_warp")
        if self.device.type == "cuda":
            colors = colors.pin_memory()
        imgs = apply_color(imgs, colors)
        clock.lap("hsv_flip")
        targets = self._without_bad_tiles(samples, targets, owners)
        self.stats.batches += 1
        self.stats.images += len(samples)
        return imgs, targets, paths, shapes, None

    def _without_bad_tiles(self, samples: list[SamplePlan], targets: torch.Tensor, owners: np.ndarray):
        """Targets less the boxes of tiles whose file could not be decoded (counted once per sample)."""
        if not self.bad or not len(targets):
            return targets
        keep = np.ones(len(targets), bool)
        for row, (b, owner) in enumerate(zip(targets[:, 0].long().tolist(), owners.tolist())):
            s = samples[b]
            plan, k = (s.first, owner) if owner < 4 else (s.second, owner - 4)
            keep[row] = plan.tiles[k].index not in self.bad
        hit = [
            b
            for b, s in enumerate(samples)
            if any(t.index in self.bad for p in (s.first, s.second) if p is not None for t in p.tiles)
        ]
        if hit and self.counter is not None:
            with self.counter.get_lock():
                self.counter.value += len(hit)
        return targets[torch.from_numpy(keep)]


class _StageClock:
    def __init__(self, device: torch.device, into: dict[str, float] | None) -> None:
        self.device, self.into = device, into
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.into is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.into[name] = self.into.get(name, 0.0) + now - self.last
        self.last = now


def describe(stats: GpuBatchStats) -> str:
    """One line on what the GPU data path did and the buffers it holds."""
    return (
        f"GPU data path: {stats.images} samples in {stats.batches} batches; {stats.device_decoded} files "
        f"decoded on the device, {stats.worker_pixels} images decoded in the workers (not device JPEGs, or "
        f"cached), {stats.fallback_decodes} refused by the device and decoded on the CPU, {stats.corrupt} "
        f"corrupt; pinned staging {stats.staging_bytes / 2**20:.1f} MiB, warp canvas "
        f"{stats.canvas_bytes / 2**20:.1f} MiB, decode outputs up to {stats.peak_decoded_bytes / 2**20:.1f} MiB, "
        f"largest batch of JPEG bytes {stats.peak_batch_bytes / 2**20:.1f} MiB"
    )


def collate_plans(items: list[tuple]):
    """BytesDataset items → (plans, targets float32 [n, 6] (image index, cls, xywhn), owners int64 [n]
    (the tile of each box), paths, shapes, colour float64 [B, 6], blob uint8 [m]).

    Runs in the loader worker: every distinct file's bytes and every worker-decoded image of the batch
    are copied into ONE tensor (`blob`, which the DataLoader hands over in shared memory, one buffer a
    batch instead of a pickled array per tile); the tiles then carry their `span` in it."""
    samples, labels, paths, shapes, colors, owners = zip(*items)
    for i, lb in enumerate(labels):
        lb[:, 0] = i
    targets = torch.from_numpy(np.concatenate(labels)) if labels else torch.zeros((0, 6))
    spans: dict[tuple[str, int], tuple[str, int, int]] = {}
    parts: list[np.ndarray] = []
    pos = 0

    def detach(t: TileSource) -> TileSource:
        nonlocal pos
        kind, array = ("jpeg", t.data) if t.data is not None else ("pixels", t.pixels)
        key = (kind, t.index)
        if key not in spans:
            flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            spans[key] = (kind, pos, flat.nbytes)
            parts.append(flat)
            pos += flat.nbytes
        return dataclasses.replace(t, data=None, pixels=None, span=spans[key])

    def detach_plan(p: ImagePlan | None) -> ImagePlan | None:
        return None if p is None else dataclasses.replace(p, tiles=tuple(detach(t) for t in p.tiles))

    plans = [
        dataclasses.replace(s, first=detach_plan(s.first), second=detach_plan(s.second)) for s in samples
    ]
    blob = torch.from_numpy(np.concatenate(parts)) if parts else torch.zeros(0, dtype=torch.uint8)
    return plans, targets, np.concatenate(owners), paths, shapes, torch.from_numpy(np.stack(colors)), blob


def attach_plans(samples: list[SamplePlan], blob: torch.Tensor) -> list[SamplePlan]:
    """The inverse of the worker's detach: each tile's `data` or `pixels` a view into `blob` (no copy)."""
    host = blob.numpy()

    def attach(t: TileSource) -> TileSource:
        if t.span is None:
            return t
        kind, start, n = t.span
        view = host[start : start + n]
        if kind == "jpeg":
            return dataclasses.replace(t, data=view, span=None)
        return dataclasses.replace(t, pixels=view.reshape(*t.resized_hw, 3), span=None)

    def attach_plan(p: ImagePlan | None) -> ImagePlan | None:
        return None if p is None else dataclasses.replace(p, tiles=tuple(attach(t) for t in p.tiles))

    return [dataclasses.replace(s, first=attach_plan(s.first), second=attach_plan(s.second)) for s in samples]


class GpuLoader:
    """A training loader over a BytesDataset (built by `loader.build_dataloader`) whose batches are
    assembled on the device: the same batches the training step takes from the CPU loader (uint8 RGB,
    colour None), already on the device. Everything else (sampler, len, dataset) is the inner loader's."""

    def __init__(self, loader, device: torch.device | str | None = None, **batcher_kwargs) -> None:
        loader.collate_fn = collate_plans
        self._loader = loader
        self._device = device
        self._batcher_kwargs = batcher_kwargs
        self.batcher: GpuBatcher | None = None
        self._reported = False
        self.host_wait_s = 0.0
        """seconds blocked on the CPU workers (the host), summed over every batch."""
        self._issue_s = 0.0  # seconds issuing the device decode/augment since `pop_issue_seconds`

    def _ensure_batcher(self) -> GpuBatcher:
        if self.batcher is None:
            device = self._device
            if device is None:
                device = (
                    torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
                )
            counter = getattr(self._loader.dataset, "undecodable_samples", None)
            self.batcher = GpuBatcher(device, counter=counter, **self._batcher_kwargs)
        return self.batcher

    def __iter__(self):
        batcher = self._ensure_batcher()
        inner = iter(self._loader)
        while True:
            began = time.perf_counter()
            try:
                batch = next(inner)
            except StopIteration:
                break
            fetched = time.perf_counter()
            self.host_wait_s += fetched - began
            out = batcher.assemble(batch)
            self._issue_s += time.perf_counter() - fetched
            yield out
        if not self._reported:  # after the first pass, once
            self._reported = True
            log.info("rank %d: %s", getattr(self._loader, "rank", 0), describe(batcher.stats))

    def pop_issue_seconds(self) -> float:
        """Host seconds spent issuing the device decode and augmentation since the last call: device work,
        not waiting for data. The training loop takes them out of its data_wait, so "busy" is the share of
        the time the step is not waiting on the host (the workers)."""
        issued, self._issue_s = self._issue_s, 0.0
        return issued

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


def wrap_loader(loader, device: torch.device | str | None = None) -> GpuLoader:
    """The trainer's one call: the BytesDataset loader `loader`, its batches assembled on `device`
    (default: the current CUDA device, else the CPU)."""
    return GpuLoader(loader, device)
