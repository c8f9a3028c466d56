"""What `predict --source` names, turned into the files to read and the frames in them.

A source is one of: an image or video file; a folder (searched recursively, symlinked folders not
followed); a glob (`imgs/*.jpg`, `data/**/*.png`); a `.txt` list with one path per line (blank lines and
`#` comments ignored; relative paths are taken from the list's folder). Only regular files are ever
opened: a FIFO or device named as the source is refused with one line, and one met inside a folder, glob
or list is skipped by name (reading it could block forever or never end).

Images are decoded with their header checked against --max-image-pixels; videos are read with OpenCV,
every `vid_stride`-th frame. Unreadable files and frames come out as `Frame`s with a `problem` instead of
pixels, so the caller names them ("skipped: ...") and goes on.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from yolov5_smddp.data.imageinfo import ImageProblem, decode_checked
from yolov5_smddp.errors import ConfigError, DataError

IMAGE_SUFFIXES = frozenset(
    {".bmp", ".dng", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp", ".pfm"}
)
VIDEO_SUFFIXES = frozenset(
    {".asf", ".avi", ".gif", ".m4v", ".mkv", ".mov", ".mp4", ".mpeg", ".mpg", ".ts", ".wmv"}
)
LIST_SUFFIX = ".txt"
GLOB_CHARACTERS = frozenset("*?[")
MAX_LIST_BYTES = 64 * 2**20  # a list of paths larger than this is not a list of paths
MAX_BAD_FRAMES_IN_A_ROW = 25  # a video whose frames keep failing is given up after this many


@dataclass(frozen=True)
class MediaFile:
    """One file to predict on: `kind` "image" or "video"; `stem` the output name, unique in the run."""

    path: Path
    kind: str
    stem: str


@dataclass(frozen=True)
class Frame:
    """An image (frame None) or one video frame (its 0-based number): BGR uint8 [h, w, 3] pixels, or
    `problem` saying why it could not be read (pixels None); `fps` the video's stated frame rate (0 for
    images and where unknown)."""

    file: MediaFile
    frame: int | None
    pixels: np.ndarray | None
    problem: str | None = None
    fps: float = 0.0

    @property
    def name(self) -> str:
        """How the log names it: the path, and the frame number for a video frame."""
        return str(self.file.path) if self.frame is None else f"{self.file.path} frame {self.frame}"


@dataclass(frozen=True)
class Resolved:
    """The media files a source names, and the entries it named that cannot be read ("path: why")."""

    files: list[MediaFile]
    skipped: list[str]


def file_kind(path: Path) -> str | None:
    """ "image", "video" or None (not a media suffix), by the file's suffix."""
    suffix = path.suffix.lower()
    return "image" if suffix in IMAGE_SUFFIXES else "video" if suffix in VIDEO_SUFFIXES else None


def is_glob(text: str) -> bool:
    return any(c in GLOB_CHARACTERS for c in text)


def not_regular(path: Path) -> str | None:
    """Why `path` (symlinks followed) cannot be read as a file, or None for a regular file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    kinds = (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    )
    what = next((name for test, name in kinds if test(mode)), "a special file")
    return f"is {what}, not a regular file"


def output_stems(paths: list[Path]) -> list[str]:
    """Output names: the file's stem, or stem_suffix where two files share a stem; a number is added
    where even that repeats (same name in two folders)."""
    stems = [p.stem for p in paths]
    names = [f"{p.stem}_{p.suffix.lstrip('.')}" if stems.count(p.stem) > 1 else p.stem for p in paths]
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return unique


def _walk(folder: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs.sort()
        found.extend(Path(root) / name for name in sorted(files))
    return found


def _read_list(path: Path) -> list[Path]:
    with open(path, "rb") as handle:
        data = handle.read(MAX_LIST_BYTES + 1)
    if len(data) > MAX_LIST_BYTES:
        raise DataError(f"--source {path}: a path list larger than {MAX_LIST_BYTES >> 20} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DataError(f"--source {path}: a .txt source must be a UTF-8 list of paths, one a line") from None
    lines = (line.strip() for line in text.splitlines())
    entries = [Path(line) for line in lines if line and not line.startswith("#")]
    return [entry if entry.is_absolute() else path.parent / entry for entry in entries]


def resolve_source(source: str) -> Resolved:
    """The media files `source` names, in order (sorted for folders and globs, as listed for a list).
    Raises ConfigError for a source that is not a regular file or folder, DataError when it names no
    usable file."""
    path = Path(source)
    if is_glob(source) and not path.exists():
        candidates = [Path(p) for p in sorted(glob.glob(source, recursive=True))]
        if not candidates:
            raise DataError(f"--source {source}: no file matches this pattern")
        return _media(candidates, source, listed=False)
    if path.is_dir():
        return _media(_walk(path), source, listed=False)
    problem = not_regular(path)
    if problem == "does not exist":
        raise DataError(f"source {source} does not exist")
    if problem is not None:
        raise ConfigError(
            f"--source {source}: {problem}; give an image, a video, a folder, a glob or a .txt list"
        )
    if path.suffix.lower() == LIST_SUFFIX:
        return _media(_read_list(path), source, listed=True)
    kind = file_kind(path) or "image"  # a single file is tried as an image whatever its name
    return Resolved([MediaFile(path, kind, path.stem)], [])


def _media(candidates: list[Path], source: str, *, listed: bool) -> Resolved:
    """The regular media files among `candidates`. Files of another suffix are left out silently in a
    folder or glob (a folder holds notes and labels too) and by name in a list (the user named them)."""
    chosen, skipped = [], []
    for candidate in candidates:
        if candidate.is_dir() and not listed:
            continue
        kind = file_kind(candidate)
        if kind is None:
            if listed:
                skipped.append(f"{candidate}: not an image or video suffix")
            continue
        problem = not_regular(candidate)
        if problem is not None:
            skipped.append(f"{candidate}: {problem}")
            continue
        chosen.append((candidate, kind))
    if not chosen:
        first = f" (first: {skipped[0]})" if skipped else ""
        suffixes = ", ".join(sorted(IMAGE_SUFFIXES | VIDEO_SUFFIXES))
        raise DataError(f"--source {source}: no image or video file ({suffixes}){first}")
    stems = output_stems([p for p, _ in chosen])
    return Resolved([MediaFile(p, kind, stem) for (p, kind), stem in zip(chosen, stems)], skipped)


def frames(files: list[MediaFile], max_pixels: int, vid_stride: int = 1) -> Iterator[Frame]:
    """Every image of `files` and every `vid_stride`-th frame of each video, in order."""
    for file in files:
        if file.kind == "video":
            yield from _video_frames(file, max_pixels, vid_stride)
        else:
            yield _image(file, max_pixels)


def _image(file: MediaFile, max_pixels: int) -> Frame:

    try:
        return Frame(file, None, decode_checked(file.path, max_pixels))
    except ImageProblem as exc:
        return Frame(file, None, None, str(exc))


def video_info(capture) -> tuple[int, int, float, int]:
    """(width, height, frames per second, frame count) as the container states them (0 when unknown)."""
    import cv2

    fps = capture.get(cv2.CAP_PROP_FPS)
    return (
        int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)),
        int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT)),
        float(fps) if fps and np.isfinite(fps) and fps > 0 else 0.0,
        max(int(capture.get(cv2.CAP_PROP_FRAME_COUNT)), 0),
    )


def _video_frames(file: MediaFile, max_pixels: int, vid_stride: int) -> Iterator[Frame]:
    import cv2

    capture = cv2.VideoCapture(str(file.path))
    try:
        if not capture.isOpened():
            yield Frame(file, None, None, "OpenCV cannot open it as a video")
            return
        width, height, fps, count = video_info(capture)
        if width * height > max_pixels:
            yield Frame(file, None, None, f"{width}x{height} frames exceed --max-image-pixels {max_pixels}")
            return
        index, bad_in_a_row = -1, 0
        while True:
            index += 1
            wanted = index % vid_stride == 0
            ok = capture.grab()
            if ok and wanted:
                ok, pixels = capture.retrieve()
                ok = ok and pixels is not None and pixels.ndim == 3 and pixels.shape[2] == 3
            if ok:
                bad_in_a_row = 0
                if wanted:
                    yield Frame(file, index, pixels, fps=fps)
                continue
            if index >= count:  # the end of the stream (or of an unknown-length one)
                return
            bad_in_a_row += 1
            yield Frame(file, index, None, "could not be decoded")
            if bad_in_a_row >= MAX_BAD_FRAMES_IN_A_ROW:
                yield Frame(
                    file, None, None, f"{bad_in_a_row} frames in a row unreadable; the rest is left out"
                )
                return
    finally:
        capture.release()
