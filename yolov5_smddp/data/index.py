"""What a label scan gives the rest of the package: the usable image/label pairs of a split
(`LabelIndex`), the scan's counts (`ScanReport`), and for COCO sources the JSON's own ids (`CocoMeta`).
`data.labels` builds it from YOLO label files, `data.coco` from a COCO instances JSON."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True, kw_only=True)
class CocoMeta:
    """What validation needs to write results in the JSON's own terms."""

    json_path: Path
    image_ids: np.ndarray
    """int64 [N] COCO image id of each image of the index (aligned with LabelIndex.images)."""
    category_ids: list[int]
    """COCO category id of each class index."""


@dataclass(frozen=True, kw_only=True)
class ScanReport:
    """Counts over all pairs and one message per problem ("<file>: <reason>")."""

    found: int
    usable: int
    missing_labels: int
    empty_labels: int
    bad: int
    duplicate_files: int
    polygon_files: int
    boxes: int
    messages: list[str]
    cache: str
    """How the cache was used: 'loaded', 'built' or 'built (not written: ...)'."""
    degenerate_files: int = 0
    """Label files with boxes of zero width or height (those rows are dropped, each file has a message)."""


@dataclass(frozen=True, kw_only=True)
class LabelIndex:
    """The usable pairs of a split (bad pairs removed)."""

    root: Path
    images: list[Path]
    """Absolute image paths."""
    shapes: np.ndarray
    """int32 [N, 2] (h, w) of each image as decoded."""
    labels: list[np.ndarray]
    """Per image float32 [n, 5] (cls, xc, yc, w, h) normalised to the image; n = 0 for background."""
    report: ScanReport
    cache_path: Path | None
    """Where our cache was read or written (None when it could not be written anywhere)."""
    crowd: list[np.ndarray] | None = None
    """COCO sources only: per image float32 [k, 5] crowd regions (`iscrowd: 1`), never training targets;
    validation ignores detections that fall in them (see `data.coco`)."""
    coco: CocoMeta | None = None
    """COCO sources only: the JSON's image and category ids (for `val --save-json`)."""
