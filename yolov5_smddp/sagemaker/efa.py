"""EFA and NCCL variables for our own launcher (a SageMaker job without a `distribution`).

The toolkit exports these itself only for the ranks it starts (its torchrun and mpirun runners); with no
`distribution` our elastic launcher (`launch.run_elastic`, one process per host) starts the workers, so the
job driver adds them to the environment it hands that launcher for its workers. `network_environment()` is pure: a
function of the instance type, the SageMaker network interface and the current environment, and it never
replaces a variable that is already set (by the user, the image or the toolkit: the DLC's
sagemaker-pytorch-training `training.py` `_set_nccl_environment()` already sets NCCL_SOCKET_IFNAME,
NCCL_IB_DISABLE=1 and NCCL_DEBUG=WARN for every job, so NCCL_SOCKET_IFNAME is usually kept as it is).

Facts (not code) from:
- aws/sagemaker-training-toolkit `src/sagemaker_training/__init__.py` (SM_EFA_NCCL_INSTANCES,
  SM_EFA_RDMA_INSTANCES, master as of 2025-09) and `torch_distributed.py` `_setup()`: FI_PROVIDER=efa on the
  EFA types, FI_EFA_USE_DEVICE_RDMA=1 on the RDMA types, NCCL_SOCKET_IFNAME = the network interface and
  NCCL_PROTO=simple ("out-of-order data delivery from EFA", toolkit PR #196, 2023; its mpirun and SMDDP
  runners set NCCL_PROTO only on the EFA types, as we do).
- sagemaker-training-toolkit issue 240 / PR 241 (merged 2026-01): ml.p5e.48xlarge was missing from both lists
  and ml.p5.48xlarge from the RDMA list; jobs there fell back to TCP sockets and hung in NCCL init at 256+ ranks.
- aws/aws-ofi-nccl `doc/efa-env-var.md`: FI_PROVIDER and NCCL_PROTO=simple are needed only with
  aws-ofi-nccl <= 1.5.0 (the 2.5.1 DLC builds 1.12.1: deep-learning-containers
  pytorch/training/docker/2.5/py3/cu124/Dockerfile.gpu); we still set them, as the toolkit's torchrun path
  does, and a user who measured otherwise sets them in the job's environment. FI_EFA_USE_DEVICE_RDMA=1 is
  "not harmful" on p4/p5. RDMAV_FORK_SAFE=1: "Do not use" (it can break things on newer kernels), so unlike
  the toolkit's torchrun runner we leave it out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# The toolkit's SM_EFA_NCCL_INSTANCES plus ml.p5e.48xlarge (PR 241).
EFA_INSTANCE_TYPES = frozenset(
    {
        "ml.g4dn.8xlarge",
        "ml.g4dn.12xlarge",
        "ml.g5.48xlarge",
        "ml.p3dn.24xlarge",
        "ml.p4d.24xlarge",
        "ml.p4de.24xlarge",
        "ml.p5.48xlarge",
        "ml.p5e.48xlarge",
        "ml.trn1.32xlarge",
        "ml.p6e-gb200.36xlarge",
    }
)
# The toolkit's SM_EFA_RDMA_INSTANCES plus ml.p5.48xlarge and ml.p5e.48xlarge (PR 241): GPUDirect RDMA.
EFA_RDMA_INSTANCE_TYPES = frozenset(
    {
        "ml.p4d.24xlarge",
        "ml.p4de.24xlarge",
        "ml.p5.48xlarge",
        "ml.p5e.48xlarge",
        "ml.trn1.32xlarge",
        "ml.p6e-gb200.36xlarge",
    }
)


@dataclass(frozen=True)
class NetworkEnvironment:
    """What the launching process adds to its environment, and what it found already set."""

    added: dict[str, str]
    """Variables to set (sorted by name)."""
    kept: dict[str, str]
    """Variables we would have set that the environment already has: name -> the value kept."""

    def log_line(self, instance_type: str | None) -> str:
        """One line for the job log, e.g. `network (ml.p4d.24xlarge): FI_PROVIDER=efa ...; already set NCCL_PROTO=LL`."""
        added = " ".join(f"{k}={v}" for k, v in self.added.items()) or "nothing added"
        line = f"network ({instance_type or 'unknown instance type'}): {added}"
        if self.kept:
            line += "; already set " + " ".join(f"{k}={v}" for k, v in self.kept.items())
        return line


def network_environment(
    instance_type: str | None, network_interface: str, environ: Mapping[str, str]
) -> NetworkEnvironment:
    """The EFA/NCCL variables for the workers of one host (pure).

    `instance_type` is SM_CURRENT_INSTANCE_TYPE (e.g. "ml.p4d.24xlarge"); anything not starting with "ml."
    ("local", "local_gpu", None: local mode, a plain `docker run`) gets nothing, because there the interface
    name SageMaker reports (local mode writes eth0 or ethwe) need not exist and NCCL's bootstrap would fail.
    `network_interface` is SM_NETWORK_INTERFACE_NAME. A variable already in `environ` is never replaced.
    """
    if not instance_type or not instance_type.startswith("ml."):
        return NetworkEnvironment(added={}, kept={})
    wanted = {"NCCL_SOCKET_IFNAME": network_interface}
    if instance_type in EFA_INSTANCE_TYPES:
        wanted["FI_PROVIDER"] = "efa"
        wanted["NCCL_PROTO"] = "simple"
    if instance_type in EFA_RDMA_INSTANCE_TYPES:
        wanted["FI_EFA_USE_DEVICE_RDMA"] = "1"
    names = sorted(wanted)
    return NetworkEnvironment(
        added={k: wanted[k] for k in names if k not in environ},
        kept={k: environ[k] for k in names if k in environ},
    )
