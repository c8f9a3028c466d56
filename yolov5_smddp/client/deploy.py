"""Pure builders of a SageMaker real-time endpoint for a trained model's `model.tar.gz` (best.torchscript
+ code/inference.py, see `yolov5_smddp.serving`): the keyword arguments of the SDK v2
`sagemaker.pytorch.PyTorchModel(...)` and of its `.deploy(...)`, and a plain description of the SDK v3
`ModelBuilder(...)`. Nothing here imports the SDK or talks to AWS; `examples/deploy_sagemaker.py` turns
the results into SDK objects.

The endpoint runs the AWS PyTorch inference container (which does not have our package); the handler's
thresholds come from its environment (YOLOV5_CONF, YOLOV5_IOU, YOLOV5_MAX_DET).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from yolov5_smddp.errors import ConfigError

DLC_ACCOUNT = "763104351884"
DEFAULT_REGION = "us-west-2"
FRAMEWORK_VERSION = "2.5.1"  # the training DLC's torch: TorchScript files load in the same version
PY_VERSION = "py311"
ENTRY_POINT = "inference.py"
SOURCE_DIR = "code"
CONTAINER_CODE_DIR = "/opt/ml/model/code"  # where the inference container finds model.tar.gz's code/
THRESHOLD_ENV = ("YOLOV5_CONF", "YOLOV5_IOU", "YOLOV5_MAX_DET")
_GPU_FAMILIES = ("ml.g", "ml.p")


@dataclass(frozen=True, kw_only=True)
class DeploySpec:
    """An endpoint for one model.tar.gz, in plain values."""

    model_data: str
    """S3 URI of the training job's model.tar.gz (`estimator.model_data`)."""
    role: str
    """IAM role ARN the endpoint runs as."""
    instance_type: str = "ml.g5.xlarge"
    instance_count: int = 1
    endpoint_name: str | None = None
    region: str = DEFAULT_REGION
    source_dir: str = SOURCE_DIR
    """A local folder holding inference.py (a copy of the model folder's code/)."""
    thresholds: Mapping[str, str] = field(default_factory=dict)
    """Subset of THRESHOLD_ENV → value, e.g. {"YOLOV5_CONF": "0.4"}."""


def check_spec(spec: DeploySpec) -> None:
    """ConfigError naming the value that cannot work."""
    if not re.fullmatch(r"s3://[^/]+/.+\.tar\.gz", spec.model_data):
        raise ConfigError(
            f"model data {spec.model_data!r}: expected the S3 URI of a model.tar.gz "
            f"(s3://bucket/prefix/output/model.tar.gz)"
        )
    if not spec.role.startswith("arn:aws"):
        raise ConfigError(
            f"role {spec.role!r}: expected an IAM role ARN (arn:aws:iam::<account>:role/<name>)"
        )
    if spec.instance_count < 1:
        raise ConfigError(f"instance count {spec.instance_count}: must be at least 1")
    unknown = sorted(set(spec.thresholds) - set(THRESHOLD_ENV))
    if unknown:
        raise ConfigError(f"threshold variables {unknown}: known are {list(THRESHOLD_ENV)}")
    for key, value in spec.thresholds.items():
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{key}={value!r}: not a number") from None
        if key != "YOLOV5_MAX_DET" and not 0 <= number <= 1:
            raise ConfigError(f"{key}={value}: must lie in [0, 1]")
        if key == "YOLOV5_MAX_DET" and (number < 1 or number != int(number)):
            raise ConfigError(f"{key}={value}: must be a positive integer")


def is_gpu(instance_type: str) -> bool:
    return instance_type.startswith(_GPU_FAMILIES)


def inference_image_uri(region: str, instance_type: str) -> str:
    """The AWS PyTorch inference container for FRAMEWORK_VERSION, GPU or CPU by instance type."""
    tag = (
        f"{FRAMEWORK_VERSION}-gpu-{PY_VERSION}-cu124-ubuntu22.04-sagemaker"
        if is_gpu(instance_type)
        else f"{FRAMEWORK_VERSION}-cpu-{PY_VERSION}-ubuntu22.04-sagemaker"
    )
    return f"{DLC_ACCOUNT}.dkr.ecr.{region}.amazonaws.com/pytorch-inference:{tag}"


def pytorch_model_kwargs(spec: DeploySpec) -> dict:
    """Keyword arguments of SDK v2 `sagemaker.pytorch.PyTorchModel(...)`."""
    check_spec(spec)
    return {
        "model_data": spec.model_data,
        "role": spec.role,
        "entry_point": ENTRY_POINT,
        "source_dir": spec.source_dir,
        "framework_version": FRAMEWORK_VERSION,
        "py_version": PY_VERSION,
        "env": dict(spec.thresholds),
    }


def deploy_kwargs(spec: DeploySpec) -> dict:
    """Keyword arguments of SDK v2 `PyTorchModel.deploy(...)` (serializer/deserializer named as strings:
    the example builds IdentitySerializer("image/jpeg") and JSONDeserializer())."""
    check_spec(spec)
    kwargs = {
        "initial_instance_count": spec.instance_count,
        "instance_type": spec.instance_type,
        "serializer": "IdentitySerializer(content_type='image/jpeg')",
        "deserializer": "JSONDeserializer()",
    }
    if spec.endpoint_name:
        kwargs["endpoint_name"] = spec.endpoint_name
    return kwargs


def model_builder_kwargs(spec: DeploySpec) -> dict:
    """SDK v3: `sagemaker.serve.ModelBuilder(...)` over the same model.tar.gz and inference container;
    the container runs code/inference.py because SAGEMAKER_PROGRAM / SAGEMAKER_SUBMIT_DIRECTORY say so
    (what v2's PyTorchModel sets for you). Then `.build()` and `.deploy(**v3 deploy arguments)`."""
    check_spec(spec)
    return {
        "model_path": spec.model_data,
        "image_uri": inference_image_uri(spec.region, spec.instance_type),
        "role_arn": spec.role,
        "env_vars": {
            "SAGEMAKER_PROGRAM": ENTRY_POINT,
            "SAGEMAKER_SUBMIT_DIRECTORY": CONTAINER_CODE_DIR,
            **spec.thresholds,
        },
        "instance_type": spec.instance_type,
    }


def model_builder_deploy_kwargs(spec: DeploySpec) -> dict:
    """Keyword arguments of SDK v3 `ModelBuilder.deploy(...)`."""
    check_spec(spec)
    kwargs = {"initial_instance_count": spec.instance_count, "instance_type": spec.instance_type}
    if spec.endpoint_name:
        kwargs["endpoint_name"] = spec.endpoint_name
    return kwargs
