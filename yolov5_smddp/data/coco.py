"""COCO instances JSON read directly: the parse (cached by content), the conversion rules, the index.

A split given as one `.json` file is a COCO "instances" file (what pycocotools, CVAT, Label Studio and
Roboflow write). The rules, exactly:

- classes: the `categories` sorted by ascending `id` become class indices 0..C-1 (COCO's 1..90 with gaps
  become 0..79); names are the categories' `name`s. Validation writes the JSON's own ids back.
- images: `file_name` resolves against the image folder given for the split (`<split>_images:` in
  data.yaml) or, without one, the JSON's own folder; an absolute `file_name` is used as is. An image
  whose file is missing or unusable (the label scan's checks: truncated, over the pixel limit, too
  small), whose `width`/`height` disagree with the file, or whose path another entry already uses is
  skipped and named ("skipped: <path>: <why>"). Missing `width`/`height` are read from the file.
- boxes: `bbox` is `[x, y, w, h]` in pixels of the image's `width` x `height` and becomes (cls, xc, yc,
  w, h) normalised to it, the YOLO label form. A box reaching outside the image is clipped to it (as a
  YOLO label's coordinates above 1 are); a box with no area inside the image (zero width or height, or
  wholly outside) is dropped and reported, as are annotations whose `bbox` is not four finite numbers
  with w, h >= 0, whose `image_id` is not in `images` or whose `category_id` is not in `categories`.
  None of these stops a job.
- `iscrowd: 1` annotations are never training targets. They are kept per image as crowd regions
  (`LabelIndex.crowd`) for validation, which treats them as pycocotools does: a detection that matches
  no ordinary box but covers a crowd region of its class (intersection / detection area >= the IoU
  threshold) is ignored, neither a true nor a false positive.
- an image without (usable, non-crowd) annotations is a background image.

The parse of a large file (COCO train2017: 118k images, 860k boxes) is the slow part, so its result is
cached as plain arrays (NPZ, read with allow_pickle=False) in the cache folder only — never beside the
JSON — named by a hash of the JSON's bytes, so an edited file gets a new entry and a moved one finds its
old entry. One process per host parses: the others wait on a lock file in the cache folder and then load
the arrays (tens of MB instead of a JSON parse of gigabytes). The image checks (the label scan's) are
cached the same way, keyed by the JSON, the image paths and every image file's size; a job with a valid
entry only stats the images.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
from array import array
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from pathlib import Path

import numpy as np

from yolov5_smddp.data.imageinfo import DEFAULT_MAX_PIXELS, ImageProblem, read_image_info
from yolov5_smddp.data.index import CocoMeta, LabelIndex, ScanReport
from yolov5_smddp.errors import DataError
from yolov5_smddp.files.atomic import atomic_write
from yolov5_smddp.files.bounded_read import UnreadableFile, not_regular_reason, read_limited, shown

log = logging.getLogger(__name__)

COCO_CACHE_VERSION = 1
COCO_CACHE_SUFFIX = ".cocoindex.npz"
_FORMAT = "yolov5-smddp-coco"
_MAX_LOGGED_PROBLEMS = 20
_HASH_CHUNK = 1 << 22
MAX_JSON_BYTES = 4 << 30
"""4 GiB: COCO's own train2017 instances file is 448 MB."""


def is_coco_json(path: Path | str) -> bool:
    """A split source that is a COCO instances file (decided by the `.json` suffix)."""
    return str(path).lower().endswith(".json")


@dataclass(kw_only=True)
class CocoTable:
    """A parsed COCO instances file in columns: what the cache holds (N images, M kept annotations)."""

    digest: str
    """Hash of the JSON's bytes (names the cache entry)."""
    category_ids: np.ndarray
    """int64 [C] ascending: class index k is category id category_ids[k]."""
    category_names: list[str]
    image_ids: np.ndarray
    """int64 [N] in file order."""
    file_names: list[str]
    widths: np.ndarray
    """int64 [N]; 0 when the JSON gives none (the file's size is used)."""
    heights: np.ndarray
    ann_image: np.ndarray
    """int64 [M] position (0..N-1) of each kept annotation's image."""
    boxes: np.ndarray
    """float64 [M, 4] x, y, w, h in pixels, as written."""
    classes: np.ndarray
    """int32 [M] class index."""
    crowd: np.ndarray
    """bool [M] iscrowd."""
    messages: list[str]
    """One per annotation or image entry dropped while parsing ("<json>: <what>: <why>")."""

    @property
    def names(self) -> list[str]:
        return list(self.category_names)


# ------------------------------------------------------------------------------------------ parsing


def _number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float's range
        return False


def _int_id(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _beyond_64_bits(value: object) -> bool:
    """A JSON number too large for the int64 columns (2**70, 1e30, 1e300)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return abs(value) >= 2**63  # also inf (Python's json reads `Infinity`)


def _check_fits(entry: dict, fields: tuple[str, ...], about: str) -> None:
    """DataError naming the field of `entry` whose number is beyond 64 bits (it would overflow later)."""
    for name in fields:
        if _beyond_64_bits(entry.get(name)):
            raise DataError(f"{about}: field '{name}' is {entry[name]!r}, beyond 64 bits (|value| < 2**63)")


def _category_name(entry: dict, cid: int, where: str) -> str:
    """The class name of a category: a non-empty string (a number is taken as its text)."""
    name = entry.get("name")
    if isinstance(name, int | float) and not isinstance(name, bool):
        return str(name)
    if not isinstance(name, str) or not name.strip():
        raise DataError(
            f"{where}: categories: id {cid} has the name {name!r}, not a non-empty string; "
            f'write it as a JSON string, e.g. "name": "box"'
        )
    return name


def parse_coco(raw: object, where: str, digest: str = "") -> CocoTable:
    """A decoded COCO instances JSON → CocoTable (see the module docstring for the rules).

    Raises DataError naming `where` when the file is not an instances file at all (not an object, no
    `images` list, no usable `categories`, duplicate category ids); everything smaller is a message.
    """
    if not isinstance(raw, dict):
        raise DataError(
            f"{where}: not a COCO instances file (expected a JSON object, got {type(raw).__name__})"
        )
    images, annotations, categories = raw.get("images"), raw.get("annotations", []), raw.get("categories")
    if not isinstance(images, list):
        raise DataError(f"{where}: not a COCO instances file: key 'images' is missing or not a list")
    if not isinstance(annotations, list):
        raise DataError(f"{where}: key 'annotations' must be a list, got {type(annotations).__name__}")
    if not isinstance(categories, list) or not categories:
        raise DataError(f"{where}: key 'categories' is missing or empty (class ids and names come from it)")
    messages: list[str] = []

    by_cat: dict[int, str] = {}
    for entry in categories:
        cid = _int_id(entry.get("id")) if isinstance(entry, dict) else None
        if cid is None:
            raise DataError(f"{where}: categories: entry {str(entry)[:80]} has no integer 'id'")
        _check_fits(entry, ("id",), f"{where}: categories: entry {str(entry)[:60]}")
        if cid in by_cat:
            raise DataError(f"{where}: categories: id {cid} appears twice")
        by_cat[cid] = _category_name(entry, cid, where) if "name" in entry else str(cid)
    cat_ids = sorted(by_cat)
    class_of = {cid: k for k, cid in enumerate(cat_ids)}

    image_ids, file_names, widths, heights = [], [], [], []
    position: dict[int, int] = {}
    for entry in images:
        iid = _int_id(entry.get("id")) if isinstance(entry, dict) else None
        if iid is None:
            messages.append(f"{where}: image entry {str(entry)[:80]}: no integer 'id'")
            continue
        _check_fits(entry, ("id", "width", "height"), f"{where}: images: entry {str(entry)[:60]}")
        name = entry.get("file_name")
        if not isinstance(name, str) or not name:
            messages.append(f"{where}: image id {iid}: no 'file_name'")
            continue
        if iid in position:
            messages.append(f"{where}: image id {iid} appears twice; the first entry is used")
            continue
        w, h = entry.get("width"), entry.get("height")
        w = int(w) if _number(w) and w > 0 else 0
        h = int(h) if _number(h) and h > 0 else 0
        position[iid] = len(image_ids)
        image_ids.append(iid)
        file_names.append(name)
        widths.append(w)
        heights.append(h)

    fast = _clean_annotations(annotations, position, class_of)
    if fast is not None:
        ann_image, boxes, classes, crowd = fast
    else:
        ann_image, boxes, classes, crowd = _checked_annotations(
            annotations, position, class_of, where, messages
        )
    return CocoTable(
        digest=digest,
        category_ids=np.array(cat_ids, dtype=np.int64),
        category_names=[by_cat[c] for c in cat_ids],
        image_ids=np.array(image_ids, dtype=np.int64),
        file_names=file_names,
        widths=np.array(widths, dtype=np.int64),
        heights=np.array(heights, dtype=np.int64),
        ann_image=np.array(ann_image, dtype=np.int64),
        boxes=np.array(boxes, dtype=np.float64).reshape(-1, 4),
        classes=np.array(classes, dtype=np.int32),
        crowd=np.array(crowd, dtype=bool),
        messages=messages,
    )


def _lookup(keys: np.ndarray, table: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(values, found) of int64 `keys` in `table`, vectorised."""
    if not table:
        return np.zeros(len(keys), np.int64), np.zeros(len(keys), bool)
    ids = np.fromiter(table.keys(), dtype=np.int64, count=len(table))
    values = np.fromiter(table.values(), dtype=np.int64, count=len(table))
    order = np.argsort(ids)
    ids, values = ids[order], values[order]
    at = np.searchsorted(ids, keys).clip(max=len(ids) - 1)
    return values[at], ids[at] == keys


def _clean_annotations(annotations: list, position: dict[int, int], class_of: dict[int, int]):
    """The annotation columns (image position, bbox, class, crowd) when EVERY annotation is well formed,
    computed column-wise (a COCO-sized file in about a second); None otherwise, and then
    `_checked_annotations` names each problem."""
    if not annotations:
        return [], np.zeros((0, 4)), [], []
    m = len(annotations)
    try:
        image_col = np.array(list(map(itemgetter("image_id"), annotations)))
        cat_col = np.array(list(map(itemgetter("category_id"), annotations)))
        bboxes = list(map(itemgetter("bbox"), annotations))
        if not (np.fromiter(map(len, bboxes), np.int64, m) == 4).all():
            return None
        boxes = np.frombuffer(array("d", chain.from_iterable(bboxes)), np.float64).reshape(m, 4)
        crowd = np.array([bool(a.get("iscrowd", 0)) for a in annotations], dtype=bool)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        return None
    if image_col.dtype.kind != "i" or cat_col.dtype.kind != "i":
        return None
    ann_image, image_found = _lookup(image_col.astype(np.int64), position)
    classes, class_found = _lookup(cat_col.astype(np.int64), class_of)
    ok = image_found & class_found & np.isfinite(boxes).all(1) & (boxes[:, 2:] >= 0).all(1)
    if not ok.all():
        return None
    return ann_image, boxes, classes, crowd


def _checked_annotations(
    annotations: list, position: dict[int, int], class_of: dict[int, int], where: str, messages: list[str]
):
    """The annotation columns, one annotation at a time: each unusable one is a message."""
    ann_image, boxes, classes, crowd = [], [], [], []
    for entry in annotations:
        if not isinstance(entry, dict):
            messages.append(f"{where}: annotation {str(entry)[:80]}: not an object")
            continue
        about = f"{where}: annotation id {str(entry.get('id'))[:40]}"
        _check_fits(entry, ("id", "image_id", "category_id"), about)
        pos = position.get(_int_id(entry.get("image_id")))  # type: ignore[arg-type]
        if pos is None:
            messages.append(f"{about}: image_id {entry.get('image_id')!r} is not in 'images'")
            continue
        k = class_of.get(_int_id(entry.get("category_id")))  # type: ignore[arg-type]
        if k is None:
            messages.append(f"{about}: category_id {entry.get('category_id')!r} is not in 'categories'")
            continue
        bbox = entry.get("bbox")
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(map(_number, bbox))):
            messages.append(f"{about}: bbox {bbox!r} is not four finite numbers [x, y, w, h]")
            continue
        if bbox[2] < 0 or bbox[3] < 0:
            messages.append(f"{about}: bbox {bbox!r} has a negative width or height")
            continue
        ann_image.append(pos)
        boxes.append(bbox)
        classes.append(k)
        crowd.append(bool(entry.get("iscrowd", 0)))
    return ann_image, boxes, classes, crowd


def file_digest(path: Path) -> str:
    """16 hex digits over the file's bytes (read in 4 MiB chunks)."""
    h = hashlib.blake2b(digest_size=8)
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# -------------------------------------------------------------------------------------------- cache


def coco_cache_path(cache_dir: Path, digest: str) -> Path:
    return Path(cache_dir) / f"yolov5-smddp-coco-{digest}{COCO_CACHE_SUFFIX}"


def save_table(path: Path, table: CocoTable, *, source: Path) -> None:
    """Write `table` to `path` atomically (plain arrays only)."""
    meta = {"format": _FORMAT, "version": COCO_CACHE_VERSION, "digest": table.digest, "source": str(source)}
    with atomic_write(path) as f:
        np.savez(
            f,
            meta=np.array(json.dumps(meta)),
            category_ids=table.category_ids,
            category_names=np.array(table.category_names, dtype=str),
            image_ids=table.image_ids,
            file_names=np.array(table.file_names, dtype=str),
            widths=table.widths,
            heights=table.heights,
            ann_image=table.ann_image,
            boxes=table.boxes,
            classes=table.classes,
            crowd=table.crowd,
            messages=np.array(table.messages, dtype=str),
        )


def load_table(path: Path, digest: str) -> CocoTable | None:
    """Our cached parse at `path` (allow_pickle=False), None when absent, unreadable or another version."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(str(npz["meta"]))
            if (meta.get("format"), meta.get("version"), meta.get("digest")) != (
                _FORMAT,
                COCO_CACHE_VERSION,
                digest,
            ):
                return None
            return CocoTable(
                digest=digest,
                category_ids=npz["category_ids"].astype(np.int64),
                category_names=npz["category_names"].tolist(),
                image_ids=npz["image_ids"].astype(np.int64),
                file_names=npz["file_names"].tolist(),
                widths=npz["widths"].astype(np.int64),
                heights=npz["heights"].astype(np.int64),
                ann_image=npz["ann_image"].astype(np.int64),
                boxes=npz["boxes"].astype(np.float64).reshape(-1, 4),
                classes=npz["classes"].astype(np.int32),
                crowd=npz["crowd"].astype(bool),
                messages=npz["messages"].tolist(),
            )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        log.info("COCO index cache %s unreadable (%s); parsing the JSON again", path, exc)
        return None


def _parse_file(json_path: Path, digest: str) -> CocoTable:
    where = shown(json_path)
    try:
        raw = json.loads(read_limited(json_path, MAX_JSON_BYTES, what="COCO JSON"))
    except UnreadableFile as exc:
        raise DataError(f"{where}: {exc}") from None
    except RecursionError:
        raise DataError(
            f"{where}: nested deeper than the JSON reader allows (~{sys.getrecursionlimit():,} levels); "
            f"a COCO file nests 4"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{where}: cannot be read as JSON: {exc}") from None
    return parse_coco(raw, where, digest)


class _HostLock:
    """An exclusive flock on `path` (created), so one process per host parses; a no-op when the
    cache folder cannot hold the lock file."""

    def __init__(self, path: Path) -> None:
        self.path, self.handle = path, None

    def __enter__(self) -> _HostLock:
        try:
            import fcntl

            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = open(self.path, "a+b")  # noqa: SIM115 - held until __exit__
            fcntl.flock(self.handle, fcntl.LOCK_EX)
        except (OSError, ImportError):
            self.handle = None
        return self

    def __exit__(self, *_exc) -> None:
        if self.handle is not None:
            self.handle.close()  # releases the flock


_MEMO: dict[tuple[str, int, int], tuple[CocoTable, str]] = {}


def load_coco(json_path: Path, cache_dir: Path) -> tuple[CocoTable, str]:
    """The parse of `json_path`: from this process's memory, our cache in `cache_dir`, or parsed (and
    cached). Returns (table, 'loaded' | 'built' | 'built (not written: ...)').

    Raises DataError naming the file when it is missing, not JSON, or not an instances file.
    """
    json_path = Path(json_path)
    try:
        st = json_path.stat()
        not_regular = not_regular_reason(json_path)
    except OSError as exc:
        raise DataError(f"COCO JSON {shown(json_path)}: cannot be read: {exc.strerror or exc}") from None
    if not_regular:
        raise DataError(f"COCO JSON {shown(json_path)}: {not_regular}")
    key = (str(json_path.resolve()), st.st_size, st.st_mtime_ns)
    if key in _MEMO:
        return _MEMO[key]
    digest = file_digest(json_path)
    target = coco_cache_path(cache_dir, digest)
    with _HostLock(target.with_suffix(".lock")):
        table = load_table(target, digest)
        state = "loaded"
        if table is None:
            table = _parse_file(json_path, digest)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                save_table(target, table, source=json_path)
                state = "built"
            except OSError as exc:
                why = f"{target}: {exc.strerror or exc}"
                log.warning("COCO index cache not written (the JSON is parsed again next time): %s", why)
                state = f"built (not written: {why})"
    _MEMO[key] = (table, state)
    while len(_MEMO) > 3:  # train, val and test at most: memory stays bounded
        del _MEMO[next(iter(_MEMO))]
    return table, state


# -------------------------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class ConvertedBoxes:
    labels: np.ndarray
    """float32 [n, 5] (cls, xc, yc, w, h) normalised."""
    keep: np.ndarray
    """bool [m]: which input boxes were kept."""
    clipped: np.ndarray
    """bool [m]: which kept boxes were clipped to the image."""


def convert_boxes(boxes: np.ndarray, classes: np.ndarray, width, height) -> ConvertedBoxes:
    """COCO `bbox` rows [m, 4] (x, y, w, h pixels) of a width x height image → normalised YOLO rows
    (width/height: numbers, or one per row).

    Each box is clipped to the image; one with no area left (w or h zero, or wholly outside) is not kept.
    """
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    x1 = boxes[:, 0].clip(0, width)
    y1 = boxes[:, 1].clip(0, height)
    x2 = (boxes[:, 0] + boxes[:, 2]).clip(0, width)
    y2 = (boxes[:, 1] + boxes[:, 3]).clip(0, height)
    keep = (x2 > x1) & (y2 > y1)
    clipped = keep & (
        (x1 != boxes[:, 0])
        | (y1 != boxes[:, 1])
        | (x2 != boxes[:, 0] + boxes[:, 2])
        | (y2 != boxes[:, 1] + boxes[:, 3])
    )
    out = np.stack(
        [
            np.asarray(classes, dtype=np.float64),
            (x1 + x2) / 2 / width,
            (y1 + y2) / 2 / height,
            (x2 - x1) / width,
            (y2 - y1) / height,
        ],
        1,
    )[keep]
    return ConvertedBoxes(out.astype(np.float32), keep, clipped)


# -------------------------------------------------------------------------------------------- index


@dataclass(frozen=True)
class SplitAnnotations:
    labels: list[np.ndarray]
    """Per image float32 [n, 5] normalised non-crowd boxes (empty for images not usable)."""
    crowd: list[np.ndarray]
    """Per image float32 [k, 5] normalised crowd regions."""
    dropped: list[tuple[int, list[float]]]
    """(image position, bbox as written) of each box with no area inside its image."""
    clipped: int
    """Boxes clipped to their image."""


def split_annotations(
    table: CocoTable, usable: np.ndarray, frame_w: np.ndarray, frame_h: np.ndarray
) -> SplitAnnotations:
    """The annotations of the `usable` images converted (`convert_boxes`, each in its image's
    frame_w x frame_h pixels) and split per image into training boxes and crowd regions; vectorised."""
    n = len(table.image_ids)
    order = np.argsort(table.ann_image, kind="stable")
    order = order[usable[table.ann_image[order]]]
    owners = table.ann_image[order]
    conv = convert_boxes(table.boxes[order], table.classes[order], frame_w[owners], frame_h[owners])
    dropped = [(int(owners[j]), table.boxes[order[j]].tolist()) for j in np.flatnonzero(~conv.keep)]
    kept_owner = owners[conv.keep]
    is_crowd = table.crowd[order][conv.keep]

    def per_image(rows: np.ndarray, owner: np.ndarray) -> list[np.ndarray]:
        return np.split(rows, np.cumsum(np.bincount(owner, minlength=n))[:-1]) if n else []

    return SplitAnnotations(
        labels=per_image(conv.labels[~is_crowd], kept_owner[~is_crowd]),
        crowd=per_image(conv.labels[is_crowd], kept_owner[is_crowd]),
        dropped=dropped,
        clipped=int(conv.clipped.sum()),
    )


def resolve_image(file_name: str, base: Path) -> str:
    """Where `file_name` is: itself when absolute, else under `base` (normalised)."""
    if os.path.isabs(file_name):
        return os.path.normpath(file_name)
    return os.path.normpath(os.path.join(base, file_name))


def _check_image(args: tuple[str, int, int]) -> tuple[tuple[int, int], str]:
    path, size, max_pixels = args
    if size < 0:
        return (0, 0), "image file not found"
    try:
        shape, _ = read_image_info(path, max_pixels)
    except ImageProblem as exc:
        return (0, 0), str(exc)
    return shape, ""


def _file_size(path: str) -> int:
    try:
        st = os.stat(path)
    except OSError:
        return -1
    return st.st_size if os.path.isfile(path) else -1


def _checked_images(
    paths: list[str], base: Path, digest: str, cache_dir: Path, workers: int, max_pixels: int
) -> tuple[list[tuple[tuple[int, int], str]], str]:
    """Each image's ((h, w), problem or '') from the label scan's checks, and 'loaded' or 'built'.

    Like the label cache, the results are cached in `cache_dir` (plain arrays) under a name keyed by the
    JSON's digest, the paths relative to `base`, every file's size and the pixel limit; only the sizes
    are read (stat) when it is valid.
    """
    with ThreadPoolExecutor(max(1, min(workers, os.cpu_count() or 1))) as pool:
        sizes = list(pool.map(_file_size, paths, chunksize=256))
        h = hashlib.blake2b(digest_size=8)
        h.update(f"v{COCO_CACHE_VERSION} {digest} max_pixels={max_pixels}\n".encode())
        h.update("\n".join(os.path.relpath(p, base) for p in paths).encode())
        h.update(np.array(sizes, dtype="<i8").tobytes())
        target = Path(cache_dir) / f"yolov5-smddp-cocoimages-{h.hexdigest()}.npz"
        try:
            with np.load(target, allow_pickle=False) as npz:
                shapes, reasons = npz["shapes"], npz["reasons"].tolist()
            if len(reasons) == len(paths):
                return [((int(a), int(b)), r) for (a, b), r in zip(shapes.tolist(), reasons)], "loaded"
        except (OSError, ValueError, KeyError):
            pass
        args = [(p, size, max_pixels) for p, size in zip(paths, sizes)]
        checked = list(pool.map(_check_image, args, chunksize=64))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(target) as f:
            np.savez(
                f,
                shapes=np.array([shape for shape, _ in checked], dtype=np.int32).reshape(-1, 2),
                reasons=np.array([reason for _, reason in checked], dtype=str),
            )
    except OSError as exc:
        log.warning("COCO image check cache %s not written: %s", target, exc.strerror or exc)
    return checked, "built"


def build_coco_index(
    json_path: Path,
    *,
    nc: int,
    root: Path,
    image_dir: Path | None = None,
    cache_dir: Path,
    workers: int = 8,
    max_pixels: int = DEFAULT_MAX_PIXELS,
):
    """The LabelIndex of a COCO instances file (see the module docstring). Raises DataError when the
    file cannot be used at all, its category count is not `nc`, or no usable image has a box."""
    json_path = Path(json_path)
    table, cache_state = load_coco(json_path, cache_dir)
    if len(table.category_ids) != nc:
        raise DataError(
            f"{json_path}: {len(table.category_ids)} categories, but the dataset has {nc} classes "
            "(every split's JSON must list the same categories)"
        )
    base = Path(image_dir) if image_dir is not None else json_path.parent
    paths = [resolve_image(name, base) for name in table.file_names]
    n = len(paths)
    reasons = [""] * n
    seen: dict[str, int] = {}
    for i, path in enumerate(paths):
        if path in seen:
            reasons[i] = f"also listed as image id {table.image_ids[seen[path]]}; this entry is skipped"
        else:
            seen[path] = i
    todo = [i for i in range(n) if not reasons[i]]
    checked, checks_state = _checked_images(
        [paths[i] for i in todo], base, table.digest, cache_dir, workers, max_pixels
    )
    if checks_state != "loaded" and cache_state == "loaded":
        cache_state = "built"
    shapes = np.zeros((n, 2), dtype=np.int64)
    for i, (shape, reason) in zip(todo, checked):
        shapes[i] = shape
        reasons[i] = reason
        h, w = shape
        jw, jh = int(table.widths[i]), int(table.heights[i])
        if not reason and (jw, jh) != (0, 0) and (jw, jh) != (w, h):
            reasons[i] = (
                f"the JSON says {jw}x{jh} pixels (image id {table.image_ids[i]}), the file is {w}x{h}"
            )
    # JSON width/height define the boxes' pixel frame; the file's size when the JSON has none
    frame_w = np.where(table.widths > 0, table.widths, shapes[:, 1])
    frame_h = np.where(table.heights > 0, table.heights, shapes[:, 0])

    usable = np.array([not r for r in reasons], dtype=bool)
    split = split_annotations(table, usable, frame_w, frame_h)
    messages = list(table.messages)
    messages += [f"{paths[i]}: {reasons[i]}" for i in np.flatnonzero(~usable)]
    messages += [
        f"{json_path}: image id {table.image_ids[i]}: bbox {box} has no area inside the "
        f"{int(frame_w[i])}x{int(frame_h[i])} image; dropped"
        for i, box in split.dropped
    ]
    keep_images = np.flatnonzero(usable).tolist()
    labels = [split.labels[i] for i in keep_images]
    crowd = [split.crowd[i] for i in keep_images]
    dropped, clipped = len(split.dropped), split.clipped
    bad = n - len(keep_images)
    logged = [f"skipped: {m}" for m in messages]
    for line in logged[:_MAX_LOGGED_PROBLEMS]:
        log.warning(line)
    if len(logged) > _MAX_LOGGED_PROBLEMS:
        log.warning("... and %d more problems (see the scan report)", len(logged) - _MAX_LOGGED_PROBLEMS)
    if clipped:
        log.info("%s: %d boxes reaching outside their image clipped to it", json_path, clipped)
    report = ScanReport(
        found=n,
        usable=len(keep_images),
        missing_labels=0,
        empty_labels=sum(1 for lab in labels if len(lab) == 0),
        bad=bad,
        duplicate_files=0,
        polygon_files=0,
        boxes=int(sum(len(lab) for lab in labels)),
        messages=messages,
        cache=cache_state,
    )
    if report.boxes == 0:
        raise DataError(
            f"no usable boxes in {json_path}: {n} images ({bad} skipped), {len(table.boxes)} annotations "
            f"({int(table.crowd.sum())} crowd, {dropped} without area)"
            + (f" (first problem: {messages[0]})" if messages else "")
        )
    keep = np.array(keep_images, dtype=np.int64)
    return LabelIndex(
        root=Path(root).resolve(),
        images=[Path(paths[i]) for i in keep_images],
        shapes=shapes[keep].astype(np.int32).reshape(-1, 2),
        labels=labels,
        report=report,
        cache_path=coco_cache_path(cache_dir, table.digest) if cache_state in ("loaded", "built") else None,
        crowd=crowd,
        coco=CocoMeta(
            json_path=json_path,
            image_ids=table.image_ids[keep],
            category_ids=[int(c) for c in table.category_ids],
        ),
    )
