"""Convergence smoke test: a short CPU training run of the real CLI on a small generated set must reach a
fixed mAP floor, so a change that breaks learning (sampling, schedule, loss, augmentation) fails in CI,
not in a user's job. Deterministic: fixed seeds, one loader worker, one thread.

The full side-by-side comparison with the release is bench/convergence.sh (docs/ACCURACY.md).
"""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parent.parent.parent
# Measured with this recipe, the mean over seeds 0 and 1 of each run's last-3-epoch mean (mAP50 / mAP50-95):
#   lr0 0.05 (the recipe):  0.0287 / 0.0063   (seed 0: 0.0159 / 0.0029, seed 1: 0.0414 / 0.0096)
#   lr0 0.0167 (3x slower): 0.0116 / 0.0026   (seed 0: 0.0171 / 0.0038, seed 1: 0.0061 / 0.0013)
# One seed alone cannot tell them apart (seed 0 of the slow learner beats seed 0 of the recipe: when a run
# takes off is chaotic at this size; seeds 2 and 3 of the recipe: 0.0293 / 0.0075, 0.0387 / 0.0094), hence
# two seeds. Before the mosaic became the release's canvas warp (its tiles then had grey seams) the recipe's
# seeds 0-3 gave 0.039-0.046 / 0.008-0.014. An untrained model scores ~0.001. The floors on the two-seed
# mean sit between the two learners: a learner 2-3x slower fails, numeric drift between machines does not.
MAP50_FLOOR = 0.015
MAP50_95_FLOOR = 0.004
LAST = 3
EPOCHS = 8
SEEDS = (0, 1)

pytestmark = pytest.mark.slow


def _last_epochs_mean(data: Path, out: Path, seed: int) -> tuple[float, float, list[float]]:
    """Train the recipe with `seed`; (mAP50, mAP50-95) averaged over the last LAST epochs, and the mAP50 curve."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "OMPI_", "MASTER_"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "yolov5_smddp", "train", "--data", str(data), "--cfg", "yolov5n"]
    cmd += [
        "--imgsz",
        "96",
        "--batch-size",
        "16",
        "--epochs",
        str(EPOCHS),
        "--workers",
        "1",
        "--seed",
        str(seed),
    ]
    # a fast-learning variant of the recipe: a higher lr, and the objectness gain the release's
    # (imgsz / 640)^2 rescaling would give at 640 px (at 96 px it shrinks 44x, which learns slowly)
    cmd += ["--hyp-override", "lr0=0.05,obj=40", "--log-every", "1000"]
    for name in ("model-dir", "output-dir", "checkpoint-dir", "cache-dir"):
        cmd += [f"--{name}", str(out / name)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=out.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with (out / "output-dir" / "results.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == EPOCHS
    map50 = [float(r["mAP50"]) for r in rows]
    map50_95 = [float(r["mAP50-95"]) for r in rows]
    print(f"convergence smoke, seed {seed}: mAP50 by epoch {map50}, mAP50-95 {map50_95}")
    return sum(map50[-LAST:]) / LAST, sum(map50_95[-LAST:]) / LAST, map50


def test_a_short_run_learns_above_a_fixed_floor(tmp_path):
    from yolov5_smddp.data.synthetic import make_default_dataset

    data = make_default_dataset(tmp_path / "data", n_train=192, n_val=32, imgsz=128, seed=3)
    runs = [_last_epochs_mean(data, tmp_path / f"run{seed}", seed) for seed in SEEDS]
    # the mean of the last epochs over two seeds: one lucky run does not pass, one slow take-off does not fail
    map50 = sum(r[0] for r in runs) / len(runs)
    map50_95 = sum(r[1] for r in runs) / len(runs)
    assert map50 > MAP50_FLOOR, runs
    assert map50_95 > MAP50_95_FLOOR, runs
    for _, _, curve in runs:  # every run learnt something: its best epoch well above its first
        assert max(curve) > 5 * curve[0], curve
