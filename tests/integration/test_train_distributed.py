"""The trainer itself under two ranks (torchrun + the smddp stand-in backend, mpirun + Gloo), then a
resume of that checkpoint on a different world size (one process). The stand-in is strict (it refuses every
collective and dtype SMDDP does not support), so its runs prove that training, validation, AutoAnchor, the
resume agreement, the stop flags and --time's plan use only SMDDP's collectives on float tensors."""

import csv
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from launchers import mpirun, single, torchrun
from stopping import first_export, model_files, run_until, stopped_model_files
from tiny_training import tiny_training

FIRST_EXPORT = first_export()


pytestmark = pytest.mark.slow


def _options(out: Path, data: Path, *extra: str) -> list[str]:
    return tiny_training(out, data, "--log-every", "2", *extra)


def _train_module() -> list[str]:
    # the per-worker entry: yolov5_smddp.commands.train.main(argv)
    return ["-c", "import sys; from yolov5_smddp.commands.train import main; sys.exit(main(sys.argv[1:]))"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from yolov5_smddp.data.synthetic import make_default_dataset

    return make_default_dataset(tmp_path_factory.mktemp("data"), n_train=32, n_val=8, imgsz=128, seed=2)


def _check_run(out: Path, stdout: str, epochs: int) -> None:
    with (out / "output" / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["epoch"]) for r in rows] == list(range(1, epochs + 1))
    assert (out / "model" / "best.pt").is_file() and (out / "model" / "metrics.json").is_file()
    assert stdout.count(f"epoch={epochs} epochs=") == 1  # rank 0 only prints


def test_two_ranks_torchrun_smddp_standin_then_resume_on_one(tmp_path, data):
    out = tmp_path / "run"
    program = [
        *_train_module(),
        *_options(out, data, "--backend", "smddp", "--epochs", "1", "--cache", "disk"),
    ]
    proc = torchrun(program, standin=True).run(timeout=400)
    assert "backend=smddp world_size=2 global_batch=8 per_rank=4" in proc.stdout
    assert "teardown watchdog" not in proc.stdout + proc.stderr  # every rank left by itself
    _check_run(out, proc.stdout, 1)
    # --cache disk: both ranks filled one folder (every train image is some item's primary: all 32; the
    # 8 val images under validation's resize rule), whole entries only
    pixels = out / "cache" / "pixels"
    assert "--cache disk: decoded images in" in proc.stdout
    assert len(list((pixels / "v1-64-train").rglob("*.bgr"))) == 32
    assert len(list((pixels / "v1-64-val").rglob("*.bgr"))) == 8
    assert not list(pixels.rglob("*.tmp"))
    assert torch.load(out / "ckpt" / "last.pt", weights_only=True)["world_size"] == 2

    # resume on ONE process with more epochs: continues at epoch 2 from the 2-rank checkpoint
    resumed = single([*_train_module(), *_options(out, data, "--epochs", "2")]).run(timeout=400)
    assert "at epoch 2" in resumed.stdout and "trained on 2 rank(s), now 1" in resumed.stdout
    _check_run(out, resumed.stdout, 2)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_two_ranks_mpirun_gloo(tmp_path, data):
    out = tmp_path / "run"
    options = _options(out, data, "--backend", "gloo", "--epochs", "1", "--color-aug", "device")
    proc = mpirun([*_train_module(), *options]).run(timeout=400)
    assert "backend=gloo world_size=2" in proc.stdout
    assert "HSV and flips on the device batch" in proc.stdout + proc.stderr  # --color-aug device
    assert "teardown watchdog" not in proc.stdout + proc.stderr  # every rank left by itself
    _check_run(out, proc.stdout, 1)


def test_two_ranks_agree_on_the_time_budgets_plan(tmp_path, data):
    """--time under torchrun + the strict smddp stand-in: rank 0 plans (every epoch counted as 10 s of a 36 s
    budget: 3 epochs in all, no wall time involved) and both ranks stop after epoch 3; a rank left on
    --epochs 10 would wait in the next epoch's collectives until --dist-timeout and fail the run."""
    out = tmp_path / "run"
    budget = ("--time", "0.01", "--inject-epoch-seconds", "10", "--dist-timeout", "120")
    program = [*_train_module(), *_options(out, data, "--backend", "smddp", "--epochs", "10", *budget)]
    proc = torchrun(program, standin=True).run(timeout=600)
    assert "backend=smddp world_size=2" in proc.stdout and "3 epochs in all (was 10)" in proc.stdout
    assert "teardown watchdog" not in proc.stdout + proc.stderr  # every rank left by itself
    _check_run(out, proc.stdout, 3)


def _ranks_of(launcher: int) -> list[int]:
    """The training ranks a launcher started (its children running the trainer), not their loader
    workers (the ranks' own children)."""
    ranks = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher and b"yolov5_smddp.commands.train" in cmdline:
            ranks.append(int(entry.name))
    return ranks


@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
def test_a_stop_of_two_ranks_leaves_the_model_folder(tmp_path, data, launcher):
    """SIGTERM to both ranks mid-training, as the container's PID 1 sends it (the launcher spared): rank
    0 writes the checkpoint and the whole model folder while rank 1 waits, both exit 143, nobody hangs,
    and the loader workers (one per rank) are not reported dead."""
    if launcher == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("needs Open MPI's mpirun")
    out = tmp_path / "run"
    options = _options(out, data, "--backend", "gloo", "--epochs", "30", "--workers", "1", "--log-every", "1")
    launch = (torchrun if launcher == "torchrun" else mpirun)([*_train_module(), *options])
    stopped: list[int] = []

    def stop_the_ranks(proc) -> None:
        stopped.extend(_ranks_of(proc.pid))
        for pid in stopped:
            os.kill(pid, signal.SIGTERM)

    code, output = run_until(
        launch.cmd, lambda line: "epoch=2 step=1 " in line, stop_the_ranks, env=launch.env
    )
    assert len(stopped) == 2, output[-3000:]
    assert code != 0, output[-3000:]  # the launcher reports its ranks' 143
    assert "LoaderWorkerDied" not in output and "/dev/shm" not in output, output[-3000:]
    assert output.count("model folder written after the SIGTERM") == 1, output[-3000:]
    model = out / "model"
    assert model_files(model) == stopped_model_files(FIRST_EXPORT), output[-3000:]
    metrics = json.loads((model / "metrics.json").read_text())
    assert metrics["interrupted"] is True and metrics["world_size"] == 2 and metrics["weights_from"] == "best"
