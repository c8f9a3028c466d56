"""One tiny training run (issue 51 items 1 and 4, issue 50 items 1-2), seen from outside:
- a stale temporary file a killed job left in the checkpoint folder is gone after the run, and no temporary
  file ever appears in the checkpoint folder while the run writes it (SageMaker would upload it);
- epochN.pt is copied as atomically as last.pt;
- a model folder that fills while the exports are written is not success: exit 2 and a failure reason;
- an injected CUDA out of memory in a step is one line and a failure reason naming the GPU, the per-GPU
  batch and the image size, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tiny_training import tiny_training

from yolov5_smddp.cli import main
from yolov5_smddp.files import atomic, claimed_dir
from yolov5_smddp.inference import export
from yolov5_smddp.serving import serving_formats
from yolov5_smddp.train import checkpoint, engine


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from yolov5_smddp.data.synthetic import make_default_dataset

    return make_default_dataset(tmp_path_factory.mktemp("ds"), n_train=4, n_val=2, imgsz=64, seed=1)


def _failure(tmp_path: Path, monkeypatch) -> Path:
    base = tmp_path / "opt_ml"
    (base / "output").mkdir(parents=True)
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(base))
    return base / "output" / "failure"


def test_checkpoint_folder_stays_clean_and_a_full_model_folder_fails_the_run(
    tmp_path, data, monkeypatch, capsys
):
    failure = _failure(tmp_path, monkeypatch)
    out = tmp_path / "run"
    ckpt = out / "ckpt"
    ckpt.mkdir(parents=True)
    stale = ckpt / ".last.pt.0123456789ab.tmp"
    stale.write_bytes(b"half a checkpoint from a killed job")
    (out / "output").mkdir()
    (out / "output" / ".results.csv.abcdef012345.tmp").write_text("epoch,")
    seen: list[list[str]] = []
    renamed: list[str] = []
    real_replace, real_create = os.replace, atomic._create_temporary

    def watching(src, dst, *args, **kwargs):  # the checkpoint folder as S3 sync would see it, at each rename
        real_replace(src, dst, *args, **kwargs)
        renamed.append(Path(dst).name)
        seen.append(sorted(p.name for p in ckpt.iterdir()))

    first_export = (
        "best" + export.SUFFIXES[serving_formats()[0]]
    )  # best.pt2 on torch >= 2.10, else .torchscript

    def exports_hit_a_full_disk(path: Path, *staging):
        fd, tmp = real_create(path, *staging)
        if path.name == first_export:  # the model folder fills while the exports are written
            dev_full = os.open("/dev/full", os.O_WRONLY)
            os.dup2(dev_full, fd)
            os.close(dev_full)
        return fd, tmp

    monkeypatch.setattr(atomic.os, "replace", watching)
    monkeypatch.setattr(atomic, "_create_temporary", exports_hit_a_full_disk)
    argv = tiny_training(out, data, "--epochs", "1", "--noplots", "--save-period", "1", batch_size=2)
    code = main(["train", *argv])
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    model = out / "model"
    assert failure.read_text().startswith(f"Output problem: no space left on {model}")
    assert f"error: cannot write {model / first_export}: no space left on {model}" in err
    assert not stale.exists()
    assert seen and all(not any(claimed_dir.TEMPORARY.match(n) for n in names) for names in seen)
    assert {"last.pt", "epoch1.pt"} <= set(seen[-1]) and "epoch1.pt" in renamed  # a copy renamed in whole
    assert checkpoint.load_checkpoint(ckpt / "epoch1.pt")["epoch"] == 1
    assert sorted(p.name for p in out.iterdir()) == ["cache", "ckpt", "model", "output"]  # staging gone
    for folder in (model, out / "output"):  # the model and output folders are claimed as well
        assert not [p.name for p in folder.rglob("*") if claimed_dir.TEMPORARY.match(p.name)]


def test_an_injected_cuda_out_of_memory_is_one_line_and_the_failure_reason(
    tmp_path, data, monkeypatch, capsys
):
    failure = _failure(tmp_path, monkeypatch)

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(engine.TrainStep, "micro_step", out_of_memory)
    argv = tiny_training(tmp_path / "run", data, "--epochs", "1", "--noplots", imgsz=64, batch_size=2)
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: out of GPU memory on rank 0's ")
    assert (
        "with 2 image(s) of 64x64 per GPU: lower the per-GPU batch (--batch-per-gpu 1 or --batch-size 1;"
        in lines[0]
    )
    assert "lower --imgsz" in lines[0]
    assert failure.read_text().splitlines()[0] == "Out of memory: " + lines[0].removeprefix("error: ")
