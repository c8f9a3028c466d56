"""2 ranks x batch B/2 == 1 process x batch B after 3 optimizer steps, through torchrun, mpirun and the
smddp stand-in backend (see ddp_equivalence_worker.py for the batch design)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from child_env import REPO, child_env, free_port

HERE = Path(__file__).parent
WORKER = HERE / "ddp_equivalence_worker.py"
STANDIN = REPO / "tests" / "standin_smddp"

pytestmark = pytest.mark.slow


def _run(cmd: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def single_process(tmp_path_factory) -> dict[str, torch.Tensor]:
    out = tmp_path_factory.mktemp("single") / "params.pt"
    _run([sys.executable, str(WORKER), str(out), "gloo"], child_env())
    return torch.load(out, weights_only=True)


def _torchrun(out: Path, backend: str, env: dict[str, str]) -> list[str]:
    return [
        sys.executable,
        str(HERE / "torchrun_nolibuv.py"),
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        str(WORKER),
        str(out),
        backend,
    ]


def _compare(single: dict[str, torch.Tensor], ddp: dict[str, torch.Tensor]) -> None:
    assert single.keys() == ddp.keys()
    moved = max((single[k] - ddp[k]).abs().max().item() for k in single)
    worst = max(
        ((single[k] - ddp[k]).abs().max() / single[k].abs().max().clamp_min(1e-12)).item() for k in single
    )
    assert moved < 1e-5 and worst < 1e-4, f"max abs diff {moved}, max relative diff {worst}"


def test_ddp_matches_single_process_torchrun_gloo(single_process, tmp_path):
    out = tmp_path / "params.pt"
    env = child_env()
    _run(_torchrun(out, "gloo", env), env)
    _compare(single_process, torch.load(out, weights_only=True))


def test_ddp_matches_single_process_smddp_standin(single_process, tmp_path):
    out = tmp_path / "params.pt"
    env = child_env(STANDIN)
    _run(_torchrun(out, "smddp", env), env)
    _compare(single_process, torch.load(out, weights_only=True))


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_ddp_matches_single_process_mpirun_gloo(single_process, tmp_path):
    out = tmp_path / "params.pt"
    env = child_env()
    env["MASTER_ADDR"], env["MASTER_PORT"] = "127.0.0.1", str(free_port())
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
    for name in ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT", "USE_LIBUV", "OMP_NUM_THREADS"):
        cmd += ["-x", name]
    _run(cmd + [sys.executable, str(WORKER), str(out), "gloo"], env)
    _compare(single_process, torch.load(out, weights_only=True))


def test_params_actually_moved(single_process):
    torch.manual_seed(0)
    from yolov5_smddp.models.yolo import build_model

    initial = dict(build_model("yolov5n", nc=3).named_parameters())
    assert max((initial[k].detach() - v).abs().max().item() for k, v in single_process.items()) > 1e-4
