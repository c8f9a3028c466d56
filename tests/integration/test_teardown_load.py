"""A finished 2-rank job ends, round after round, while CPU hogs compete for the cores (issue 10, part 1).

Each round trains the smallest job (a few 64-pixel images, one epoch) under mpirun + Gloo (rank 0 hosts
the TCPStore) or torchrun + Gloo (the agent hosts it). A round is bounded: one that is still running after
ROUND_LIMIT_S had hung; its workers' Python stacks are dumped (faulthandler on SIGUSR1) into the failure
message and the whole process group is killed. Every round must exit 0, write its outputs, and every rank
must have left by itself (no "teardown watchdog" line). How long the job took to end after rank 0's last
line ("done: ...", printed once the outputs are written) is reported for each round, not asserted: on an
overloaded machine the interpreters' own exit can take longer than the 60 s the teardown is bounded by.

Without the fix (torch 2.6's Gloo teardown deadlock, see yolov5_smddp.distributed.process_group.teardown) a round hangs
now and then; tests/unit/test_distributed.py covers the watchdog that bounds the teardown itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from child_env import child_env
from launchers import mpirun, torchrun
from tiny_training import tiny_training

ROUNDS = int(os.environ.get("YOLOV5_SMDDP_TEARDOWN_ROUNDS", "5"))
ROUND_LIMIT_S = float(os.environ.get("YOLOV5_SMDDP_TEARDOWN_ROUND_LIMIT_S", "240"))
HOGS = 2

pytestmark = pytest.mark.slow

# the per-worker entry, with a stack dump of every thread on SIGUSR1 (sent when a round hangs)
# the root cause on its own: many init / collective on a temporary tensor / destroy cycles, each of which
# could deadlock in torch 2.6's Gloo teardown (it did within 20 cycles beside the hogs before the fix)
CYCLES = int(os.environ.get("YOLOV5_SMDDP_TEARDOWN_CYCLES", "60"))
CYCLE_WORKER = """
import faulthandler, signal, sys
import torch
import torch.distributed as dist
from yolov5_smddp.distributed import collectives
from yolov5_smddp.distributed import process_group
faulthandler.register(signal.SIGUSR1, all_threads=True)
rank, folder, cycles = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for cycle in range(cycles):
    store = dist.FileStore(f"{folder}/store{cycle}", 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    dist.all_reduce(torch.ones(16))  # Python lets go of the tensor; Gloo's worker may still hold it
    collectives.broadcast_ints((cycle,))
    process_group.destroy()
print(f"rank {rank}: {cycles} cycles", flush=True)
"""

WORKER = (
    "import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True); "
    "from yolov5_smddp.commands.train import main; sys.exit(main(sys.argv[1:]))"
)


@dataclass
class Round:
    code: int | None
    seconds: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    hung: bool = False

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def exit_after_done(self, ended: float) -> float | None:
        done = [at for at, line in self.lines if "done: " in line]
        return ended - done[-1] if done else None

    def exit_after_left(self, ended: float) -> float | None:
        left = [at for at, line in self.lines if "left the process group in" in line]
        return ended - left[-1] if left else None


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from yolov5_smddp.data.synthetic import make_default_dataset

    return make_default_dataset(tmp_path_factory.mktemp("data"), n_train=16, n_val=4, imgsz=64, seed=3)


@pytest.fixture(scope="module")
def hogs():
    """CPU hogs beside the job for the whole module; always killed."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(HOGS)
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=30)


def _options(out: Path, data: Path) -> list[str]:
    return tiny_training(out, data, "--epochs", "1", "--backend", "gloo", "--dist-timeout", "120")


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _is_worker(pid: int) -> bool:
    try:
        return b"yolov5_smddp.commands.train" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _read(stream, lines: list[tuple[float, str]]) -> None:
    for line in iter(stream.readline, ""):
        lines.append((time.monotonic(), line.rstrip("\n")))


def _run_round(cmd: list[str], env: dict[str, str]) -> tuple[Round, float]:
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    result = Round(code=None, seconds=0.0)
    reader = threading.Thread(target=_read, args=(proc.stdout, result.lines), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=ROUND_LIMIT_S)
    except subprocess.TimeoutExpired:
        result.hung = True
        alive = _session_pids(proc.pid)
        result.lines.append((time.monotonic(), f"HUNG after {ROUND_LIMIT_S:.0f} s; alive: {alive}"))
        for pid in filter(_is_worker, alive):
            os.kill(pid, signal.SIGUSR1)  # faulthandler: every thread's stack to stderr
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in _session_pids(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait(timeout=60)
    ended = time.monotonic()
    reader.join(timeout=30)
    result.code = proc.returncode
    result.seconds = ended - started
    return result, ended


def _check_rounds(name: str, cmd_for, tmp_path: Path) -> None:
    failures, hung, report = [], 0, []
    for index in range(ROUNDS):
        out = tmp_path / f"round{index}"
        cmd, env = cmd_for(out)
        result, ended = _run_round(cmd, env)
        after_done, after_left = result.exit_after_done(ended), result.exit_after_left(ended)
        watchdog = result.text.count("teardown watchdog")
        report.append(
            f"{name} round {index + 1}: code={result.code} {result.seconds:.0f} s "
            f"exit-after-done={after_done if after_done is None else round(after_done, 1)} s "
            f"exit-after-left={after_left if after_left is None else round(after_left, 1)} s "
            f"hung={result.hung} watchdog={watchdog}"
        )
        print(report[-1], flush=True)
        problems = []
        if result.hung:
            hung += 1
            problems.append("hung")
        elif result.code != 0:
            problems.append(f"exit code {result.code}")
        if not (out / "model" / "best.pt").is_file() or not (out / "model" / "metrics.json").is_file():
            problems.append("outputs missing")
        if watchdog:
            problems.append("the teardown watchdog had to end a rank")
        if after_done is None:
            problems.append("no 'done:' line")
        if problems:
            failures.append(f"round {index + 1}: {', '.join(problems)}\n{result.text[-6000:]}")
    summary = "\n".join(report)
    assert not failures, f"{name}: {hung} of {ROUNDS} rounds hung\n{summary}\n\n" + "\n\n".join(failures)


def test_init_destroy_cycles_never_deadlock(tmp_path, hogs):
    env = child_env()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CYCLE_WORKER, str(rank), str(tmp_path), str(CYCLES)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=ROUND_LIMIT_S)[0])
        except subprocess.TimeoutExpired:
            for other in procs:
                if other.poll() is None:
                    other.send_signal(signal.SIGUSR1)  # faulthandler: every thread's stack
            time.sleep(3)
            for other in procs:
                other.kill()
            dumps = "\n".join(p.communicate(timeout=60)[0] or "" for p in procs)
            pytest.fail(f"init/destroy cycles hung after {ROUND_LIMIT_S:.0f} s:\n{dumps[-8000:]}")
    for rank, (proc, text) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0 and f"rank {rank}: {CYCLES} cycles" in text, text[-4000:]


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_mpirun_gloo_job_ends_every_round_under_load(tmp_path, data, hogs):
    def cmd_for(out: Path):
        launch = mpirun(["-c", WORKER, *_options(out, data)])
        return launch.cmd, launch.env

    _check_rounds("mpirun", cmd_for, tmp_path)


def test_torchrun_gloo_job_ends_every_round_under_load(tmp_path, data, hogs):
    def cmd_for(out: Path):
        launch = torchrun(["-c", WORKER, *_options(out, data)])
        return launch.cmd, launch.env

    _check_rounds("torchrun", cmd_for, tmp_path)
