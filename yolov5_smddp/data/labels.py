"""Image/label discovery and parallel verification → LabelIndex.

Discovery: a source is a folder (searched recursively for image files), a list file (.txt, one image
path per line; relative entries resolve against the LIST FILE's folder) or one image. The label of an
image is its path with the last `/images/` replaced by `/labels/` and the extension by `.txt`. The search
follows links to folders (also outside the dataset) but enters each folder once, by (st_dev, st_ino): a
link cycle or a second link to a folder is named in one warning, never walked again.

Only regular files are read: an image or label that is a FIFO, a device or a socket is skipped by name
without being opened, and a label file over `MAX_LABEL_BYTES` is skipped unread. Rows of zero width or
height are dropped and counted (`ScanReport.degenerate_files`), like duplicate rows. Names that are not
UTF-8 are shown escaped (`bounded_read.shown`).

Verification reads every image header (size, truncation) and parses every label file. Each problem is
reported once with its file and reason and the pair is skipped; duplicate rows are dropped (reported),
polygon rows become their enclosing box, missing or empty label files make background images (counted).
An image whose header claims more than `max_pixels` pixels is skipped before anything decodes it.

A split that is one COCO instances `.json` is indexed by `data.coco` instead (same LabelIndex, plus
crowd regions and the JSON's ids).

Nothing is ever written under a dataset: our cache file (see `cache`) goes to `cache_dir` only (default
`cache.choose_cache_dir`), named by the sources and the content, so it survives relocation.
"""

from __future__ import annotations

import logging
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import IntFlag
from pathlib import Path

import numpy as np

from yolov5_smddp.data.cache import (
    CacheRejected,
    ScanTable,
    built_under,
    cache_file_name,
    choose_cache_dir,
    content_digest,
    describe_foreign_cache,
    label_hash,
    load_cache,
    save_cache,
    sibling_caches,
    sources_digest,
    stale_reason,
)
from yolov5_smddp.data.coco import build_coco_index, is_coco_json
from yolov5_smddp.data.content_mark import image_marks
from yolov5_smddp.data.imageinfo import DEFAULT_MAX_PIXELS, ImageProblem, read_image_info
from yolov5_smddp.data.index import LabelIndex, ScanReport
from yolov5_smddp.errors import DataError
from yolov5_smddp.files.bounded_read import UnreadableFile, read_limited, shown

log = logging.getLogger(__name__)

IMG_FORMATS = ("bmp", "dng", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp", "pfm")
CACHE_POLICIES = ("rebuild", "strict")
_COORD_TOLERANCE = 1e-6
_MAX_LOGGED_PROBLEMS = 20
MAX_LABEL_BYTES = 1 << 20
"""1 MiB per label file: ~25,000 boxes, far above any real image's; a larger file is skipped unread."""
MAX_LIST_BYTES = 256 << 20
"""A .txt list of image paths: 256 MiB (~2.5 M paths)."""
_CHUNK = 128
MAX_SCAN_WORKERS = 16  # the scan is I/O and decode-header bound; more threads stop helping


def scan_workers(cpu_count: int) -> int:
    """Threads for a label scan on a host with `cpu_count` CPUs (the pre-launch check and every rank)."""
    return max(1, min(cpu_count, MAX_SCAN_WORKERS))


_SEP_IMAGES, _SEP_LABELS = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"


class PairFlag(IntFlag):
    """What the scan found for one image/label pair."""

    MISSING_LABEL = 1
    EMPTY_LABEL = 2
    BAD_IMAGE = 4
    BAD_LABEL = 8
    DUPLICATES = 16
    POLYGONS = 32
    DEGENERATE = 64  # rows of zero width or height, dropped


def _label_str(image: str) -> str:
    head, found, tail = image.rpartition(_SEP_IMAGES)
    if found:
        image = head + _SEP_LABELS + tail
    return os.path.splitext(image)[0] + ".txt"


def label_path_for(image: Path) -> Path:
    """`.../images/.../x.jpg` → `.../labels/.../x.txt` (the LAST `/images/` is replaced)."""
    return Path(_label_str(str(image)))


def _is_image(name: str) -> bool:
    return os.path.splitext(name)[1][1:].lower() in IMG_FORMATS


def _walk_images(top: str) -> tuple[list[str], list[str]]:
    """(image files under the folder `top`, folders not entered). Links to folders are followed, wherever
    they point, but a folder already visited through another path (a link cycle, or two links to one
    folder) is not entered again, so a looping link cannot multiply the images or recurse forever."""
    images, repeated = [], []
    seen: set[tuple[int, int]] = set()
    pending = [top]
    while pending:
        folder = pending.pop()
        try:
            st = os.stat(folder)
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            repeated.append(f"{shown(folder)} ({exc.strerror or exc})")
            continue
        if (st.st_dev, st.st_ino) in seen:
            repeated.append(f"{shown(folder)} (already visited: a link cycle or a second link to it)")
            continue
        seen.add((st.st_dev, st.st_ino))
        for entry in entries:
            if entry.is_dir():  # follows links; False for a broken or looping link
                pending.append(entry.path)
            elif _is_image(entry.name):
                images.append(entry.path)
    return images, repeated


def _list_image_strs(sources: list[Path]) -> list[str]:
    found: set[str] = set()
    for source in sources:
        source = Path(source)
        if source.is_dir():
            images, repeated = _walk_images(str(source))
            found.update(images)
            if repeated:
                log.warning(
                    "%s: %d folder(s) not entered during the image search, e.g. %s",
                    shown(source),
                    len(repeated),
                    repeated[0],
                )
        elif source.is_file() and source.suffix == ".txt":
            try:
                text = read_limited(source, MAX_LIST_BYTES, what="image list").decode(
                    "utf-8", "surrogateescape"
                )
            except (OSError, UnreadableFile) as exc:
                raise DataError(f"image list {shown(source)}: {exc}") from None
            for line in text.splitlines():
                entry = line.strip()
                if entry:
                    found.add(entry if os.path.isabs(entry) else os.path.join(source.parent, entry))
        elif source.is_file() and _is_image(source.name):
            found.add(str(source))
        else:
            raise DataError(f"image source {shown(source)} is not a folder, a .txt list file or an image")
    return sorted({os.path.abspath(p) for p in found})


def list_images(sources: list[Path]) -> list[Path]:
    """Absolute image paths from folders, list files and images, sorted and without duplicates."""
    return [Path(p) for p in _list_image_strs(sources)]


def parse_label(data: bytes, nc: int) -> tuple[np.ndarray, PairFlag, str]:
    """Label file bytes → (float32 [n, 5] rows, flags, reason).

    Raises ValueError with the reason when the file is unusable (columns, non-numeric, ranges, class).
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not a UTF-8 text file") from None
    rows, flags, degenerate = [], PairFlag(0), 0
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 5 or (len(fields) > 5 and len(fields) % 2 == 0):
            raise ValueError(
                f"line {number}: {len(fields)} values, expected 5 (class xc yc w h) or a polygon (class x1 y1 x2 y2 ...)"
            )
        try:
            values = [float(v) for v in fields]
        except ValueError:
            bad = next(v for v in fields if not _is_float(v))
            raise ValueError(f"line {number}: non-numeric value {bad!r}") from None
        if not all(map(math.isfinite, values)):
            raise ValueError(f"line {number}: non-finite value")
        cls = values[0]
        if cls < 0 or cls != int(cls):
            raise ValueError(f"line {number}: class id {fields[0]} is not a non-negative integer")
        if cls >= nc:
            raise ValueError(f"line {number}: class id {int(cls)} >= nc {nc}")
        coords = values[1:]
        low, high = min(coords), max(coords)
        if low < 0:
            raise ValueError(f"line {number}: negative coordinate {low:g}")
        if high > 1 + _COORD_TOLERANCE:
            raise ValueError(
                f"line {number}: coordinate {high:g} out of range [0, 1] (labels must be normalised)"
            )
        if len(fields) > 5:
            xs, ys = coords[0::2], coords[1::2]
            x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
            coords = [(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0]
            flags |= PairFlag.POLYGONS
        if coords[2] <= 0 or coords[3] <= 0:
            degenerate += 1
            continue
        rows.append((cls, *(min(c, 1.0) for c in coords)))
    reasons = []
    if degenerate:
        reasons.append(f"{degenerate} boxes of zero width or height dropped")
        flags |= PairFlag.DEGENERATE
    if not rows:
        return np.zeros((0, 5), np.float32), flags | PairFlag.EMPTY_LABEL, "; ".join(reasons)
    unique = list(dict.fromkeys(rows))  # keeps the first of each duplicate, in file order
    if len(unique) < len(rows):
        reasons.append(f"{len(rows) - len(unique)} duplicate rows dropped")
        flags |= PairFlag.DUPLICATES
    return np.array(unique, dtype=np.float32), flags, "; ".join(reasons)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class _PairResult:
    shape: tuple[int, int]
    flags: PairFlag
    reason: str
    labels: np.ndarray


def _verify_pair(image: str, label_data: bytes | OSError | None, nc: int, max_pixels: int) -> _PairResult:
    empty = np.zeros((0, 5), np.float32)
    try:
        shape, _ = read_image_info(image, max_pixels)
    except ImageProblem as exc:
        return _PairResult((0, 0), PairFlag.BAD_IMAGE, str(exc), empty)
    if label_data is None:
        return _PairResult(shape, PairFlag.MISSING_LABEL, "", empty)
    if isinstance(label_data, UnreadableFile):
        return _PairResult((0, 0), PairFlag.BAD_LABEL, str(label_data), empty)
    if isinstance(label_data, OSError):
        return _PairResult(
            (0, 0), PairFlag.BAD_LABEL, f"cannot be read: {label_data.strerror or label_data}", empty
        )
    try:
        labels, flags, reason = parse_label(label_data, nc)
    except ValueError as exc:
        return _PairResult((0, 0), PairFlag.BAD_LABEL, str(exc), empty)
    return _PairResult(shape, flags, reason, labels)


def _read_fingerprint(image: str) -> tuple[int, bytes | OSError | None]:
    """(image size in bytes or -1 when it cannot be stat'ed, label bytes, None when absent, or the error)."""
    try:
        size = os.stat(image).st_size
    except OSError:
        size = -1
    try:
        data = read_limited(_label_str(image), MAX_LABEL_BYTES, what="label file")
    except FileNotFoundError:
        data = None
    except (OSError, UnreadableFile) as exc:
        data = exc
    return size, data


def _read_fingerprints(images: list[str]) -> list[tuple[int, bytes | OSError | None]]:
    return [_read_fingerprint(img) for img in images]


def _parallel(fn, items: list, workers: int) -> list:
    """fn over `items` in chunks on a thread pool (file I/O releases the GIL), results in order."""
    if workers <= 1 or len(items) <= _CHUNK:
        return fn(items)
    chunks = [items[i : i + _CHUNK] for i in range(0, len(items), _CHUNK)]
    with ThreadPoolExecutor(workers) as pool:
        return [result for chunk in pool.map(fn, chunks) for result in chunk]


def _fingerprint_hash(data: bytes | OSError | UnreadableFile | None) -> str:
    if data is None:
        return ""
    return label_hash(data if isinstance(data, bytes) else str(data).encode())


def _relative(path: str, root: str) -> str:
    prefix = root.rstrip(os.sep) + os.sep
    if path.startswith(prefix):
        return path[len(prefix) :].replace(os.sep, "/")
    return os.path.relpath(path, root).replace(os.sep, "/")


def _foreign_cache_candidates(sources: list[Path], images: list[str]) -> list[Path]:
    """Where the release writes its cache: next to a list file, or `<labels folder>.cache`."""
    candidates = {Path(s).with_suffix(".cache") for s in sources if Path(s).is_file()}
    label_dirs = {os.path.dirname(_label_str(img)) for img in images}
    candidates |= {Path(d).with_suffix(".cache") for d in label_dirs}
    return sorted(p for p in candidates if p.is_file())


def build_label_index(
    sources: list[Path],
    *,
    nc: int,
    root: Path,
    cache_policy: str = "rebuild",
    cache_dir: Path | None = None,
    workers: int = 8,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    image_dir: Path | None = None,
) -> LabelIndex:
    """Discover, verify (or load from our cache) and index the pairs under `sources`.

    A split that is one COCO instances JSON is indexed by `coco.build_coco_index` (`image_dir`: the
    folder its `file_name`s are relative to; None: the JSON's folder).

    `cache_dir`: where our cache is read and written (None: `cache.choose_cache_dir`'s default); nothing is
    written anywhere else. `cache_policy` "rebuild": a foreign cache, or ours built for older contents of
    this root, is reported in one log line and ignored (ours is rebuilt); "strict": either is a DataError
    naming the file. `max_pixels`: images whose header claims more pixels are skipped. Raises DataError
    when no images are found or no pair has a usable label.
    """
    if cache_policy not in CACHE_POLICIES:
        raise DataError(f"cache policy {cache_policy!r} is not one of {CACHE_POLICIES}")
    root = Path(root).resolve()
    cache_dir = choose_cache_dir(cache_dir)
    if any(is_coco_json(s) for s in sources):
        if len(sources) != 1:
            raise DataError(
                f"a split is either one COCO JSON or image folders/list files, got {[str(s) for s in sources]}"
            )
        return build_coco_index(
            Path(sources[0]),
            nc=nc,
            root=root,
            image_dir=image_dir,
            cache_dir=cache_dir,
            workers=workers,
            max_pixels=max_pixels,
        )
    images = _list_image_strs(sources)
    if not images:
        where = ", ".join(shown(s) for s in sources)
        raise DataError(f"no images found in {where} (looked for files ending in {', '.join(IMG_FORMATS)})")

    for foreign in _foreign_cache_candidates(sources, images):
        message = describe_foreign_cache(foreign)
        if cache_policy == "strict":
            raise DataError(f"strict cache policy: {message}")
        log.warning(message)

    workers = min(workers, os.cpu_count() or 1)
    fingerprints = _parallel(_read_fingerprints, images, workers)
    root_str = str(root)
    rel_images = [_relative(img, root_str) for img in images]
    image_bytes = np.array([size for size, _ in fingerprints], dtype=np.int64)
    hashes = [_fingerprint_hash(data) for _, data in fingerprints]
    marks = _parallel(image_marks, images, workers)

    by_sources = sources_digest(sorted(_relative(str(s), root_str) for s in sources))
    content = content_digest(rel_images, image_bytes, hashes, nc=nc, max_pixels=max_pixels, image_marks=marks)
    target = cache_dir / cache_file_name(by_sources, content)
    table = _load_valid(target, rel_images, image_bytes, hashes, cache_policy, marks)
    if table is not None:
        return _index_from_table(table, images, root, sources, target, "loaded")

    stale = _stale_siblings(
        target, by_sources, root_str, rel_images, image_bytes, hashes, cache_policy, marks
    )
    with ThreadPoolExecutor(max(workers, 1)) as pool:
        n = len(images)
        results = list(
            pool.map(
                _verify_pair, images, [d for _, d in fingerprints], [nc] * n, [max_pixels] * n, chunksize=64
            )
        )
    table = ScanTable(
        images=rel_images,
        image_bytes=image_bytes,
        label_hashes=hashes,
        shapes=np.array([r.shape for r in results], dtype=np.int32).reshape(-1, 2),
        flags=np.array([int(r.flags) for r in results], dtype=np.uint8),
        reasons=[r.reason for r in results],
        counts=np.array([len(r.labels) for r in results], dtype=np.int32),
        labels=np.concatenate([r.labels for r in results]) if results else np.zeros((0, 5), np.float32),
        image_marks=marks,
    )
    cache_path, cache_state = _write_cache(table, root, target, stale)
    return _index_from_table(table, images, root, sources, cache_path, cache_state)


def _load_valid(
    path: Path,
    images: list[str],
    image_bytes: np.ndarray,
    hashes: list[str],
    cache_policy: str,
    marks: list[str] | None = None,
) -> ScanTable | None:
    """Our cache at `path` when it exists and describes the files, else None (a bad one is reported)."""
    if not path.is_file():
        return None
    try:
        cached = load_cache(path)
        reason = stale_reason(cached, images, image_bytes, hashes, marks)
    except CacheRejected as exc:
        reason = str(exc)
    if reason is None:
        return cached
    if cache_policy == "strict":
        raise DataError(f"strict cache policy: label cache {path} is stale: {reason}")
    log.info("label cache %s is stale (%s); rebuilding", path, reason)
    return None


def _stale_siblings(
    target: Path,
    sources: str,
    root: str,
    images: list[str],
    image_bytes: np.ndarray,
    hashes: list[str],
    cache_policy: str,
    marks: list[str] | None = None,
) -> list[Path]:
    """Our caches for the same sources built under this same root for files that have changed since:
    each is reported (strict: a DataError) and returned, to be replaced by `target`. Siblings built under
    another root may belong to another dataset laid out the same way, and those describing these very
    files (scanned with another class count or pixel limit) are still valid: both are left alone."""
    stale = []
    for path in sibling_caches(target.parent, sources, exclude=target):
        if built_under(path) != root:
            continue
        try:
            reason = stale_reason(load_cache(path), images, image_bytes, hashes, marks)
        except CacheRejected as exc:
            reason = str(exc)
        if reason is None:
            continue
        if cache_policy == "strict":
            raise DataError(f"strict cache policy: label cache {path} is stale: {reason}")
        log.info("label cache %s is stale (%s); rebuilding", path, reason)
        stale.append(path)
    return stale


def _write_cache(table: ScanTable, root: Path, target: Path, stale: list[Path]) -> tuple[Path | None, str]:
    """Write `table` to `target` (the cache folder is created) and remove the `stale` caches it replaces."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        save_cache(target, table, root=root)
    except OSError as exc:
        why = f"{target}: {exc.strerror or exc}"
        log.warning("label cache not written (the scan is repeated next time): %s", why)
        return None, f"built (not written: {why})"
    for old in stale:
        try:
            old.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("stale label cache %s not removed: %s", old, exc.strerror or exc)
    return target, "built"


def _index_from_table(
    table: ScanTable,
    images: list[str],
    root: Path,
    sources: list[Path],
    cache_path: Path | None,
    cache_state: str,
) -> LabelIndex:
    flags = table.flags
    bad = (flags & (PairFlag.BAD_IMAGE | PairFlag.BAD_LABEL)) != 0
    offsets = np.concatenate([[0], np.cumsum(table.counts)])
    messages, logged = [], []
    noted = PairFlag.BAD_IMAGE | PairFlag.BAD_LABEL | PairFlag.DUPLICATES | PairFlag.DEGENERATE
    for i in np.flatnonzero((flags & noted) != 0):
        about = shown(images[i] if flags[i] & PairFlag.BAD_IMAGE else _label_str(images[i]))
        messages.append(f"{about}: {table.reasons[i]}")
        logged.append(("skipped: " if bad[i] else "") + messages[-1])
    keep = np.flatnonzero(~bad)
    labels = [table.labels[offsets[i] : offsets[i + 1]] for i in keep]
    report = ScanReport(
        found=len(images),
        usable=len(keep),
        missing_labels=int(((flags & PairFlag.MISSING_LABEL) != 0).sum()),
        empty_labels=int(((flags & PairFlag.EMPTY_LABEL) != 0).sum()),
        bad=int(bad.sum()),
        duplicate_files=int(((flags & PairFlag.DUPLICATES) != 0).sum()),
        polygon_files=int(((flags & PairFlag.POLYGONS) != 0).sum()),
        degenerate_files=int(((flags & PairFlag.DEGENERATE) != 0).sum()),
        boxes=int(sum(len(lb) for lb in labels)),
        messages=messages,
        cache=cache_state,
    )
    for line in logged[:_MAX_LOGGED_PROBLEMS]:
        log.warning(line)
    if len(messages) > _MAX_LOGGED_PROBLEMS:
        log.warning("... and %d more problems (see the scan report)", len(messages) - _MAX_LOGGED_PROBLEMS)
    if report.boxes == 0:
        where = ", ".join(shown(s) for s in sources)
        example = shown(_label_str(images[0]))
        raise DataError(
            f"no usable labels in {where}: looked for one .txt per image with /images/ replaced by /labels/ "
            f"(e.g. {example}); {report.found} images, {report.missing_labels} without a label file, "
            f"{report.empty_labels} empty, {report.bad} unusable"
            + (f" (first problem: {messages[0]})" if messages else "")
        )
    return LabelIndex(
        root=root,
        images=[Path(images[i]) for i in keep],
        shapes=table.shapes[keep],
        labels=labels,
        report=report,
        cache_path=cache_path,
    )


def collapse_to_one_class(index: LabelIndex) -> None:
    """Every label of `index` (and COCO crowd region) given class 0, in place: the release's --single-cls."""
    index.labels[:] = [np.concatenate((np.zeros_like(lab[:, :1]), lab[:, 1:]), 1) for lab in index.labels]
    if index.crowd is not None:
        index.crowd[:] = [np.concatenate((np.zeros_like(c[:, :1]), c[:, 1:]), 1) for c in index.crowd]
