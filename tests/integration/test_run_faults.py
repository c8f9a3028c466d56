"""Faults injected from outside into a running 2-rank job under the SageMaker entry's elastic launcher
(issue 50): an output that cannot be written exits 2 with its reason, as in one process; a rank paused
with SIGSTOP past --dist-timeout is named (rank, host, "did not answer the collective for N s") ahead of
the survivor's transport error, and the job ends within the README's bound."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from child_env import REPO, child_env, free_port

from yolov5_smddp.data.synthetic import make_default_dataset

pytestmark = pytest.mark.slow


TMPFS_SKIP = "cannot mount a tmpfs in a private mount namespace here"


def _tmpfs_or_skip(tmp_path: Path) -> None:
    """Skip unless `unshare -m` may mount a tmpfs here (root outside an unprivileged container)."""
    probe = tmp_path / "tmpfs-probe"
    probe.mkdir()
    script = 'mount -t tmpfs -o size=1m tmpfs "$1"'
    try:
        done = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "probe", str(probe)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except FileNotFoundError:
        pytest.skip(f"{TMPFS_SKIP}: no unshare (util-linux)")
    if done.returncode != 0:
        pytest.skip(f"{TMPFS_SKIP}: {done.stderr.strip()[:200]}")


def _job(tmp_path: Path, *extra: str, epochs: int = 1) -> tuple[Path, list[str], dict[str, str]]:
    base = tmp_path / "ml"
    config = base / "input" / "config"
    config.mkdir(parents=True)
    (config / "hyperparameters.json").write_text("{}")
    (config / "inputdataconfig.json").write_text(json.dumps({"training": {"TrainingInputMode": "File"}}))
    make_default_dataset(base / "input" / "data" / "training", n_train=8, n_val=4, imgsz=64, seed=3)
    (base / "output").mkdir()
    env = {**child_env(), "SAGEMAKER_BASE_DIR": str(base), "SM_NUM_GPUS": "0", "TRAINING_JOB_NAME": "job-50"}
    command = [sys.executable, str(REPO / "entrypoint.py")]
    command += ["--epochs", str(epochs), "--imgsz", "64", "--batch-size", "4", "--workers", "0"]
    command += ["--cfg", "yolov5n", "--noplots", "--backend", "gloo", "--nproc-per-node", "2"]
    command += ["--master-port", str(free_port()), *extra]
    return base, command, env


def test_a_full_checkpoint_disk_exits_2_with_its_reason_under_the_elastic_launcher(tmp_path):
    _tmpfs_or_skip(tmp_path)
    base, command, env = _job(tmp_path)
    (base / "checkpoints").mkdir()
    # a real full disk: a 1 MB tmpfs over the checkpoint folder, in a mount namespace of the job's own
    mount = f"mount -t tmpfs -o size=1m tmpfs {shlex.quote(str(base / 'checkpoints'))}"
    wrapped = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'{mount} && exec "$@"',
        "job",
        *command,
    ]
    done = subprocess.run(wrapped, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    log = done.stdout + done.stderr
    assert done.returncode == 2, log[-4000:]
    reason = (base / "output" / "failure").read_text().splitlines()[0]
    assert reason.startswith("Training failed: training worker rank "), reason
    assert "exited with code 2: cannot write " in reason and "no space left on " in reason, reason
    assert "raise volume_size" in reason and "Traceback" not in reason


def _end(proc: subprocess.Popen) -> None:
    """The job and its workers (torch's agent starts them in sessions of their own), when a test gives up."""
    workers = [pid for rank in (0, 1) if (pid := _rank_pid(proc.pid, rank)) is not None]
    for pid in [proc.pid, *workers]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _rank_pid(parent: int, rank: int) -> int | None:
    """The pid of the elastic worker with RANK=`rank` below `parent` (read from /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"yolov5_smddp.launch" in cmdline and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


def test_a_rank_paused_past_the_timeout_is_named_and_the_job_ends_within_the_bound(tmp_path):
    base, command, env = _job(tmp_path, "--dist-timeout", "10", epochs=50)
    out = (tmp_path / "log").open("w")
    proc = subprocess.Popen(
        command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True
    )
    paused = None
    try:
        deadline = time.monotonic() + 240
        while "epoch=" not in (tmp_path / "log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()[-4000:]
            time.sleep(0.5)
        paused = _rank_pid(proc.pid, 1)
        assert paused is not None
        os.kill(paused, signal.SIGSTOP)
        stopped_at = time.monotonic()
        code = proc.wait(timeout=150)
        took = time.monotonic() - stopped_at
    finally:
        if paused is not None:
            try:
                os.kill(paused, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _end(proc)
    log = (tmp_path / "log").read_text()
    assert code != 0, log[-4000:]
    reason = (base / "output" / "failure").read_text().splitlines()[0]
    assert "training rank 1 on host " in reason and "did not answer the collective for 10 s" in reason, reason
    assert "Connection reset" not in reason.split("did not answer")[0]
    print(f"the job ended {took:.0f} s after rank 1 was paused (--dist-timeout 10)")
    assert took < 120, took  # the README's bound: --dist-timeout + 4 s + the agent's 30 s grace, with room


def test_a_busy_master_port_ends_the_job_in_one_line_with_exit_2(tmp_path):
    base, command, env = _job(tmp_path)
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        command[command.index("--master-port") + 1] = str(port)
        started = time.monotonic()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        took = time.monotonic() - started
    log = done.stdout + done.stderr
    assert done.returncode == 2, log[-4000:]
    reason = (base / "output" / "failure").read_text().splitlines()[0]
    assert f"the master port {port} on " in reason and "is already in use" in reason, reason
    print(f"a busy master port ended the job in {took:.0f} s")


def _memory_cgroup() -> Path | None:
    """This process's cgroup v1 memory folder when it can hold a child cgroup (root), else None."""
    from yolov5_smddp.distributed import blame

    folder = blame.own_memory_cgroup()
    if folder is None or not (folder / "memory.oom_control").is_file():
        return None
    probe = folder / f"t50-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return None
    return folder


def _into_cgroup(folder: Path, pid: int | None = None) -> None:
    (folder / "cgroup.procs").write_text(str(pid if pid is not None else os.getpid()))


def _remove_cgroup(folder: Path) -> None:
    for child in sorted(folder.glob("**/"), key=lambda p: -len(p.parts)):
        deadline = time.monotonic() + 10
        while child.exists():
            try:
                child.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)


def test_a_rank_killed_by_the_oom_killer_is_named_with_memory_in_words(tmp_path):
    parent = _memory_cgroup()
    if parent is None:
        pytest.skip("needs a writable cgroup v1 memory hierarchy (root) to give one rank a memory limit")
    job_group = parent / f"t50-job-{os.getpid()}"
    job_group.mkdir()
    try:
        base, command, env = _job(tmp_path, epochs=200)
        out = (tmp_path / "log").open("w")
        proc = subprocess.Popen(
            command,
            env={**env, "YOLOV5_SMDDP_MALLOC": "default"},  # each step maps fresh pages (hostmem)
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            start_new_session=True,
            preexec_fn=lambda: _into_cgroup(job_group),  # noqa: PLW1509 - the job's own memory cgroup
        )
        try:
            deadline = time.monotonic() + 240
            while "epoch=" not in (tmp_path / "log").read_text():
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()[
                    -4000:
                ]
                time.sleep(0.5)
            rank_1 = _rank_pid(proc.pid, 1)
            assert rank_1 is not None
            limited = job_group / "rank1"
            limited.mkdir()
            (limited / "memory.limit_in_bytes").write_text(str(4 * 2**20))  # a step maps ~20 MB anew
            _into_cgroup(limited, rank_1)
            code = proc.wait(timeout=150)
        finally:
            _end(proc)
        log = (tmp_path / "log").read_text()
        assert code != 0, log[-4000:]
        reason = (base / "output" / "failure").read_text().splitlines()[0]
        assert "training worker rank 1 on host " in reason, reason
        assert "was killed by the OOM killer: memory" in reason, reason
    finally:
        _remove_cgroup(job_group)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_a_full_checkpoint_disk_exits_2_under_mpirun(tmp_path):
    from launchers import mpirun
    from tiny_training import tiny_training

    _tmpfs_or_skip(tmp_path)
    data = make_default_dataset(tmp_path / "data", n_train=8, n_val=4, imgsz=64, seed=3)
    out = tmp_path / "run"
    (out / "ckpt").mkdir(parents=True)
    options = tiny_training(out, data, "--epochs", "1", "--batch-size", "4", "--backend", "gloo", "--noplots")
    launch = mpirun(["-m", "yolov5_smddp", "train", *options])
    mount = f"mount -t tmpfs -o size=1m tmpfs {shlex.quote(str(out / 'ckpt'))}"
    wrapped = ["unshare", "-m", "--propagation", "private", "sh", "-c", f'{mount} && exec "$@"', "job"]
    done = subprocess.run(
        [*wrapped, *launch.cmd], env=launch.env, capture_output=True, text=True, timeout=300
    )
    log = done.stdout + done.stderr
    assert done.returncode == 2, log[-4000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors and "no space left on " in errors[0], log[-4000:]
