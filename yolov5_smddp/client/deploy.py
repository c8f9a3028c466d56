"""Pure builders of a SageMaker real-time endpoint for a trained model's `model.tar.gz` (best.pt2 or
best.torchscript + code/inference.py, see `yolov5_smddp.serving`) served by OUR image: the keyword
arguments of the SDK v2 `sagemaker.model.Model(...)` and of its `.deploy(...)`, and a plain description of
the SDK v3 `ModelBuilder(...)`. Nothing here imports the SDK or talks to AWS; `examples/deploy_sagemaker.py`
turns the results into SDK objects.

The endpoint runs the image the model was trained with (`image_uri`, in ECR): SageMaker hosting starts it
as `docker run IMAGE serve` with model.tar.gz extracted at /opt/ml/model, and the image's ENTRYPOINT
(docker/entry.py) hands `serve` to `yolov5_smddp.serving.server` (/ping and /invocations on port 8080,
running the model folder's code/inference.py). No TorchServe and no AWS inference image: AWS stopped
patching its TorchServe-based PyTorch inference images (the last, 2.6, on 2026-06-30). The handler's
thresholds come from the endpoint's environment (YOLOV5_CONF, YOLOV5_IOU, YOLOV5_MAX_DET).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from yolov5_smddp.errors import ConfigError

THRESHOLD_ENV = ("YOLOV5_CONF", "YOLOV5_IOU", "YOLOV5_MAX_DET")
# named as a string (no SDK import here): v2's Model.deploy returns None without a predictor_cls
PREDICTOR_CLS = "sagemaker.predictor.Predictor"
_ECR_IMAGE = re.compile(
    r"(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d)\.amazonaws\.com(?:\.cn)?"
    r"/[a-z0-9]+(?:[._/-][a-z0-9]+)*(?::[\w][\w.-]{0,127}|@sha256:[0-9a-f]{64})"
)


@dataclass(frozen=True, kw_only=True)
class DeploySpec:
    """An endpoint for one model.tar.gz, in plain values."""

    model_data: str
    """S3 URI of the training job's model.tar.gz (`estimator.model_data`)."""
    role: str
    """IAM role ARN the endpoint runs as."""
    image_uri: str
    """The ECR image the model was trained with (`build.sh push`): it serves the model (`serve`)."""
    instance_type: str = "ml.g5.xlarge"
    instance_count: int = 1
    endpoint_name: str | None = None
    region: str | None = None
    """The endpoint's region; None: the image's (SageMaker pulls the image from its own region's ECR)."""
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
    image = _ECR_IMAGE.fullmatch(spec.image_uri)
    if image is None:
        raise ConfigError(
            f"image URI {spec.image_uri!r}: expected the ECR image the model was trained with "
            f"(<account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag>, as `build.sh push` prints); "
            f"SageMaker hosting pulls only from ECR"
        )
    if spec.region is not None and image["region"] != spec.region:
        raise ConfigError(
            f"image URI {spec.image_uri!r} is in {image['region']}, the endpoint in {spec.region}: "
            f"push the image to {spec.region}'s ECR (SageMaker pulls from the endpoint's region)"
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


def model_kwargs(spec: DeploySpec) -> dict:
    """Keyword arguments of SDK v2 `sagemaker.model.Model(...)`: our image, the archive as it is (its
    code/inference.py is the handler; nothing is repacked), the thresholds as env. `predictor_cls` is
    named as a string: the example passes `sagemaker.predictor.Predictor`."""
    check_spec(spec)
    return {
        "image_uri": spec.image_uri,
        "model_data": spec.model_data,
        "role": spec.role,
        "env": dict(spec.thresholds),
        "predictor_cls": PREDICTOR_CLS,
    }


def deploy_kwargs(spec: DeploySpec) -> dict:
    """Keyword arguments of SDK v2 `Model.deploy(...)` (serializer/deserializer named as strings:
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
    """SDK v3: `sagemaker.serve.ModelBuilder(...)` over the same model.tar.gz and our image (which SageMaker
    starts with `serve`); then `.build()` and `.deploy(**model_builder_deploy_kwargs)`."""
    check_spec(spec)
    return {
        "model_path": spec.model_data,
        "image_uri": spec.image_uri,
        "role_arn": spec.role,
        "env_vars": dict(spec.thresholds),
        "instance_type": spec.instance_type,
    }


def model_builder_deploy_kwargs(spec: DeploySpec) -> dict:
    """Keyword arguments of SDK v3 `ModelBuilder.deploy(...)`."""
    check_spec(spec)
    kwargs = {"initial_instance_count": spec.instance_count, "instance_type": spec.instance_type}
    if spec.endpoint_name:
        kwargs["endpoint_name"] = spec.endpoint_name
    return kwargs
