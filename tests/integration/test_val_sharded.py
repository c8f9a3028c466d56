"""`yolov5-smddp val` sharded over 2 ranks (torchrun + Gloo, torchrun + the smddp stand-in, mpirun + Gloo)
gives EXACTLY the metrics of one process; and training's `final` numbers are best.pt's."""

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch
from launchers import Launch, mpirun, torchrun
from launchers import single as one_process
from tiny_training import tiny_training

KEYS = ("precision", "recall", "mAP50", "mAP50-95", "fitness", "images", "targets", "per_class")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """30 val images and a random yolov5n (with random weights it still makes detections of every kind:
    some true positives at IoU 0.5, many false ones)."""
    from yolov5_smddp.data.synthetic import CLASS_NAMES, make_default_dataset
    from yolov5_smddp.models.weights import save_weights
    from yolov5_smddp.models.yolo import build_model

    root = tmp_path_factory.mktemp("valshard")
    data = make_default_dataset(root / "data", n_train=4, n_val=30, imgsz=128, seed=3)
    torch.manual_seed(0)
    save_weights(root / "w.pt", build_model("yolov5n", nc=len(CLASS_NAMES)), meta={})
    return root, data


def _val_args(root: Path, data: Path, metrics: Path, *extra: str) -> list[str]:
    return [
        "-m",
        "yolov5_smddp",
        "val",
        "--weights",
        str(root / "w.pt"),
        "--data",
        str(data),
        "--imgsz",
        "128",
        "--batch-size",
        "5",
        "--workers",
        "0",
        "--cache-dir",
        str(root / "cache"),
        "--metrics-json",
        str(metrics),
        *extra,
    ]


def _run(launch: Launch) -> str:
    return launch.run(timeout=600).stdout


@pytest.fixture(scope="module")
def single(setup) -> dict:
    root, data = setup
    out = _run(one_process(_val_args(root, data, root / "one.json", *_save_json(root / "one"))))
    assert "val: 30 of 30 images on 1 rank" in out
    metrics = json.loads((root / "one.json").read_text())
    assert metrics["images"] == 30 and metrics["mAP50"] > 0 and metrics["recall"] > 0  # non-trivial
    # the per-class table (fewer than 50 classes: printed without --verbose), and its values in the JSON
    rows = metrics["per_class"]
    assert sum(r["instances"] for r in rows) == metrics["targets"] and len(rows) > 1
    assert all(0 < r["images"] <= min(r["instances"], 30) for r in rows)
    for r in rows:
        assert any(
            line.split()[:3] == [r["name"], str(r["images"]), str(r["instances"])]
            for line in out.splitlines()
        )
    return metrics


def _save_json(folder: Path) -> list[str]:
    return ["--save-json", "--output-dir", str(folder)]


def _torchrun(root: Path, data: Path, name: str, backend: str, standin: bool = False, *extra: str) -> dict:
    out = _run(torchrun(_val_args(root, data, root / name, "--backend", backend, *extra), standin=standin))
    assert "val: 15 of 30 images on each of 2 ranks" in out
    # rank 0 alone prints the metric line (and, with --save-json, pycocotools' line where it is installed)
    assert out.count("mAP50-95=") - out.count("pycocotools=1 ") == 1
    return json.loads((root / name).read_text())


def test_two_ranks_gloo_equal_one_process_exactly(setup, single):
    root, data = setup
    two = _torchrun(root, data, "gloo.json", "gloo")
    assert {k: two[k] for k in KEYS} == {k: single[k] for k in KEYS}


def test_two_ranks_smddp_standin_equal_one_process_exactly(setup, single):
    root, data = setup
    two = _torchrun(root, data, "smddp.json", "smddp", True, *_save_json(root / "smddp"))
    assert {k: two[k] for k in KEYS} == {k: single[k] for k in KEYS}
    # --save-json: every rank's detections and scored images, gathered as float32 (the strict stand-in
    # refuses object collectives), equal to one process's files
    for name in ("predictions.json", "ground_truth.json"):
        one = json.loads((root / "one" / name).read_text())
        assert json.loads((root / "smddp" / name).read_text()) == one and len(one) > 0
    assert len(json.loads((root / "one" / "predictions.json").read_text())) > 30


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_two_ranks_mpirun_equal_one_process_exactly(setup, single):
    root, data = setup
    out = _run(mpirun(_val_args(root, data, root / "mpi.json", "--backend", "gloo")))
    assert "val: 15 of 30 images on each of 2 ranks" in out
    two = json.loads((root / "mpi.json").read_text())
    assert {k: two[k] for k in KEYS} == {k: single[k] for k in KEYS}


def test_two_rank_training_reports_best_pt_numbers_as_final(tmp_path):
    """2 ranks over Gloo train 2 epochs with sharded validation; `final` in metrics.json and the last
    metric line are best.pt's: equal to one process validating model/best.pt with the same batches; and
    epoch 2's numbers are those of one process validating rank 0's EMA of that epoch."""
    from yolov5_smddp.data.synthetic import make_default_dataset
    from yolov5_smddp.models.weights import save_weights
    from yolov5_smddp.models.yolo import build_model

    data = make_default_dataset(tmp_path / "data", n_train=16, n_val=20, imgsz=128, seed=4)
    out = tmp_path / "run"
    train = ["-m", "yolov5_smddp", "train", *tiny_training(out, data, "--epochs", "2", "--backend", "gloo")]
    stdout = _run(torchrun(train))
    assert "val: images per rank 16/4 of 20 on 2 ranks" in stdout  # val batches of 2 x 4
    final = json.loads((out / "model" / "metrics.json").read_text())["final"]
    metric_lines = [line for line in stdout.splitlines() if "mAP50-95=" in line]
    assert metric_lines[-1].startswith("final=1 ")
    # the plots of sharded validation: rank 0 writes them from every rank's gathered images
    plotted = {p.name for p in (out / "output").iterdir()}
    assert {"confusion_matrix.png", "PR_curve.png", "results.png", "val_batch0_pred.jpg"} <= plotted
    assert "train_batch0.jpg" in plotted

    # one process, the written best.pt, the trainer's val batch size (2 x per-rank batch)
    alone = _validate_alone(out / "model" / "best.pt", data, out / "cache", tmp_path / "best.json")
    keys = ("precision", "recall", "mAP50", "mAP50-95", "fitness")
    assert {k: final[k] for k in keys} == {k: alone[k] for k in keys}
    assert f"mAP50-95={final['mAP50-95']:.6g}" in metric_lines[-1]

    # one model per validation: epoch 2's sharded numbers are those of ONE model, rank 0's EMA (last.pt's,
    # float32), buffers included — not each rank's own EMA, whose BatchNorm statistics differ per rank
    saved = torch.load(out / "ckpt" / "last.pt", weights_only=True)
    ema = build_model(saved["model_cfg"])
    ema.load_state_dict(saved["ema"]["state_dict"])
    save_weights(tmp_path / "ema.pt", ema, meta={})
    epoch_2 = _validate_alone(tmp_path / "ema.pt", data, out / "cache", tmp_path / "ema.json")
    with (out / "output" / "results.csv").open() as handle:
        row = list(csv.DictReader(handle))[-1]
    assert row["epoch"] == "2" and epoch_2["recall"] > 0  # non-trivial: the model finds some boxes
    assert {k: float(row[k]) for k in keys} == {k: epoch_2[k] for k in keys}


def _validate_alone(weights: Path, data: Path, cache: Path, metrics: Path) -> dict:
    """`val` in one process at the trainer's validation settings of the test above (imgsz 64, batch 8)."""
    val = [
        "-m",
        "yolov5_smddp",
        "val",
        "--weights",
        str(weights),
        "--data",
        str(data),
        "--imgsz",
        "64",
        "--batch-size",
        "8",
        "--workers",
        "0",
        "--cache-dir",
        str(cache),
        "--metrics-json",
        str(metrics),
    ]
    _run(one_process(val))
    return json.loads(metrics.read_text())
