"""Bounds a torch zip checkpoint BEFORE torch (or the release reader) allocates anything for it.

A checkpoint is a zip archive: `<name>/data.pkl` (the pickle) and one `<name>/data/<key>` record per
storage. Two small files can make a reader allocate gigabytes: a record deflate-compressed 1000:1 (torch
inflates it whole), and a pickle whose persistent id declares a storage of 3 GB while its record holds 16
bytes (torch allocates the declared size, then reads). Neither needs code to run, so the allow-lists do
not stop them. `check_torch_file` refuses both from what the archive declares, without unpickling
anything into real objects:

- the zip's directory: every record's uncompressed size is declared; together they may be at most
  `MAX_EXPANSION` times the file's size (+1 MiB): torch.save and the release store records uncompressed,
  so a real checkpoint is ~1x, and nothing is ever inflated to find out;
- the pickle (at most `MAX_PICKLE_BYTES`, read through a bounded inflate) is walked by an inspecting
  unpickler whose globals are all inert records (nothing is imported or called): every storage it
  declares must match its record's size exactly, and every tensor must view no more elements than its
  storage holds (a stride-0 view of a 3 GB shape on a 4-value storage is refused).

`torch_error_line` turns torch's load errors into one line, without the multi-line `weights_only`
advice (which must not be followed for a file we did not write).
"""

from __future__ import annotations

import io
import math
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yolov5_smddp.errors import WeightsError
from yolov5_smddp.files.bounded_read import shown

MAX_EXPANSION = 4
"""The declared uncompressed size of all records, as a multiple of the file's size (+ 1 MiB)."""
MAX_PICKLE_BYTES = 64 << 20
"""A checkpoint's data.pkl: ~100 KB for a YOLOv5 model, ~1 MB with an optimizer's state."""

_ITEM_BYTES = {
    "UntypedStorage": 1,
    "ByteStorage": 1,
    "CharStorage": 1,
    "BoolStorage": 1,
    "QUInt8Storage": 1,
    "QInt8Storage": 1,
    "Float8_e4m3fnStorage": 1,
    "Float8_e5m2Storage": 1,
    "HalfStorage": 2,
    "BFloat16Storage": 2,
    "ShortStorage": 2,
    "FloatStorage": 4,
    "IntStorage": 4,
    "QInt32Storage": 4,
    "DoubleStorage": 8,
    "LongStorage": 8,
    "ComplexFloatStorage": 8,
    "ComplexDoubleStorage": 16,
}
_TENSOR_REBUILDS = ("torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor")


class _Refused(Exception):
    """A declared size the checks above refuse; the message says which."""


class _Inert:
    """Stands for any global the pickle names: records nothing, does nothing, accepts what the pickle
    protocol does to objects (calls, state, items)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


@dataclass(frozen=True)
class _Storage:
    """A storage as its persistent id declares it."""

    key: str
    type_name: str
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * _ITEM_BYTES[self.type_name]


class _InspectingUnpickler(pickle.Unpickler):
    """Walks a checkpoint pickle: storages from the persistent ids, tensor views from the rebuild calls;
    every other global is an inert class (never imported)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.storages: dict[str, _Storage] = {}
        self.views: list[tuple[_Storage, Any, Any, Any]] = []
        self._classes: dict[str, type] = {}

    def find_class(self, module: str, name: str) -> Any:
        qualname = f"{module}.{name}"
        if qualname in _TENSOR_REBUILDS:
            return self._view
        if qualname not in self._classes:
            self._classes[qualname] = type(name, (_Inert,), {"qualname": qualname})
        return self._classes[qualname]

    def _view(self, storage: Any, offset: Any = 0, size: Any = (), stride: Any = (), *_: Any) -> _Inert:
        if isinstance(storage, _Storage):
            self.views.append((storage, offset, size, stride))
        return _Inert()

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _Refused(f"an unknown persistent id {str(pid)[:80]}")
        _, storage_type, key, _location, numel = pid
        type_name = getattr(storage_type, "qualname", str(storage_type)).rsplit(".", 1)[-1]
        if type_name not in _ITEM_BYTES:
            raise _Refused(f"storage {str(key)[:40]} has the unknown type {type_name[:60]}")
        if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
            raise _Refused(f"storage {str(key)[:40]} declares {str(numel)[:40]} elements")
        storage = _Storage(str(key), type_name, numel)
        if self.storages.setdefault(storage.key, storage) != storage:
            raise _Refused(f"storage {storage.key} is declared twice with different sizes")
        return storage


def _ints(values: Any) -> tuple[int, ...] | None:
    if not isinstance(values, tuple | list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    ):
        return None
    return tuple(values)


def _check_views(views: list[tuple[_Storage, Any, Any, Any]]) -> None:
    """Each tensor views at most the elements its storage holds (no broadcast views) and lies inside it."""
    for storage, offset, size, stride in views:
        shape, steps = _ints(size), _ints(stride)
        if shape is None or steps is None or len(shape) != len(steps) or not isinstance(offset, int):
            raise _Refused(f"a tensor of storage {storage.key} has a malformed size/stride {str(size)[:60]}")
        numel = math.prod(shape)
        extent = offset + sum((n - 1) * s for n, s in zip(shape, steps)) + 1 if numel else 0
        if numel > storage.numel or extent > storage.numel or offset < 0:
            raise _Refused(
                f"a tensor of shape {list(shape)[:8]} ({numel:,} elements) views storage {storage.key}, "
                f"which declares {storage.numel:,}; a saved tensor never views more than its storage holds"
            )


def check_torch_file(path: Path | str) -> None:
    """Refuse (WeightsError, one line naming the file and the size) a torch zip checkpoint whose declared
    sizes exceed what the file can hold; see the module docstring. Reads the zip directory and the
    pickle only."""
    path = Path(path)
    where = shown(path)
    try:
        file_bytes = path.stat().st_size
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            declared = sum(info.file_size for info in infos)
            limit = MAX_EXPANSION * file_bytes + (1 << 20)
            if declared > limit:
                biggest = max(infos, key=lambda info: info.file_size)
                raise _Refused(
                    f"its records declare {declared:,} bytes uncompressed (e.g. {biggest.filename}: "
                    f"{biggest.file_size:,} bytes stored in {biggest.compress_size:,}), over the limit of "
                    f"{limit:,} for a {file_bytes:,}-byte file ({MAX_EXPANSION}x its size + 1 MiB)"
                )
            pickles = [
                info for info in infos if info.filename.endswith("data.pkl") and info.filename.count("/") == 1
            ]
            if len(pickles) != 1:
                raise _Refused(f"not a torch zip archive (found {len(pickles)} data.pkl records)")
            if pickles[0].file_size > MAX_PICKLE_BYTES:
                raise _Refused(
                    f"its pickle declares {pickles[0].file_size:,} bytes, over the limit of {MAX_PICKLE_BYTES:,}"
                )
            with archive.open(pickles[0]) as f:
                data = f.read(MAX_PICKLE_BYTES + 1)
            prefix = pickles[0].filename.removesuffix("data.pkl")
            sizes = {info.filename: info.file_size for info in infos}
    except _Refused as exc:
        raise WeightsError(f"{where}: {exc}") from None
    except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
        raise WeightsError(
            f"{where}: not a readable torch zip archive ({type(exc).__name__}: {exc})"
        ) from None
    unpickler = _InspectingUnpickler(data)
    try:
        unpickler.load()  # noqa: S301 - every global is an inert class, nothing is imported or called
        for storage in unpickler.storages.values():
            record = f"{prefix}data/{storage.key}"
            if record not in sizes:
                raise _Refused(f"storage record data/{storage.key} is missing from the archive")
            if storage.nbytes != sizes[record]:
                raise _Refused(
                    f"storage data/{storage.key} declares {storage.numel:,} {storage.type_name} elements "
                    f"({storage.nbytes:,} bytes) but its record holds {sizes[record]:,} bytes"
                )
        _check_views(unpickler.views)
    except _Refused as exc:
        raise WeightsError(f"{where}: refused before loading: {exc}") from None
    except Exception as exc:  # a malformed pickle raises many types; torch would refuse it too
        raise WeightsError(f"{where}: unreadable checkpoint pickle ({type(exc).__name__}: {exc})") from None


_ADVICE = (
    "weights_only",
    "Re-running",
    "Check the documentation",
    "add_safe_globals",
    "trust the source",
    "file an issue",
)


def torch_error_line(exc: BaseException) -> str:
    """One line of a torch.load error: for a weights_only refusal the unpickler's reason ("Unsupported
    global: GLOBAL os.system ...", "Trying to load unsupported GLOBAL posix.system ..."), never torch's
    advice on how to load the file anyway (its wording differs between torch versions)."""
    text = str(exc)
    _, found, reason = text.partition("WeightsUnpickler error:")
    lines = [line.strip() for line in (reason if found else text).splitlines()]
    lines = [line.split(". Please ", 1)[0].rstrip(".") for line in lines if line]
    lines = [line for line in lines if not any(marker in line for marker in _ADVICE)]
    first = lines[0] if lines else type(exc).__name__
    return first if len(first) <= 300 else first[:300] + "..."
