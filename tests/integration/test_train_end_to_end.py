"""`yolov5-smddp train` end to end on CPU: the embedded dataset, resume after SIGTERM, a non-finite
loss, and a bad option failing before any work. Each test runs the real CLI in a subprocess."""

import csv
import importlib.util
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import cv2
import pytest
import torch
from child_env import child_env as _env  # this checkout first on PYTHONPATH, no rank variables
from detections import assert_same_detections, run_handler
from stopping import first_export, model_files, run_until, stopped_model_files

FIRST_EXPORT = first_export()


pytestmark = pytest.mark.slow


def _train_cmd(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "yolov5_smddp",
        "train",
        "--cfg",
        "yolov5n",
        "--workers",
        "1",
        "--model-dir",
        str(out / "model"),
        "--output-dir",
        str(out / "output"),
        "--checkpoint-dir",
        str(out / "ckpt"),
        "--cache-dir",
        str(out / "cache"),
        *extra,
    ]


def _train_loss(row: dict[str, str]) -> float:
    return sum(float(row[k]) for k in ("box_loss", "obj_loss", "cls_loss"))


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def embedded_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e")
    started = time.perf_counter()
    proc = subprocess.run(
        _train_cmd(
            out,
            "--imgsz",
            "160",
            "--epochs",
            "6",
            "--batch-size",
            "16",
            "--log-every",
            "4",
            "--hyp-override",
            "lr0=0.1,mosaic=0.5",
        ),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=out,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout, time.perf_counter() - started


def test_embedded_run_writes_every_output_and_learns(embedded_run):
    out, stdout, seconds = embedded_run
    rows = _rows(out / "output" / "results.csv")
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4, 5, 6]
    # it learns: measured (deterministic here) mAP50 0.0007 0.0012 0.0033 0.0030 0.0037 0.0026 and train loss
    # 0.173 0.170 0.166 0.169 0.164 0.162; a model that does not learn stays at the untrained ~0.001 and a
    # flat loss. The mean of the last 3 epochs, not one noisy epoch, against the first.
    map50, losses = [float(r["mAP50"]) for r in rows], [_train_loss(r) for r in rows]
    assert sum(map50[-3:]) / 3 > 2 * map50[0], map50
    assert sum(losses[-3:]) / 3 < 0.98 * losses[0], losses
    metrics = json.loads((out / "model" / "metrics.json").read_text())
    # `final` is best.pt's re-validation (the best epoch's EMA as stored, float16): close to that epoch's row
    best_row = max(rows, key=lambda r: float(r["fitness"]))
    assert metrics["final"]["mAP50"] == pytest.approx(float(best_row["mAP50"]), abs=0.02)
    assert [line for line in stdout.splitlines() if "mAP50-95=" in line][-1].startswith("final=1 ")
    assert metrics["throughput"]["samples_per_sec"] > 0 and 0 <= metrics["throughput"]["data_wait"] <= 1
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["train_config"]["epochs"] == 6 and config["hyp"]["mosaic"] == 0.5
    weights = torch.load(out / "model" / "best.pt", weights_only=True)
    assert weights["meta"]["precision"] == "float16"
    for name in ("last.pt", "best.pt"):
        state = torch.load(out / "ckpt" / name, weights_only=True)
        assert {
            "model",
            "ema",
            "optimizer",
            "scaler",
            "schedule",
            "epoch",
            "best_fitness",
            "rng",
            "config",
        } <= set(state)
    assert "epoch=1 step=1 loss=" in stdout and "samples_per_sec=" in stdout and "data_wait=" in stdout
    print(
        f"end-to-end: {seconds:.0f} s, mAP50 by epoch {map50}, final mAP50-95 {rows[-1]['mAP50-95']}, "
        f"train loss by epoch {losses}"
    )


def test_model_folder_deploys_and_stays_small(embedded_run, tmp_path):
    """model.tar.gz holds the weights, TorchScript (+ ONNX), code/inference.py and two JSON files, no
    checkpoint, cache or dataset; the handler, run without the package, answers as predict does."""
    out, _, _ = embedded_run
    model_dir = out / "model"
    files = sorted(str(p.relative_to(model_dir)) for p in model_dir.rglob("*") if p.is_file())
    expected = ["best.pt", f"best.{FIRST_EXPORT}", "code/inference.py", "config.json", "metrics.json"]
    if importlib.util.find_spec("onnx") is not None:
        expected = sorted([*expected, "best.onnx"])
    assert files == expected
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:  # what SageMaker uploads
        tar.add(model_dir, arcname=".")
    size_mb = archive.stat().st_size / 2**20
    print(f"model.tar.gz (yolov5n): {size_mb:.1f} MB, files {files}")
    assert size_mb < 20
    val_images = next((out / "cache").rglob("images/val"))
    # a 6-epoch model is unsure of everything: a threshold low enough that both sides have boxes to compare
    # (whether the run learned is test_embedded_run_writes_every_output_and_learns's question); the 10
    # best per image, so that a near-threshold box cannot make the two lists differ in length
    low = ["--conf", "1e-6", "--max-det", "10"]
    proc = subprocess.run(
        [sys.executable, "-m", "yolov5_smddp", "predict", "--weights", str(model_dir / "best.pt")]
        + ["--source", str(val_images), "--out", str(tmp_path / "predict"), "--imgsz", "160", *low],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = sorted(tmp_path.joinpath("predict").glob("*.json"))
    found = [a for a in answers if json.loads(a.read_text())["detections"]]
    assert found, "predict found no box at all, even at conf 1e-6"
    for answer in found[:2]:
        want = json.loads(answer.read_text())
        got = run_handler(
            model_dir, Path(want["image"]), "image/jpeg", YOLOV5_CONF="1e-6", YOLOV5_MAX_DET="10"
        )
        # TorchScript (the handler) and the fused eager model (predict) round differently in the last bit:
        # among an unsure model's near-equal scores the 10 kept may differ at the cut, nowhere else
        assert_same_detections(got, want, ties_at_the_cut=True)


def test_plots_in_the_output_folder(embedded_run):
    """The release's plot files, updated after each validation, beside results.csv; every one decodes."""
    out, _, _ = embedded_run
    names = {p.name for p in (out / "output").iterdir()}
    expected = {"results.csv", "val_batch0_labels.jpg", "val_batch0_pred.jpg"}
    expected |= {"train_batch0.jpg", "train_batch1.jpg", "train_batch2.jpg"}
    if importlib.util.find_spec("matplotlib") is not None:
        expected |= {"results.png", "labels.jpg", "confusion_matrix.png"}
        expected |= {"PR_curve.png", "F1_curve.png", "P_curve.png", "R_curve.png"}
    assert names == expected  # nothing else: no temporary files left behind
    for name in expected - {"results.csv"}:
        image = cv2.imread(str(out / "output" / name))
        assert image is not None and min(image.shape[:2]) > 50, name


def _tiny_dataset(root: Path) -> Path:
    from yolov5_smddp.data.synthetic import make_default_dataset

    return make_default_dataset(root, n_train=64, n_val=8, imgsz=128, seed=1)


def _assert_stopped_model_folder(model_dir: Path, stopped: str, weights_from: str, tmp_path: Path) -> dict:
    """The model folder a stopped job leaves: best.pt that loads and predicts, the handler, config.json,
    metrics.json saying where the stop came, and (time allowing: here plenty) the exports."""
    files = model_files(model_dir)
    assert files == stopped_model_files(FIRST_EXPORT), files
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert (metrics["interrupted"], metrics["stopped"], metrics["weights_from"]) == (
        True,
        stopped,
        weights_from,
    )
    assert json.loads((model_dir / "config.json").read_text())["train_config"]["imgsz"] == 64
    image = tmp_path / "scene.jpg"
    cv2.imwrite(str(image), cv2.imread(str(sorted((tmp_path / "data").rglob("*.jpg"))[0])))
    predicted = subprocess.run(
        [sys.executable, "-m", "yolov5_smddp", "predict", "--weights", str(model_dir / "best.pt")]
        + ["--source", str(image), "--out", str(tmp_path / "pred"), "--imgsz", "64", "--conf", "0.001"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert predicted.returncode == 0, predicted.stdout[-2000:] + predicted.stderr[-2000:]
    answer = json.loads((tmp_path / "pred" / "scene.json").read_text())
    height, width = cv2.imread(str(image)).shape[:2]
    assert (answer["width"], answer["height"]) == (width, height) and isinstance(answer["detections"], list)
    return metrics


def test_sigterm_in_the_first_epoch_leaves_a_model_folder_with_the_last_weights(tmp_path):
    """Stopped before any validation: best.pt holds the EMA weights of the stop (those of last.pt), and
    the folder is complete; the job exits 143 (resumable)."""
    data = _tiny_dataset(tmp_path / "data")
    out = tmp_path / "run"
    cmd = _train_cmd(out, "--data", str(data), "--imgsz", "64", "--epochs", "3", "--batch-size", "4")
    code, output = run_until(
        [*cmd, "--log-every", "1"], lambda line: line.startswith("epoch=1 step=3 "), env=_env()
    )
    assert code == 143, output[-3000:]
    assert "interrupted in epoch 1" in output and "Traceback" not in output
    metrics = _assert_stopped_model_folder(out / "model", "in epoch 1", "last", tmp_path)
    assert metrics["epochs"] == 0 and metrics["final"] is None
    assert not (out / "ckpt" / "best.pt").exists()
    # best.pt is the stop's EMA, the one last.pt holds (rounded to float16 as best.pt stores it)
    best = torch.load(out / "model" / "best.pt", weights_only=True)["state_dict"]
    ema = torch.load(out / "ckpt" / "last.pt", weights_only=True)["ema"]["state_dict"]
    floats = [k for k, v in best.items() if v.is_floating_point()]
    assert floats and all(torch.equal(best[k], ema[k].half()) for k in floats)


def test_sigterm_while_the_job_is_set_up_stops_it_at_its_first_step(tmp_path):
    """A SIGTERM before any training (the model is being built, the loaders started) is caught too: the
    run stops at its first step with a checkpoint and a model folder, instead of dying without either."""
    data = _tiny_dataset(tmp_path / "data")
    out = tmp_path / "run"
    cmd = _train_cmd(out, "--data", str(data), "--imgsz", "64", "--epochs", "3", "--batch-size", "4")
    # at the first line of the run, before the model exists
    code, output = run_until([*cmd, "--log-every", "1"], lambda line: line.startswith("backend="), env=_env())
    assert code == 143, output[-3000:]
    assert "interrupted in epoch 1" in output and "Traceback" not in output
    assert "epoch=1 step=2 " not in output  # stopped at its first step
    metrics = _assert_stopped_model_folder(out / "model", "in epoch 1", "last", tmp_path)
    assert metrics["epochs"] == 0


def test_sigterm_after_epoch_1_then_resume_with_the_same_learning_rates(tmp_path):
    data = _tiny_dataset(tmp_path / "data")
    common = (
        "--data",
        str(data),
        "--imgsz",
        "64",
        "--epochs",
        "3",
        "--batch-size",
        "4",
        "--log-every",
        "1000",
    )
    baseline = subprocess.run(
        _train_cmd(tmp_path / "base", *common),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert baseline.returncode == 0, baseline.stderr[-3000:]

    run_dir = tmp_path / "run"
    code, output = run_until(
        _train_cmd(run_dir, *common),
        lambda line: line.startswith("epoch=1 epochs=3"),
        env=_env(),
        cwd=tmp_path,
        timeout=120,  # SageMaker's SIGKILL follows 120 s after the SIGTERM
    )
    assert code == 143, output[-3000:]
    # caught either between epochs ("after epoch 1") or inside epoch 2 ("in epoch 2", which restarts)
    assert "SIGTERM received" in output
    assert "interrupted after epoch 1" in output or "interrupted in epoch 2" in output
    state = torch.load(run_dir / "ckpt" / "last.pt", weights_only=True)
    assert state["epoch"] == 1  # resume runs epoch index 1 = epoch 2 next
    # epoch 1 was validated: best.pt is the best checkpoint's
    stopped = "after epoch 1" if "interrupted after epoch 1" in output else "in epoch 2"
    metrics = _assert_stopped_model_folder(run_dir / "model", stopped, "best", tmp_path)
    assert metrics["epochs"] == 1 and metrics["final"] is not None
    assert not [p for p in (run_dir / "ckpt").iterdir() if p.name.endswith(".tmp")]

    resumed = subprocess.run(
        _train_cmd(run_dir, *common), env=_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout and "at epoch 2" in resumed.stdout
    base_rows, rows = (
        _rows(tmp_path / "base" / "output" / "results.csv"),
        _rows(run_dir / "output" / "results.csv"),
    )
    assert [r["epoch"] for r in rows] == ["1", "2", "3"]
    for key in ("lr_bias", "lr_weight", "lr_norm"):
        assert [r[key] for r in rows] == [r[key] for r in base_rows]


def test_sigterm_after_the_last_epoch_still_writes_the_model(tmp_path):
    """A SIGTERM that arrives after the last epoch (the final validation of best.pt, the exports) is
    caught: the job cuts the validation short, writes the final outputs and exits 0, instead of dying
    with the model dir empty. 600 val images: the validation lasts seconds, so the signal lands in it."""
    from yolov5_smddp.data.synthetic import make_default_dataset

    data = make_default_dataset(tmp_path / "data", n_train=16, n_val=600, imgsz=128, seed=1)
    out = tmp_path / "run"
    cmd = _train_cmd(out, "--data", str(data), "--imgsz", "64", "--epochs", "1", "--batch-size", "8")
    code, output = run_until(cmd, lambda line: line.startswith("epoch=1 epochs=1"), env=_env())
    assert code == 0, output[-3000:]
    assert "SIGTERM received" in output
    assert "SIGTERM after the last epoch" in output
    assert torch.load(out / "model" / "best.pt", weights_only=True)
    metrics = json.loads((out / "model" / "metrics.json").read_text())
    assert metrics["epochs"] == 1
    assert (metrics["interrupted"], metrics["stopped"], metrics["weights_from"]) == (
        True,
        "in the final validation",
        "best",
    )
    assert (out / "model" / "code" / "inference.py").is_file() and (out / "model" / "config.json").is_file()


def test_time_budget_ends_training_with_the_normal_outputs(tmp_path):
    """--time 0.01 h (36 s) with every epoch counted as 10 s (the hidden clock hook: no wall time involved).
    After epoch 1 the plan is 3 epochs in all (10 s used, 26 s left), it stays 3, and the run ends there
    with the usual final validation and model folder; from epoch 2 on the learning rate follows 3 epochs."""
    from yolov5_smddp.config.hyp import Hyp, load_hyp
    from yolov5_smddp.train.engine import Schedule

    data = _tiny_dataset(tmp_path / "data")  # 64 train images: 16 batches of 4 an epoch
    out = tmp_path / "run"
    budget = ("--time", "0.01", "--inject-epoch-seconds", "10")
    cmd = _train_cmd(
        out, "--data", str(data), "--imgsz", "64", "--epochs", "10", "--batch-size", "4", *budget
    )
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 epochs in all (was 10)" in proc.stdout
    assert "epoch=3 epochs=3 " in proc.stdout
    rows = _rows(out / "output" / "results.csv")
    assert [r["epoch"] for r in rows] == ["1", "2", "3"]
    metrics = json.loads((out / "model" / "metrics.json").read_text())
    assert metrics["epochs"] == 3 and metrics["final"] is not None and metrics["per_class"]
    for name in ("best.pt", f"best.{FIRST_EXPORT}", "config.json", "code/inference.py"):
        assert (out / "model" / name).is_file(), name
    state = torch.load(out / "ckpt" / "last.pt", weights_only=True)
    assert (state["planned_epochs"], state["time_used"]) == (3, 30.0)
    # epoch 2's last step (iteration 31 of warmup's 100) aims at lr0 * lr_factor(1, 3), not (1, 10)
    hyp = Hyp.from_dict(load_hyp("scratch-low"))
    kw = {"warmup_iters": 100, "batches_per_epoch": 16, "hyp": hyp, "cosine": False, "global_batch": 4}
    planned = Schedule(epochs=3, **kw).settings(31, 1).lrs["weight"]
    assert float(rows[1]["lr_weight"]) == pytest.approx(planned, rel=1e-9)
    assert planned != pytest.approx(Schedule(epochs=10, **kw).settings(31, 1).lrs["weight"], rel=1e-3)


def test_non_finite_loss_is_reported_clearly(tmp_path):
    data = _tiny_dataset(tmp_path / "data")
    proc = subprocess.run(
        _train_cmd(
            tmp_path,
            "--data",
            str(data),
            "--imgsz",
            "64",
            "--epochs",
            "2",
            "--batch-size",
            "4",
            "--log-every",
            "2",
            "--inject-nonfinite-step",
            "3",
            "--max-nonfinite-steps",
            "2",
        ),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "non-finite (NaN/inf)" in proc.stderr and "epoch 1" in proc.stderr
    assert "loss=nan" in proc.stdout


@pytest.mark.parametrize(
    "option, message",
    [
        (("--hyp-override", "lr0=7"), "lr0=7.0 is out of range"),
        (("--cfg", "yolov5q"), "yolov5q"),
        (("--batch-size", "15", "--batch-per-gpu", "4"), "contradicts"),
        (("--weights", "nope.pt"), "nope.pt"),
    ],
)
def test_bad_option_fails_before_any_work(tmp_path, option, message):
    proc = subprocess.run(
        _train_cmd(tmp_path, *option), env=_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    # before any work: no dataset scanned or generated, no model built, nothing written anywhere (the
    # cache, checkpoint, model and output folders are all under tmp_path, which is also the working folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], proc.stdout[-2000:]
    assert "model:" not in proc.stdout + proc.stderr and "epoch=" not in proc.stdout
