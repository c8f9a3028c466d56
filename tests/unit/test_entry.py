"""docker/entry.py (the image's PID 1): which processes a stop's SIGTERM is passed on to."""

import importlib.util
from pathlib import Path

import pytest

ENTRY = Path(__file__).resolve().parents[2] / "docker" / "entry.py"


@pytest.fixture(scope="module")
def entry():
    spec = importlib.util.spec_from_file_location("docker_entry", ENTRY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argv", "relay"),
    [
        # the toolkit and the launchers between it and the ranks: each would SIGKILL its ranks early
        (["/usr/bin/python3", "/usr/local/bin/train"], True),
        (["mpirun", "--host", "algo-1:8,algo-2:8", "-np", "16", "smddprun", "python", "-m", "mpi4py"], True),
        (["/opt/amazon/openmpi/bin/orted", "-mca", "ess", "env"], True),
        (["/usr/bin/python3", "/usr/local/bin/torchrun", "--nnodes", "2", "entrypoint.py"], True),
        (["/usr/bin/python3", "-m", "torch.distributed.run", "--nproc_per_node", "8", "entrypoint.py"], True),
        (["/usr/sbin/sshd", "-D"], True),
        ([], True),  # no command line: a kernel thread or a zombie
        # the training processes: they write the checkpoint and the model folder
        (["/usr/bin/python3", "entrypoint.py", "--epochs", "3"], False),
        (["/usr/bin/python3", "-m", "mpi4py", "entrypoint.py", "--train", "x"], False),
        (["/usr/bin/python3", "-m", "yolov5_smddp.launch", "--epochs", "3"], False),
    ],
)
def test_a_stop_reaches_the_ranks_not_the_relays(entry, argv, relay):
    assert entry.is_relay(argv) is relay
