"""The AWS PyTorch training DLC this project builds on: the one place its account and tag are written.

The Dockerfile repeats them as its `ARG DLC_ACCOUNT` / `ARG DLC_TAG` defaults (a Dockerfile cannot import
Python; tests/unit/test_job.py checks that they agree) and build.sh reads them from the Dockerfile.
"""

DLC_ACCOUNT = "763104351884"
DLC_TAG = "2.5.1-gpu-py311-cu124-ubuntu22.04-sagemaker"
SMDDP_DLCS = (
    f"the SageMaker PyTorch GPU DLCs 2.5.1 (pytorch-training:{DLC_TAG}), "
    "2.4.0 (2.4.0-gpu-py311-cu124-ubuntu22.04-sagemaker) and 2.3.0 (2.3.0-gpu-py311-cu121-ubuntu20.04-sagemaker); "
    "no DLC from 2.6 on ships it"
)
"""The DLCs that ship SMDDP (smdistributed-dataparallel), for messages."""


def dlc_image_uri(region: str, tag: str = DLC_TAG) -> str:
    """The AWS PyTorch training DLC for `region` (the default base of our image)."""
    return f"{DLC_ACCOUNT}.dkr.ecr.{region}.amazonaws.com/pytorch-training:{tag}"


SMDDP_INSTANCE_TYPES = ("ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p3dn.24xlarge")
"""The one list of instance types SMDDP runs on (AWS: p4d and p4de with its optimisations, p3dn without
them): the job builders (job.py) refuse SMDDP elsewhere; `--backend auto` (distributed.py) picks it only on
SMDDP_OPTIMISED_INSTANCE_TYPES."""
SMDDP_OPTIMISED_INSTANCE_TYPES = SMDDP_INSTANCE_TYPES[:2]
"""The types SMDDP's optimisations are for: on ml.p3dn.24xlarge it gains nothing over NCCL (and its V100s
have no bf16)."""
