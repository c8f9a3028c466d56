"""Outputs that cannot be written (issue 42, item 2): a full disk, a read-only folder, a file where a folder
should be. Each ends in one `error:` line naming the folder and the cause (exit 2), the SageMaker failure
file says what to change ("no space left on ...: raise volume_size"), and no temporary file is left.

The full disk is real: a 256 KiB tmpfs where this process may mount one (root with CAP_SYS_ADMIN), else
the temporary file's descriptor is pointed at /dev/full, whose writes fail with the kernel's ENOSPC (the
temporary file itself exists on disk, so its removal is checked either way). The read-only folder is a
read-only tmpfs, else os.open failing with EROFS for that folder.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from yolov5_smddp.cli import main
from yolov5_smddp.errors import OutputError, output_error
from yolov5_smddp.files import atomic
from yolov5_smddp.files.atomic import atomic_write, make_folder
from yolov5_smddp.models.weights import save_weights
from yolov5_smddp.models.yolo import build_model
from yolov5_smddp.problems import exit_code
from yolov5_smddp.sagemaker.failure import failure_reason
from yolov5_smddp.train.checkpoint import save_checkpoint

ADVICE = "raise volume_size (the job's storage volume, in GB) or write less into it"


def _mount(folder: Path, options: str) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    return done.returncode == 0


def _unmount(folder: Path) -> None:
    subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture
def full_disk(tmp_path, monkeypatch) -> Iterator[Path]:
    """A folder on a file system with no space left."""
    folder = tmp_path / "full"
    if _mount(folder, "size=256k"):
        with open(folder / "filler", "wb") as handle:
            try:
                while True:
                    handle.write(b"\0" * 65536)
                    handle.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        (folder / "filler").rename(folder / "filler.kept")  # stays: the disk stays full
        yield folder
        _unmount(folder)
        return
    real_create = atomic._create_temporary

    def on_dev_full(path: Path, *staging) -> tuple[int, Path]:
        fd, tmp = real_create(path, *staging)
        if folder in path.parents or path == folder:
            dev_full = os.open("/dev/full", os.O_WRONLY)
            os.dup2(dev_full, fd)
            os.close(dev_full)
        return fd, tmp

    monkeypatch.setattr(atomic, "_create_temporary", on_dev_full)
    yield folder


@pytest.fixture
def read_only(tmp_path, monkeypatch) -> Iterator[Path]:
    """A folder on a read-only file system."""
    folder = tmp_path / "ro"
    if _mount(folder, "size=64k,ro"):
        yield folder
        _unmount(folder)
        return
    real_open, real_mkdir = os.open, Path.mkdir

    def refuse_open(path, flags, *args, **kwargs):
        if Path(path).parent == folder and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    def refuse_mkdir(self, *args, **kwargs):
        if folder in self.parents:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse_open)
    monkeypatch.setattr(Path, "mkdir", refuse_mkdir)
    yield folder


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != "filler.kept")


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = build_model("yolov5n", nc=3)
    model.names = ["rectangle", "ellipse", "triangle"]
    return save_weights(tmp_path_factory.mktemp("w") / "tiny.pt", model, meta={})


def _error_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.splitlines()


# --- atomic_write: the cause named, nothing left behind -----------------------------------------------


def test_a_checkpoint_on_a_full_disk_is_one_output_error_and_no_temporary_file(full_disk):
    with pytest.raises(OutputError) as caught:
        save_checkpoint(full_disk, {"model": {"w": torch.zeros(200_000)}})
    assert str(caught.value) == f"cannot write {full_disk / 'last.pt'}: no space left on {full_disk}"
    assert caught.value.errno == errno.ENOSPC and caught.value.folder == full_disk
    assert _entries(full_disk) == []


def test_weights_into_a_full_model_folder_name_the_folder(full_disk):
    model = build_model("yolov5n", nc=1)
    with pytest.raises(
        OutputError, match=rf"^cannot write {full_disk}/best\.pt: no space left on {full_disk}$"
    ):
        save_weights(full_disk / "best.pt", model, meta={})
    assert _entries(full_disk) == []


def test_a_file_where_the_folder_should_be(tmp_path):
    (tmp_path / "model").write_text("x")
    with pytest.raises(OutputError) as caught, atomic_write(tmp_path / "model" / "sub" / "best.pt") as handle:
        handle.write(b"never")
    blocker = tmp_path / "model"
    assert str(caught.value) == (
        f"cannot create the folder {blocker / 'sub'}: {blocker} is a file where a folder should be"
    )
    with pytest.raises(OutputError, match=f"^cannot create the folder {blocker}: {blocker} is a file where"):
        make_folder(blocker)


def test_a_folder_where_the_file_should_be_leaves_no_temporary_file(tmp_path):
    (tmp_path / "best.pt").mkdir()
    with pytest.raises(OutputError) as caught, atomic_write(tmp_path / "best.pt") as handle:
        handle.write(b"data")
    assert (
        str(caught.value)
        == f"cannot write {tmp_path / 'best.pt'}: {tmp_path / 'best.pt'} is a folder where a file should be"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]


def test_a_read_only_folder(read_only):
    with pytest.raises(OutputError) as caught, atomic_write(read_only / "metrics.json", "w") as handle:
        handle.write("{}")
    assert (
        str(caught.value)
        == f"cannot write {read_only / 'metrics.json'}: {read_only} is on a read-only file system"
    )
    with pytest.raises(OutputError, match="is on a read-only file system$"):
        make_folder(read_only / "sub")


def test_other_errors_inside_the_block_are_not_output_errors(tmp_path):
    with pytest.raises(ValueError, match="^a bug$"), atomic_write(tmp_path / "f") as handle:
        handle.write(b"x")
        raise ValueError("a bug")
    assert list(tmp_path.iterdir()) == []


def test_torch_save_unexpected_pos_is_recognised_as_a_write_failure(tmp_path):
    """torch.save writing to a path (its own writer, no Python file object) reports a full disk only as
    this RuntimeError, with no OSError behind it."""
    torch_error = RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 384 vs 342")
    found = output_error(torch_error, tmp_path / "last.pt")
    assert found is not None and str(found) == (
        f"cannot write {tmp_path / 'last.pt'}: the write failed in {tmp_path} "
        "([enforce fail at inline_container.cc:603] . unexpected pos 384 vs 342)"
    )
    assert output_error(RuntimeError("shape mismatch"), tmp_path / "last.pt") is None


# --- the SageMaker failure reason ------------------------------------------------------------------


def test_the_failure_reason_of_a_full_model_folder_says_raise_volume_size():
    full = OSError(errno.ENOSPC, "No space left on device")
    exc = output_error(full, Path("/opt/ml/model/best.pt"))
    assert failure_reason(exc) == (
        f"Output problem: no space left on /opt/ml/model: {ADVICE} (writing /opt/ml/model/best.pt)"
    )
    assert exit_code(exc) == 2
    # a library's own write (no atomic_write between): the OSError with its file name
    raw = OSError(errno.ENOSPC, "No space left on device", "/opt/ml/checkpoints/events.out")
    assert failure_reason(raw) == (
        f"Output problem: no space left on /opt/ml/checkpoints: {ADVICE} "
        "(writing /opt/ml/checkpoints/events.out)"
    )
    assert exit_code(raw) == 2


def test_a_worker_that_ran_out_of_space_gets_the_advice_too():
    from yolov5_smddp.errors import WorkerFailed

    text = "OutputError: cannot write /opt/ml/model/best.pt: no space left on /opt/ml/model"
    reason = failure_reason(
        WorkerFailed(f"training worker rank 0 (node 0 of 1) exited with code 1: {text}", 1)
    )
    assert f"no space left on /opt/ml/model: {ADVICE}. The worker's" in reason


# --- commands run directly: one line, and the failure file under SageMaker ----------------------------


def _sagemaker_output(tmp_path, monkeypatch) -> Path:
    base = tmp_path / "opt_ml"
    (base / "output").mkdir(parents=True)
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(base))
    return base / "output" / "failure"


def test_export_into_a_full_folder_is_one_line_and_the_failure_file(
    tmp_path, weights, full_disk, monkeypatch, capsys
):
    failure = _sagemaker_output(tmp_path, monkeypatch)
    code = main(["export", "--weights", str(weights), "--output-dir", str(full_disk), "--imgsz", "64"])
    lines = _error_lines(capsys)
    assert code == 2
    assert lines == [f"error: cannot write {full_disk / 'tiny.torchscript'}: no space left on {full_disk}"]
    assert failure.read_text() == (
        f"Output problem: no space left on {full_disk}: {ADVICE} (writing {full_disk / 'tiny.torchscript'})\n"
    )
    assert _entries(full_disk) == []


def test_val_metrics_json_under_a_file_is_one_line(tmp_path, weights, capsys, monkeypatch):
    from yolov5_smddp.data.synthetic import make_default_dataset

    monkeypatch.delenv("SAGEMAKER_BASE_DIR", raising=False)
    data = make_default_dataset(tmp_path / "data", n_train=2, n_val=2)
    (tmp_path / "taken").write_text("a file")
    target = tmp_path / "taken" / "metrics.json"
    argv = ["val", "--weights", str(weights), "--data", str(data), "--imgsz", "64", "--workers", "0"]
    assert main([*argv, "--metrics-json", str(target)]) == 2
    lines = [line for line in _error_lines(capsys) if line.startswith("error:")]
    taken = tmp_path / "taken"
    # checked up front by commands.options.make_folder, before the validation runs
    assert lines == [f"error: --metrics-json: cannot make the folder {taken} (File exists)"]
    # into a missing folder: made, and the JSON complete
    assert main([*argv, "--metrics-json", str(tmp_path / "new" / "m.json")]) == 0
    assert set(json.loads((tmp_path / "new" / "m.json").read_text())) >= {"mAP50", "per_class", "skipped"}


def test_an_unknown_failure_keeps_its_traceback_and_writes_the_failure_file(tmp_path, monkeypatch):
    from yolov5_smddp.commands import info

    failure = _sagemaker_output(tmp_path, monkeypatch)

    def broken(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(info, "run", broken)
    with pytest.raises(ZeroDivisionError):
        main(["info", "--cfg", "yolov5n"])
    text = failure.read_text()
    assert text.startswith("Training failed with ZeroDivisionError: a bug. This is not a known input problem")
    assert "Traceback (most recent call last)" in text


def test_no_failure_file_outside_sagemaker(tmp_path, weights, monkeypatch, capsys):
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path / "absent"))
    (tmp_path / "out").write_text("a file")
    assert (
        main(["export", "--weights", str(weights), "--output-dir", str(tmp_path / "out"), "--imgsz", "64"])
        == 2
    )
    out = tmp_path / "out"
    assert _error_lines(capsys) == [f"error: --output-dir: cannot make the folder {out} (File exists)"]
    assert not (tmp_path / "absent").exists()


def test_train_into_a_full_model_folder(tmp_path, full_disk, monkeypatch, capsys):
    """The whole run: trains, then best.pt does not fit: one line, the failure file, no partial file."""
    failure = _sagemaker_output(tmp_path, monkeypatch)
    argv = ["train", "--epochs", "1", "--imgsz", "64", "--workers", "0", "--cfg", "yolov5n", "--noval"]
    argv += ["--model-dir", str(full_disk), "--checkpoint-dir", str(tmp_path / "ck")]
    argv += ["--output-dir", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 2
    error = [line for line in _error_lines(capsys) if line.startswith("error:")]
    assert error == [f"error: cannot write {full_disk / 'best.pt'}: no space left on {full_disk}"]
    assert failure.read_text().startswith(f"Output problem: no space left on {full_disk}: {ADVICE}")
    assert _entries(full_disk) == []
    assert (tmp_path / "ck" / "last.pt").is_file()  # the checkpoint folder had room: resumable


def test_a_raw_enospc_from_any_command_is_one_line(tmp_path, monkeypatch, capsys):
    """A library's own write (predict's JSON, TensorBoard's events) reaching the top with its file name."""
    from yolov5_smddp.commands import info

    failure = _sagemaker_output(tmp_path, monkeypatch)

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/opt/ml/output/data/a.json")

    monkeypatch.setattr(info, "run", full)
    assert main(["info", "--cfg", "yolov5n"]) == 2
    assert _error_lines(capsys) == [
        "error: cannot write /opt/ml/output/data/a.json: no space left on /opt/ml/output/data"
    ]
    assert failure.read_text() == (
        f"Output problem: no space left on /opt/ml/output/data: {ADVICE} (writing /opt/ml/output/data/a.json)\n"
    )


def test_onnx_exports_own_write_failing_names_the_file(tmp_path):
    """torch.onnx.export writes its file itself: its OSError (no file name) is the requested file's."""
    from yolov5_smddp.inference.export import _written_as

    target = tmp_path / "best.onnx"
    with pytest.raises(OutputError) as caught, _written_as(target):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(caught.value) == f"cannot write {target}: no space left on {tmp_path}"
    with pytest.raises(KeyError), _written_as(target):
        raise KeyError("a bug")
