"""What the multi-process integration tests share: a free loopback port, and the environment for a
child process (this checkout first on PYTHONPATH, no inherited rank variables, one OpenMP thread)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
_INHERITED_RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_", "OMPI_", "MASTER_")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(*extra_paths: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED_RANK_VARIABLES)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *map(str, extra_paths), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env.setdefault("USE_LIBUV", "0")  # Debian's torch has no libuv TCPStore
    return env
