"""hostmem.tune_malloc: the opt-outs, and its observable effect on a training step's page faults."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from yolov5_smddp import hostmem

REPO = Path(__file__).resolve().parent.parent.parent

# one fresh interpreter per measurement: mallopt settings cannot be undone in a process
_STEP_FAULTS = r"""
import json, resource, sys, torch
from yolov5_smddp import hostmem
tuned = hostmem.tune_malloc() if sys.argv[1] == "tune" else False
from yolov5_smddp.models.yolo import build_model
torch.manual_seed(0)
torch.set_num_threads(1)
model = build_model("yolov5n", nc=80).train()
x = torch.rand(4, 3, 224, 224)
def step():
    sum(o.float().mean() for o in model(x)).backward()
    model.zero_grad(set_to_none=True)
for _ in range(2):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    step()
print(json.dumps({"tuned": tuned, "faults_per_step": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3}))
"""


def _faults(mode: str, tmp_path: Path) -> dict:
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", _STEP_FAULTS, mode],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(hostmem._glibc() is None, reason="glibc only")
def test_tuned_malloc_stops_the_per_step_page_faults(tmp_path):
    default = _faults("default", tmp_path)
    tuned = _faults("tune", tmp_path)
    assert tuned["tuned"] is True
    assert default["faults_per_step"] > 2000  # the working set is faulted in again every step
    assert tuned["faults_per_step"] * 5 < default["faults_per_step"]


def test_opt_outs_are_respected():
    assert hostmem.wanted({})
    assert hostmem.wanted({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"})
    assert not hostmem.wanted({"YOLOV5_SMDDP_MALLOC": "default"})
    assert not hostmem.wanted({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000"})


def test_opt_out_leaves_the_allocator_alone(monkeypatch):
    monkeypatch.setattr(hostmem, "_applied", False)
    assert hostmem.tune_malloc({"YOLOV5_SMDDP_MALLOC": "default"}) is False
    assert hostmem._applied is False
