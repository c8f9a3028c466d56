"""The AWS PyTorch training DLCs this project builds on: the one place their account and tags are written.

Two flavours, both first-class (`./build.sh build --dlc current|smddp`):

- current (the default): the newest PyTorch training DLC that AWS still patches (PyTorch 2.10, Python 3.13,
  CUDA 13.0; released 2026-03-23, supported to 2027-01-21). NCCL, no SMDDP. The default because an image
  built on it inherits a base that receives security patches.
- smddp: the 2.5.1 DLC, the last that ships SMDDP (smdistributed-dataparallel), for users who want SMDDP;
  AWS no longer patches it.

The Dockerfile repeats them as its `ARG DLC_ACCOUNT` / `ARG CURRENT_DLC_TAG` / `ARG SMDDP_DLC_TAG` defaults (a
Dockerfile cannot import Python; tests/unit/test_job.py checks that they agree) and build.sh reads them from
the Dockerfile. Confirm a tag with `aws ecr describe-images --registry-id 763104351884 --region us-west-2
--repository-name pytorch-training --image-ids imageTag=<tag>` (aws/deep-learning-containers'
available_images.md and release notes list them).
"""

DLC_ACCOUNT = "763104351884"
DLC_TAG = "2.5.1-gpu-py311-cu124-ubuntu22.04-sagemaker"
"""The SMDDP DLC (the `smddp` flavour)."""
SMDDP_DLC_TAG = DLC_TAG
CURRENT_DLC_TAG = "2.10.0-gpu-py313-cu130-ubuntu22.04-sagemaker"
"""The newest supported PyTorch training DLC (the `current` flavour): NCCL, no SMDDP."""
DLC_TAGS = {"current": CURRENT_DLC_TAG, "smddp": SMDDP_DLC_TAG}
DEFAULT_DLC = "current"
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
