"""`yolov5-smddp train --loader gpu` end to end on the CPU device (issue 40): two epochs on a tiny
synthetic set, the GPU data path's batches reaching the step; finite metrics, the run's files written,
nothing written under the dataset."""

import re
import subprocess
import sys

import numpy as np
import pytest
from child_env import child_env
from datatree import tree_state

from yolov5_smddp.data.synthetic import make_default_dataset


@pytest.mark.slow
def test_train_with_the_gpu_loader_on_cpu(tmp_path):
    data = make_default_dataset(tmp_path / "d", n_train=16, n_val=8, imgsz=64, seed=1)
    before = tree_state(data.parent)
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "yolov5_smddp",
        "train",
        "--data",
        str(data),
        "--cfg",
        "yolov5n",
        "--imgsz",
        "64",
    ]
    cmd += ["--epochs", "2", "--batch-size", "8", "--workers", "1", "--loader", "gpu", "--noval"]
    for flag, sub in (("--model-dir", "model"), ("--output-dir", "output"), ("--checkpoint-dir", "ckpt")):
        cmd += [flag, str(out / sub)]
    cmd += ["--cache-dir", str(out / "cache")]
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = (out / "output" / "results.csv").read_text().splitlines()
    assert len(rows) == 3  # header + 2 epochs
    final = [line for line in proc.stdout.splitlines() if line.startswith("final=1 ")]
    assert final and all(np.isfinite(float(kv.split("=")[1])) for kv in final[0].split()[1:])
    assert (out / "model" / "best.pt").is_file() and (out / "output" / "train_batch0.jpg").is_file()
    out_text = proc.stdout + proc.stderr
    assert "HSV and flips on the device batch" in out_text
    summary = [line for line in out_text.splitlines() if "GPU data path: 16 samples in 2 batches;" in line]
    assert len(summary) == 1
    decoded = int(re.search(r"; (\d+) files decoded on the device", summary[0]).group(1))
    assert 8 <= decoded <= 32  # each batch decodes its distinct files once (16 images, 2 batches)
    assert " 0 images decoded in the workers" in summary[0]
    assert " 0 refused by the device" in summary[0] and " 0 corrupt" in summary[0]
    assert tree_state(data.parent) == before
