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
# Measured with this recipe (2-core CPU shared by 6 jobs, 2.3 min), mAP50 by epoch:
#   lr0 0.05 (the recipe):  0.0010 0.0011 0.0022 0.0034 0.0082 0.036 0.038 0.043  (last 3: mean 0.039)
#   lr0 0.0167 (3x slower): 0.0008 0.0012 0.0014 0.0016 0.0042 0.0033 0.0036 0.0079 (last 3: mean 0.0049)
# (an earlier version of the trainer: 0.0008 ... 0.012 0.028 0.018 0.035, last 3: mean 0.027); mAP50-95's
# last-3 mean 0.0108 and 0.0010. An untrained model scores ~0.001. The floors on the mean of the last 3
# epochs sit between the two learners (3x above the slow one, 2.6x below the recipe): a learner 2-3x slower
# fails, numeric drift between machines does not.
MAP50_FLOOR = 0.015
MAP50_95_FLOOR = 0.004
LAST = 3
EPOCHS = 8

pytestmark = pytest.mark.slow


def test_a_short_run_learns_above_a_fixed_floor(tmp_path):
    from yolov5_smddp.data.synthetic import make_default_dataset

    data = make_default_dataset(tmp_path / "data", n_train=192, n_val=32, imgsz=128, seed=3)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "OMPI_", "MASTER_"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "yolov5_smddp", "train", "--data", str(data), "--cfg", "yolov5n"]
    cmd += ["--imgsz", "96", "--batch-size", "16", "--epochs", str(EPOCHS), "--workers", "1", "--seed", "0"]
    # a fast-learning variant of the recipe: a higher lr, and the objectness gain the release's
    # (imgsz / 640)^2 rescaling would give at 640 px (at 96 px it shrinks 44x, which learns slowly)
    cmd += ["--hyp-override", "lr0=0.05,obj=40", "--log-every", "1000"]
    for name in ("model-dir", "output-dir", "checkpoint-dir", "cache-dir"):
        cmd += [f"--{name}", str(out / name)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with (out / "output-dir" / "results.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    map50 = [float(r["mAP50"]) for r in rows]
    map50_95 = [float(r["mAP50-95"]) for r in rows]
    print(f"convergence smoke: mAP50 by epoch {map50}, mAP50-95 {map50_95}")
    assert len(rows) == EPOCHS
    # the mean of the last epochs: one lucky epoch does not pass, one noisy epoch does not fail
    assert sum(map50[-LAST:]) / LAST > MAP50_FLOOR, map50
    assert sum(map50_95[-LAST:]) / LAST > MAP50_95_FLOOR, map50_95
    assert max(map50) > 5 * map50[0], map50
