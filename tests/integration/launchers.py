"""How the multi-process integration tests start ranks: torchrun (through torchrun_nolibuv.py) or Open MPI's
mpirun, optionally with the smddp stand-in on PYTHONPATH; and one process alone, for the reference runs.

A `Launch` is the command and its environment. `program` is what each rank's Python runs, after the
interpreter: `[script, args...]`, `["-m", module, args...]` or `["-c", code, args...]`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from child_env import REPO, child_env, free_port

TORCHRUN = Path(__file__).resolve().parent / "torchrun_nolibuv.py"
STANDIN = REPO / "tests" / "standin_smddp"
# what mpirun must hand on to every rank (it starts them with its own environment otherwise)
MPIRUN_EXPORTS = ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT", "USE_LIBUV", "OMP_NUM_THREADS")


@dataclass(frozen=True)
class Launch:
    cmd: list[str]
    env: dict[str, str]

    def run(self, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run to the end; fails the test (with the output's tail) unless every rank exited 0."""
        proc = subprocess.run(self.cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, (
            f"{self.cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
        return proc


def _env(standin: bool) -> dict[str, str]:
    return child_env(STANDIN) if standin else child_env()


def single(program: Sequence[str], *, standin: bool = False) -> Launch:
    """One process, no launcher."""
    return Launch([sys.executable, *program], _env(standin))


def torchrun(program: Sequence[str], *, nproc: int = 2, standin: bool = False) -> Launch:
    """`torchrun --nproc_per_node N` on a free loopback port, each rank `python program...`."""
    cmd = [
        sys.executable,
        str(TORCHRUN),
        "--nproc_per_node",
        str(nproc),
        "--master_port",
        str(free_port()),
        "--no-python",
        sys.executable,
        *program,
    ]
    return Launch(cmd, _env(standin))


def mpirun(program: Sequence[str], *, nproc: int = 2, standin: bool = False) -> Launch:
    """`mpirun -np N` on this host (as root too, more ranks than cores allowed), the rendezvous on a free
    loopback port, each rank `python program...`."""
    env = _env(standin)
    env["MASTER_ADDR"], env["MASTER_PORT"] = "127.0.0.1", str(free_port())
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(nproc)]
    for name in MPIRUN_EXPORTS:
        cmd += ["-x", name]
    return Launch([*cmd, sys.executable, *program], env)
