"""YoloDataset: images and labels of a LabelIndex, augmented for training or letterboxed for validation.

Item → (img uint8 [3, H, W] RGB — a transposed view of an HWC array, see `loader.collate` —, labels
float32 [n, 6] (0, cls, xc, yc, w, h) normalised to the output image, image path, shapes, colour) with
shapes = ((h0, w0), ((gain_h, gain_w), (pad_w, pad_h))): the TOTAL scale from original pixels to
network-input pixels and the padding, as `boxes.scale_boxes(..., ratio_pad=shapes[1])` expects.
colour is None, except with `color_on_device` (training): then the HSV jitter and the image flips are
left to the device batch (`data.color.apply_color`), img is BGR and unflipped, the labels are already
flipped, and colour holds the sample's float64 [6] parameters (`augment.draw_color_params`).

Decoding is the cost that bounds a mosaic pipeline (four images per sample), so:
- mosaic sampling is the release's by default (`mosaic_partners="random"`): the item's image and three
  partners drawn uniformly (with replacement) from the whole dataset, in shuffled quadrant order; the
  four images are chosen before anything is decoded. With the RAM cache the partners are drawn from
  the images this rank cached (its shard: the whole dataset on one rank), so a sample decodes nothing;
- `mosaic_partners="recent"` (opt-in, a measured accuracy cost: see docs/ACCURACY.md) draws partners
  from a small pool of images this process decoded recently (`partner_pool`) with the item's image
  always top-left: one decode per sample instead of four, but fewer distinct images per batch (partners
  only from the ~32 images decoded last);
- JPEGs at least twice the target size are decoded at reduced scale (libjpeg DCT scaling);
- with the release's sampling and no cache, a tile's JPEG (at its stored size) is decoded only where the
  mosaic's warp reads it (`region_decode`, `data.jpeg_roi`: libjpeg-turbo's column cropping and scanline
  skipping; the centre and the affine are drawn before any decode): exactly the pixels of the whole
  decode (tests/unit/test_data_roi_mosaic.py), at ~0.6 of its cost for 640x480 tiles at 640;
- RAM cache ("ram"): decoded, resized images of the indices THIS RANK reads (`cache_shard`, called by
  `loader.build_dataloader` with the rank's fixed shard before the workers fork, so workers share the
  pages copy-on-write); under DDP each rank holds only its shard, so a node holds the dataset once.

Validation items of a COCO source also carry the image's crowd regions (`iscrowd: 1`) as label rows
with class -1 - cls; `engine.evaluate` separates them (they ignore the detections they cover) and
training items never have them.

An image that passed the label scan but cannot be decoded now (corrupt data after a valid header, a
file changed since the scan) never stops a job. It is logged once per file and process ("skipped:
<path>: <why>") and remembered; in training the item's deterministic substitute (`substitute`: the
next decodable index, within the same rectangular batch) takes its place, and when it was a mosaic
partner or a mixup image the sample is drawn again; in validation (augment=False) the item is a
`Skipped` marker that `loader.collate` leaves out, so the metrics cover one image fewer and the loader
says so. `undecodable_samples` counts these events over all worker processes.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

import cv2
import numpy as np

from yolov5_smddp.data.augment import (
    AugmentParams,
    AugmentSource,
    MosaicGeometry,
    apply_color_hwc,
    compose_mosaic,
    draw_color_params,
    draw_mosaic_geometry,
    flip_labels,
    mixup,
    random_perspective,
    tile_source_rect,
    xywhn_to_xyxy,
    xyxy_to_xywhn,
)
from yolov5_smddp.data.decode import ImageProblem, decode_image, read_bytes
from yolov5_smddp.data.index import LabelIndex
from yolov5_smddp.data.jpeg_roi import (
    decode_region,
    decode_region_restarts,
    region_decoder,
    transcode_with_restarts,
)
from yolov5_smddp.data.letterbox import letterbox
from yolov5_smddp.data.pixelcache import DiskPixelCache
from yolov5_smddp.data.restart_cache import RestartCache
from yolov5_smddp.errors import DataError

log = logging.getLogger(__name__)

CACHE_MODES = (None, "ram")
PARTNER_MODES = ("random", "recent")
_REDUCED_FLAGS = (
    (8, cv2.IMREAD_REDUCED_COLOR_8),
    (4, cv2.IMREAD_REDUCED_COLOR_4),
    (2, cv2.IMREAD_REDUCED_COLOR_2),
)
_MIN_POOL_FOR_PARTNERS = 4
_MAX_DRAWS = 64  # attempts at one training sample when its images keep failing to decode


class UndecodableImage(Exception):
    """Image `index` of the dataset cannot be decoded (`reason`); raised by `_decode_resized`."""

    def __init__(self, index: int, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.index, self.path, self.reason = index, path, reason


class Skipped(NamedTuple):
    """A validation item whose image cannot be decoded; `loader.collate` leaves it out of the batch."""

    path: str
    reason: str


def rect_batch_shapes(
    shapes_hw: np.ndarray, batch_size: int, img_size: int, stride: int, pad: float
) -> np.ndarray:
    """Per-batch network input (h, w) for rectangular batches; `shapes_hw` must be sorted by h / w.

    Each batch gets the shape of its most extreme aspect ratio: [maxi, 1] when all are landscape
    (h / w < 1), [1, 1 / mini] when all are portrait, else square; scaled by img_size and rounded up to
    a multiple of stride: ceil(shape * img_size / stride + pad) * stride. int [n_batches, 2].
    """
    aspect = shapes_hw[:, 0] / shapes_hw[:, 1]
    n_batches = math.ceil(len(aspect) / batch_size)
    shapes = np.ones((n_batches, 2))
    for b in range(n_batches):
        chunk = aspect[b * batch_size : (b + 1) * batch_size]
        mini, maxi = chunk.min(), chunk.max()
        if maxi < 1:
            shapes[b] = [maxi, 1]
        elif mini > 1:
            shapes[b] = [1, 1 / mini]
    return (np.ceil(shapes * img_size / stride + pad) * stride).astype(int)


def resized_hw(shape_hw, img_size: int) -> tuple[int, int]:
    """(h, w) of an image of `shape_hw` with its long side resized to img_size (what the loader decodes
    to, and what `--cache disk` stores)."""
    h0, w0 = (int(v) for v in shape_hw)
    r = img_size / max(h0, w0)
    return max(round(h0 * r), 1), max(round(w0 * r), 1)


def region_files(images: list[Path], shapes_hw: np.ndarray, img_size: int) -> np.ndarray:
    """bool [N]: which images a mosaic tile may decode in part (`YoloDataset.region_eligible`): JPEGs
    whose long side is img_size, i.e. decoded at their stored size (`resized_hw` keeps them, and
    `decode_flag` is IMREAD_COLOR: no DCT scaling below twice the size)."""
    jpeg = np.fromiter((p.suffix.lower() in (".jpg", ".jpeg") for p in images), bool, len(images))
    return jpeg & (np.asarray(shapes_hw).reshape(-1, 2).max(axis=1) == img_size)


def _with_crowd(labels: np.ndarray, crowd: np.ndarray) -> np.ndarray:
    """Validation labels with the image's crowd regions appended, marked by class -1 - cls (< 0)."""
    if not len(crowd):
        return labels
    marked = crowd.astype(np.float32).copy()
    marked[:, 0] = -1 - marked[:, 0]
    return np.concatenate([labels, marked])


def decodes_regions(*, augment: bool, cached: bool, mosaic_partners: str) -> bool:
    """Whether mosaic tiles decode only the part of a JPEG they show (and so use restart-marker copies):
    training items (`augment`) read from the files (not `cached` in RAM or on disk) with the release's
    partner sampling ("random"). The one statement of the rule: the dataset and the trainer's choice of a
    restart cache (data_pipeline.restart_cache) both ask it."""
    return augment and not cached and mosaic_partners == "random"


class YoloDataset:
    """A map-style dataset over a LabelIndex (see the module docstring for items and speed levers)."""

    def __init__(
        self,
        index: LabelIndex,
        img_size: int,
        *,
        augment: bool,
        hyp: AugmentSource | None,
        rect: bool = False,
        batch_size: int = 16,
        stride: int = 32,
        pad: float = 0.0,
        cache_images: str | None = None,
        mosaic_partners: str = "random",
        partner_pool: int = 32,
        seed: int = 0,
        color_on_device: bool = False,
        disk_cache: DiskPixelCache | None = None,
        region_decode: bool = True,
        restart_cache: RestartCache | None = None,
    ) -> None:
        if cache_images not in CACHE_MODES:
            raise DataError(f"cache_images must be one of {CACHE_MODES}, got {cache_images!r}")
        if mosaic_partners not in PARTNER_MODES:
            raise DataError(f"mosaic_partners must be one of {PARTNER_MODES}, got {mosaic_partners!r}")
        self.img_size = int(img_size)
        self.augment = augment
        self.params = AugmentParams.from_hyp(hyp)
        self.rect = rect
        self.batch_size = batch_size
        self.stride = stride
        self.cache_images = cache_images
        self.mosaic_partners = mosaic_partners
        self.partner_pool = max(int(partner_pool), _MIN_POOL_FOR_PARTNERS)
        self.color_on_device = bool(color_on_device) and augment
        self.disk_cache = disk_cache
        self.rng = np.random.default_rng(seed)
        self.images: list[Path] = list(index.images)
        self.shapes = np.asarray(index.shapes, dtype=np.int32).reshape(-1, 2)
        self.labels: list[np.ndarray] = list(index.labels)
        if not augment and index.crowd is not None:  # validation: crowd regions ride along, class -1 - cls
            self.labels = [_with_crowd(lab, crowd) for lab, crowd in zip(self.labels, index.crowd)]
        self.batch_shapes: np.ndarray | None = None
        if rect:
            order = np.argsort(self.shapes[:, 0] / self.shapes[:, 1], kind="stable")
            self.images = [self.images[i] for i in order]
            self.shapes = self.shapes[order]
            self.labels = [self.labels[i] for i in order]
            self.batch_shapes = rect_batch_shapes(self.shapes, batch_size, self.img_size, stride, pad)
        self._ram: dict[int, np.ndarray] = {}
        self._canvas: np.ndarray | None = None  # the mosaic's 2s x 2s scratch canvas, made on first use
        self._partner_indices: np.ndarray | None = None  # the cached shard (RAM cache), else everything
        self._recent: OrderedDict[int, np.ndarray] = OrderedDict()
        self._undecodable: dict[int, str] = {}  # index -> reason, learnt by this process
        # decoding only the part of a JPEG a mosaic tile shows (`_tile_image`): where tiles come from
        # files at their stored size; the pixels are the full decode's
        self.region_decode = bool(region_decode) and decodes_regions(
            augment=augment,
            cached=cache_images is not None or disk_cache is not None,
            mosaic_partners=mosaic_partners,
        )
        self._decode_whole: set[int] = set()  # indices the region decoder declined (this process)
        self._region_files: np.ndarray | None = None  # `region_files` of this dataset, made on first use
        # restart-marker copies of the tiles' JPEGs (data.restart_cache), where region decoding applies
        self.restart_cache = restart_cache if self.region_decode else None
        self._no_copy: set[int] = set()  # indices whose copy cannot be made or used (this process)
        self._copy_buffer: np.ndarray | None = None  # copies are read into it (1 MiB; larger ones: their own)
        self._tile_buffer: np.ndarray | None = None  # reused for every region-decoded tile
        self.undecodable_samples = multiprocessing.Value("q", 0)  # shared with the loader's workers

    def __len__(self) -> int:
        return len(self.images)

    def reseed(self, seed: int) -> None:
        """Give this copy (e.g. one DataLoader worker's) its own random stream."""
        self.rng = np.random.default_rng(seed)

    def cache_shard(self, indices: list[int]) -> None:
        """Decode and keep the resized images of `indices` in RAM (only with cache_images="ram")."""
        if self.cache_images != "ram":
            return
        for i in indices:
            if i not in self._ram:
                try:
                    self._ram[i] = self._decode_resized(i)
                except UndecodableImage:
                    pass  # logged; __getitem__ replaces or skips it
        if self._ram:
            self._partner_indices = np.fromiter(sorted(self._ram), dtype=np.int64)

    def _decode_resized(self, i: int) -> np.ndarray:
        """BGR uint8 [h, w, 3] with the long side resized to img_size. Raises UndecodableImage (logged
        the first time; later calls for the same index raise at once, without decoding)."""
        path = self.images[i]
        if i in self._undecodable:
            raise UndecodableImage(i, path, self._undecodable[i])
        try:
            img = decode_image(path, self.decode_flag(i))
        except ImageProblem as exc:
            self._undecodable[i] = f"{exc} (it passed the label scan)"
            then = "another image takes its place" if self.augment else "left out of the validation metrics"
            log.warning("skipped: %s: %s; %s", path, self._undecodable[i], then)
            raise UndecodableImage(i, path, self._undecodable[i]) from None
        new_wh = self.resized_hw(i)[::-1]
        if (img.shape[1], img.shape[0]) != new_wh:
            shrink = img.shape[1] > new_wh[0]
            interp = cv2.INTER_AREA if shrink and not self.augment else cv2.INTER_LINEAR
            img = cv2.resize(img, new_wh, interpolation=interp)
        return img

    def decode_flag(self, i: int) -> int:
        """The cv2.IMREAD_* flag image i is decoded with: a reduced DCT scale for a JPEG at least twice
        the target size, else IMREAD_COLOR."""
        long_side = int(self.shapes[i].max())
        if self.images[i].suffix.lower() in (".jpg", ".jpeg"):
            for factor, reduced in _REDUCED_FLAGS:
                if long_side >= factor * self.img_size:
                    return reduced
        return cv2.IMREAD_COLOR

    def resized_hw(self, i: int) -> tuple[int, int]:
        """(h, w) of image i with its long side resized to img_size."""
        return resized_hw(self.shapes[i], self.img_size)

    def load_image(self, i: int) -> np.ndarray:
        """Resized BGR image of item i (RAM cache, then the recent pool, then the disk cache, then a
        decode, which fills the disk cache)."""
        img = self._ram.get(i)
        if img is None:
            img = self._recent.get(i)
        if img is None and self.disk_cache is not None:
            key = self.disk_cache.key(self.images[i])
            img = self.disk_cache.get(key, self.resized_hw(i))
            if img is None:
                img = self._decode_resized(i)
                self.disk_cache.put(key, img)
        if img is None:
            img = self._decode_resized(i)
        if self.augment and self.mosaic_partners == "recent":
            self._recent[i] = img
            self._recent.move_to_end(i)
            while len(self._recent) > self.partner_pool:
                self._recent.popitem(last=False)
        return img

    def _pixel_labels(self, i: int, img: np.ndarray) -> np.ndarray:
        h, w = img.shape[:2]
        return xywhn_to_xyxy(self.labels[i], w, h)

    def mosaic_plan(self, i: int) -> list[int]:
        """The four dataset indices of item i's mosaic, in tile order (top-left, top-right, bottom-left,
        bottom-right), decided before any decode.

        "random" (the release's): [i] + 3 indices uniform with replacement over the partner set (the
        whole dataset; with the RAM cache this rank's cached images), shuffled, so i lands in a uniformly
        random quadrant. "recent": i top-left, partners uniform over the recently decoded pool (the
        whole dataset until the pool is half full).
        """
        if self.mosaic_partners == "recent":
            if len(self._recent) >= self.partner_pool // 2:
                pool = [j for j in self._recent if j != i] or [i]
                return [i, *(pool[j] for j in self.rng.integers(0, len(pool), 3))]
            return [i, *(int(j) for j in self.rng.integers(0, len(self), 3))]
        plan = [i, *self._uniform_indices(3)]
        return [plan[k] for k in self.rng.permutation(4)]

    def _uniform_indices(self, k: int) -> list[int]:
        """k indices uniform with replacement over the partner set (the cached shard, else all)."""
        candidates = self._partner_indices
        if candidates is None:
            return [int(j) for j in self.rng.integers(0, len(self), k)]
        return [int(j) for j in candidates[self.rng.integers(0, len(candidates), k)]]

    def _mosaic_sample(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The plan, then the centre and the affine (the release's draws, drawn before any decode: a
        tile's size is known from the index), then the tiles one at a time."""
        if self.mosaic_partners == "recent":
            self.load_image(i)  # before choosing partners, so the pool holds it
        plan = self.mosaic_plan(i)
        geometry = draw_mosaic_geometry(self.img_size, self.params, self.rng)
        if self._canvas is None:  # this process's scratch canvas (see augment.mosaic), reused
            self._canvas = np.empty((2 * self.img_size, 2 * self.img_size, 3), np.uint8)
        return compose_mosaic(self._mosaic_tiles(plan, geometry), geometry, canvas=self._canvas)

    def _mosaic_tiles(self, plan: list[int], geometry: MosaicGeometry):
        """(image, labels) of each tile of `plan`, produced as `compose_mosaic` takes them (the region
        decoder's buffer is reused from one tile to the next)."""
        for k, j in enumerate(plan):
            img = self._tile_image(k, j, geometry)
            yield img, self._pixel_labels(j, img)

    def region_eligible(self, j: int) -> bool:
        """Whether tile image j may be decoded in part: a JPEG at its stored size (no DCT scaling, no
        resize), not declined before, region decoding on and its library checked in this process."""
        if self._region_files is None:  # per image, once: the per-tile check is then a lookup
            self._region_files = region_files(self.images, self.shapes, self.img_size)
        return (
            self.region_decode
            and bool(self._region_files[j])
            and j not in self._decode_whole
            and region_decoder() is not None
        )

    def _tile_image(self, k: int, j: int, geometry: MosaicGeometry) -> np.ndarray:
        """Image j as tile k of the mosaic: the whole resized image (`load_image`), or, where eligible,
        a buffer of its size in which only the pixels the tile's warp reads are decoded: from the
        image's restart-marker copy with a `restart_cache` (made here from the original's bytes when
        there is none yet), else from the original."""
        if not self.region_eligible(j):
            return self.load_image(j)
        if j in self._undecodable:
            raise UndecodableImage(j, self.images[j], self._undecodable[j])
        h, w = self.resized_hw(j)
        if self._tile_buffer is None:
            self._tile_buffer = np.empty((self.img_size, self.img_size, 3), np.uint8)
        view = self._tile_buffer[:h, :w]
        rect = tile_source_rect(k, (h, w), geometry)
        if rect is None:
            return view  # the tile does not show: none of its pixels are read
        cache, copy_path = self.restart_cache, None
        if cache is not None and j not in self._no_copy:
            copy_path = cache.copy_path(self.images[j])
            if self._copy_buffer is None:
                self._copy_buffer = np.empty(1 << 20, np.uint8)
            copy = None if copy_path is None else cache.read(copy_path, self._copy_buffer)
            if copy is not None:
                if decode_region_restarts(copy, view, rect):
                    return view
                # a copy that does not decode (damaged?): replaced below, not used again by this process
                self._no_copy.add(j)
        try:
            data = read_bytes(self.images[j])
        except ImageProblem:  # decoded whole below, where the problem is reported
            data = b""
        if data and cache is not None and copy_path is not None:  # no copy yet (or a damaged one): make it
            copy = transcode_with_restarts(data, w, h)
            if copy is None:
                self._no_copy.add(j)  # a file the copies do not take: regions from the original
            else:
                cache.write(copy_path, copy)
                if cache.enabled and j not in self._no_copy and decode_region_restarts(copy, view, rect):
                    return view
        if data and decode_region(data, view, rect):
            return view
        self._decode_whole.add(j)  # not a file for this path (or a bad one): decoded whole from now on
        return self.load_image(j)

    def substitute(self, i: int) -> int:
        """The index standing in for undecodable item i: the next index, cyclically, not known to be
        undecodable; within i's batch with rectangular batches (its items share one shape)."""
        lo, n = 0, len(self)
        if self.rect:
            lo = i // self.batch_size * self.batch_size
            n = min(self.batch_size, len(self) - lo)
        for step in range(1, n):
            j = lo + (i - lo + step) % n
            if j not in self._undecodable:
                return j
        scope = f"batch {i // self.batch_size} (rect)" if self.rect else "the dataset"
        raise DataError(f"no image of {scope} can be decoded (last: {self.images[i]})")

    def __getitem__(self, i: int):
        """Item i (see the module docstring); its undecodable images are replaced (training) or make a
        `Skipped` marker (validation)."""
        last = ""
        for _ in range(_MAX_DRAWS):
            try:
                return self._item(i)
            except UndecodableImage as exc:
                last = str(exc.path)
                with self.undecodable_samples.get_lock():
                    self.undecodable_samples.value += 1
                if not self.augment:
                    return Skipped(str(exc.path), exc.reason)
                if exc.index == i:
                    i = self.substitute(i)
                # else a mosaic partner or the mixup image failed: the next draw picks others
        raise DataError(
            f"{_MAX_DRAWS} draws in a row for one training sample hit undecodable images "
            f"(last: {last}); see the 'skipped:' lines above"
        )

    def _item(self, i: int):
        p = self.params
        h0, w0 = (int(v) for v in self.shapes[i])
        use_mosaic = self.augment and not self.rect and self.rng.random() < p.mosaic
        if use_mosaic:
            img, labels = self._mosaic_sample(i)
            if self.rng.random() < p.mixup:
                img2, labels2 = self._mosaic_sample(self._uniform_indices(1)[0])
                img, labels = mixup(img, labels, img2, labels2, self.rng)
            shapes = None
        else:
            img = self.load_image(i)
            h, w = img.shape[:2]
            shape = self.batch_shapes[i // self.batch_size] if self.rect else (self.img_size, self.img_size)
            img, (rw, rh), (pad_w, pad_h) = letterbox(
                img, tuple(int(v) for v in shape), auto=False, scaleup=self.augment
            )
            labels = xywhn_to_xyxy(self.labels[i], rw * w, rh * h, pad_w, pad_h)
            shapes = ((h0, w0), ((rh * h / h0, rw * w / w0), (pad_w, pad_h)))
            if self.augment:
                img, labels = random_perspective(img, labels, p, self.rng)
        out_h, out_w = img.shape[:2]
        labels = xyxy_to_xywhn(labels, out_w, out_h)
        color = None
        if self.augment:  # HSV gains and flips: drawn here, applied here or on the device batch
            color = draw_color_params(p, self.rng)
            labels = flip_labels(labels, bool(color[4]), bool(color[5]))
            if not self.color_on_device:
                img, color = apply_color_hwc(img, color), None
        else:
            img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        chw = img.transpose(2, 0, 1)  # a view: collate copies each image exactly once
        targets = np.zeros((len(labels), 6), np.float32)
        targets[:, 1:] = labels
        return chw, targets, str(self.images[i]), shapes, color
