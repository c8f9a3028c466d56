"""Hostile checkpoint files (issue 42): small files that declare gigabytes, and refusals in one line.

The files are built here: a zip laid out as torch.save writes it (data.pkl + data/<key> records) whose
pickle names torch's own rebuild function and storage type, so torch itself would load them. Loading
runs in a child process that reports how far the load raised its peak RSS (VmHWM) over the peak it had
with torch and our code imported, since the point is what torch would allocate, not what its import costs
(torch 2.15's import alone peaks at ~530 MB). The peak is VmHWM of /proc/self/status: getrusage's
ru_maxrss would also count the peak of the forked pytest process before the exec (Linux keeps the larger)."""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from child_python import run_python

from yolov5_smddp.errors import WeightsError
from yolov5_smddp.models.torchfile import MAX_EXPANSION, check_torch_file, torch_error_line
from yolov5_smddp.models.weights import load_weights
from yolov5_smddp.train.checkpoint import load_checkpoint

PEAK_RISE_LIMIT_MB = 150  # a refused bomb allocates (almost) nothing; each bomb here claims >= 512 MiB


class _Storage:
    def __init__(self, key: str, numel: int) -> None:
        self.key, self.numel = key, numel


class _Tensor:
    def __init__(self, storage: _Storage, size: tuple, stride: tuple) -> None:
        self.storage, self.size, self.stride = storage, size, stride


class _TorchLikePickler(pickle.Pickler):
    """Pickles _Tensor / _Storage as torch.save does: _rebuild_tensor_v2 over a persistent storage id."""

    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel)
        return None

    def reducer_override(self, obj):
        if isinstance(obj, _Tensor):
            args = (obj.storage, 0, obj.size, obj.stride, False, collections.OrderedDict())
            return (torch._utils._rebuild_tensor_v2, args)
        return NotImplemented


def _write(path: Path, obj: object, records: dict[str, bytes], deflate_zeros: int = 0) -> Path:
    buffer = io.BytesIO()
    _TorchLikePickler(buffer, protocol=2).dump(obj)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", buffer.getvalue())
        archive.writestr("archive/byteorder", b"little")
        for key, data in records.items():
            archive.writestr(f"archive/data/{key}", data)
        if deflate_zeros:  # one record of zeros, deflate-compressed ~1000:1, written in chunks
            info = zipfile.ZipInfo("archive/data/0")
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w", force_zip64=True) as f:
                chunk = bytes(16 << 20)
                for start in range(0, deflate_zeros, len(chunk)):
                    f.write(chunk[: min(len(chunk), deflate_zeros - start)])
        archive.writestr("archive/version", b"3\n")
    return path


def deflate_bomb(path: Path, nbytes: int) -> Path:
    """A float tensor of `nbytes` whose record is deflated zeros (nbytes / ~1000 on disk)."""
    numel = nbytes // 4
    return _write(path, {"w": _Tensor(_Storage("0", numel), (numel,), (1,))}, {}, deflate_zeros=nbytes)


def claimed_storage(path: Path, nbytes: int) -> Path:
    """A persistent id declaring a storage of `nbytes` over a 16-byte record."""
    numel = nbytes // 4
    return _write(path, {"w": _Tensor(_Storage("0", numel), (numel,), (1,))}, {"0": bytes(16)})


def stride_zero_view(path: Path, nbytes: int) -> Path:
    """A tensor of `nbytes` viewing a 4-value storage with stride 0."""
    numel = nbytes // 4
    return _write(path, {"w": _Tensor(_Storage("0", 4), (numel,), (0,))}, {"0": bytes(16)})


def _load_in_child(path: Path, loader: str = "weights") -> dict:
    code = (
        "import json, sys\n"
        "from yolov5_smddp.errors import UserError\n"
        "from yolov5_smddp.models.weights import load_weights\n"
        "from yolov5_smddp.train.checkpoint import load_checkpoint\n"
        "def peak_mb():\n"
        "    return int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]) / 1024  # kB -> MB\n"
        "baseline = peak_mb()  # the peak with torch and our code imported\n"
        "try:\n"
        "    (load_weights if sys.argv[2] == 'weights' else load_checkpoint)(sys.argv[1]); error = None\n"
        "except UserError as exc:\n"
        "    error = str(exc)\n"
        "print(json.dumps({'error': error, 'peak_rise_mb': peak_mb() - baseline}))\n"
    )
    done = run_python(code, path, loader, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_deflate_bomb_is_refused_from_the_zip_directory_alone(tmp_path):
    path = deflate_bomb(tmp_path / "bomb.pt", 512 << 20)  # 512 MiB of zeros in ~0.5 MB
    size = path.stat().st_size
    assert size < 1 << 20
    stored = zipfile.ZipFile(path).getinfo("archive/data/0").compress_size
    result = _load_in_child(path)
    assert result["error"] == (
        f"{path}: its records declare {(512 << 20) + 176:,} bytes uncompressed (e.g. archive/data/0: "
        f"{512 << 20:,} bytes stored in {stored:,}), over the limit of {MAX_EXPANSION * size + (1 << 20):,} "
        f"for a {size:,}-byte file ({MAX_EXPANSION}x its size + 1 MiB)"
    )
    assert result["peak_rise_mb"] < PEAK_RISE_LIMIT_MB


@pytest.mark.parametrize("loader", ["weights", "checkpoint"])
def test_a_3_gb_storage_claim_in_a_tiny_file_allocates_nothing(tmp_path, loader):
    path = claimed_storage(tmp_path / "claim.pt", 3_000_000_000)
    assert path.stat().st_size < 2000
    result = _load_in_child(path, loader)
    assert (
        f"{path}: refused before loading: storage data/0 declares 750,000,000 FloatStorage elements "
        f"(3,000,000,000 bytes) but its record holds 16 bytes"
    ) in result["error"]
    assert "\n" not in result["error"]
    assert result["peak_rise_mb"] < PEAK_RISE_LIMIT_MB


def test_a_stride_zero_view_of_3_gb_is_refused(tmp_path):
    path = stride_zero_view(tmp_path / "view.pt", 3_000_000_000)
    with pytest.raises(WeightsError) as caught:
        load_weights(path)
    assert str(caught.value) == (
        f"{path}: refused before loading: a tensor of shape [750000000] (750,000,000 elements) views "
        f"storage 0, which declares 4; a saved tensor never views more than its storage holds"
    )


def test_real_torch_files_pass_the_check(tmp_path):
    path = tmp_path / "real.pt"
    torch.save(
        {"a": torch.arange(12.0).view(3, 4)[:, 1:], "b": torch.zeros(0), "c": torch.ones(2).half()}, path
    )
    check_torch_file(path)
    assert load_weights(path).state_dict["a"].tolist() == [[1, 2, 3], [5, 6, 7], [9, 10, 11]]


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("true",))


def test_a_code_running_checkpoint_is_refused_in_one_line_without_torch_advice(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": "yolov5-smddp/checkpoint/v1", "x": _RunsCode()}, path)
    for load in (load_weights, load_checkpoint):
        with pytest.raises(WeightsError) as caught:
            load(path)
        text = str(caught.value)
        assert "\n" not in text and "weights_only" not in text and "add_safe_globals" not in text
        assert "posix.system" in text


def test_torch_error_line_keeps_the_reason_only():
    advice = (
        "Weights only load failed. This file can still be loaded, to do so you have two options, do those "
        "steps only if you trust the source of the checkpoint.\n\t(1) Re-running `torch.load` with "
        "`weights_only` set to `False` ...\n\t(2) Alternatively ...\n WeightsUnpickler error: Unsupported "
        "global: GLOBAL posix.system was not an allowed global by default. Please use "
        "`torch.serialization.add_safe_globals([system])` to allowlist this global.\n\nCheck the documentation"
    )
    assert torch_error_line(pickle.UnpicklingError(advice)) == (
        "Unsupported global: GLOBAL posix.system was not an allowed global by default"
    )
    assert torch_error_line(RuntimeError("PytorchStreamReader failed\nmore")) == "PytorchStreamReader failed"
    torch_25 = (
        "Weights only load failed. Re-running `torch.load` with `weights_only` set to `False` will likely "
        "succeed, but it can result in arbitrary code execution. Do it only if you got the file from a trusted "
        "source.\nTrying to load unsupported GLOBAL posix.system whose module posix is blocked.\n\nCheck the "
        "documentation of torch.load to learn more about types accepted by default with weights_only https://x."
    )
    assert torch_error_line(pickle.UnpicklingError(torch_25)) == (
        "Trying to load unsupported GLOBAL posix.system whose module posix is blocked"
    )
