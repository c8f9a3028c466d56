"""hostmem.tune_malloc: the opt-outs, and its effect on the heap and on page faults of a step-like workload."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from yolov5_smddp import hostmem

REPO = Path(__file__).resolve().parent.parent.parent

# One fresh interpreter per measurement: mallopt settings cannot be undone in a process. The workload is the
# pattern of a training step, in plain malloc/free: six blocks of 1..6 MiB live together, then all freed, six
# rounds. glibc's defaults serve the first round with mmap(); freeing raises the mmap threshold to the largest
# block (6 MiB) and the trim threshold to twice that (12 MiB), so later rounds come from the heap, and freeing
# their 21 MiB hands the heap's top back to the kernel: each round faults its pages in again. Tuned, the heap
# keeps them. mallinfo2 reads the heap's size after each round (what the tuning is about); the page faults are
# its observable effect (with transparent huge pages a fault can cover 2 MiB, hence the ratio, not a count).
_ROUNDS = r"""
import ctypes, json, resource, sys
from yolov5_smddp import hostmem
tuned = hostmem.tune_malloc() if sys.argv[1] == "tune" else False
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
libc.mallinfo2.restype = MallInfo2
def round_():
    blocks = [libc.malloc(mib * 2**20) for mib in range(1, 7)]
    for mib, block in zip(range(1, 7), blocks):
        ctypes.memset(block, 1, mib * 2**20)
    for block in blocks:
        libc.free(block)
    return libc.mallinfo2().arena
round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
heap_after_free = [round_() for _ in range(5)]
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5
print(json.dumps({"tuned": tuned, "faults_per_round": faults, "heap_after_free": heap_after_free}))
"""


def _rounds(mode: str, tmp_path: Path) -> dict:
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", _ROUNDS, mode],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(hostmem._glibc() is None, reason="glibc only")
def test_tuned_malloc_keeps_freed_blocks_in_the_heap(tmp_path):
    default = _rounds("default", tmp_path)
    tuned = _rounds("tune", tmp_path)
    assert default["tuned"] is False and tuned["tuned"] is True
    working_set = 21 * 2**20  # 1 + 2 + ... + 6 MiB
    # the default trims the heap's top after every round; tuned, the round's blocks stay in the heap
    assert all(size < working_set for size in default["heap_after_free"]), default
    assert all(size >= working_set for size in tuned["heap_after_free"]), tuned
    # and so the default faults the working set in again every round, tuned (nearly) never
    assert default["faults_per_round"] > 0
    assert tuned["faults_per_round"] * 10 < default["faults_per_round"], (default, tuned)


def test_opt_outs_are_respected():
    assert hostmem.wanted({})
    assert hostmem.wanted({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"})
    assert not hostmem.wanted({"YOLOV5_SMDDP_MALLOC": "default"})
    assert not hostmem.wanted({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000"})


def test_opt_out_leaves_the_allocator_alone(monkeypatch):
    monkeypatch.setattr(hostmem, "_applied", False)
    assert hostmem.tune_malloc({"YOLOV5_SMDDP_MALLOC": "default"}) is False
    assert hostmem._applied is False
