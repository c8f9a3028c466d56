"""Deploy builders (SDK v2 Model / deploy, SDK v3 ModelBuilder over our own image) and the example's --dry-run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from yolov5_smddp.client.deploy import (
    DeploySpec,
    deploy_kwargs,
    model_builder_deploy_kwargs,
    model_builder_kwargs,
    model_kwargs,
)
from yolov5_smddp.errors import ConfigError

ROLE = "arn:aws:iam::111111111111:role/SageMakerRole"
DATA = "s3://bucket/yolov5-smddp-2026/output/model.tar.gz"
IMAGE = "111111111111.dkr.ecr.us-west-2.amazonaws.com/yolov5-smddp:current"


def test_sdk_v2_arguments_serve_our_image():
    spec = DeploySpec(
        model_data=DATA, role=ROLE, image_uri=IMAGE, thresholds={"YOLOV5_CONF": "0.4"}, endpoint_name="det"
    )
    assert model_kwargs(spec) == {
        "image_uri": IMAGE,
        "model_data": DATA,
        "role": ROLE,
        "env": {"YOLOV5_CONF": "0.4"},
        "predictor_cls": "sagemaker.predictor.Predictor",
    }
    assert deploy_kwargs(spec) == {
        "initial_instance_count": 1,
        "instance_type": "ml.g5.xlarge",
        "serializer": "IdentitySerializer(content_type='image/jpeg')",
        "deserializer": "JSONDeserializer()",
        "endpoint_name": "det",
    }


def test_sdk_v3_arguments_serve_our_image():
    digest = "111111111111.dkr.ecr.eu-west-1.amazonaws.com/team/yolov5-smddp@sha256:" + "ab" * 32
    spec = DeploySpec(
        model_data=DATA,
        role=ROLE,
        image_uri=digest,
        instance_type="ml.c5.xlarge",
        region="eu-west-1",
        thresholds={"YOLOV5_IOU": "0.5", "YOLOV5_MAX_DET": "100"},
    )
    assert model_builder_kwargs(spec) == {
        "model_path": DATA,
        "image_uri": digest,
        "role_arn": ROLE,
        "env_vars": {"YOLOV5_IOU": "0.5", "YOLOV5_MAX_DET": "100"},
        "instance_type": "ml.c5.xlarge",
    }
    assert model_builder_deploy_kwargs(spec) == {"initial_instance_count": 1, "instance_type": "ml.c5.xlarge"}


@pytest.mark.parametrize(
    "image",
    [
        "yolov5-smddp:latest",  # a local tag: SageMaker hosting pulls from ECR only
        "docker.io/library/yolov5-smddp:latest",
        "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-inference",  # no tag or digest
        "11111111111.dkr.ecr.us-west-2.amazonaws.com/yolov5-smddp:latest",  # 11-digit account
        "111111111111.dkr.ecr.us-west-2.amazonaws.com/Yolov5:latest",  # ECR repositories are lower case
    ],
)
def test_an_image_outside_ecr_is_refused(image):
    spec = DeploySpec(model_data=DATA, role=ROLE, image_uri=image)
    refused = r"image URI .*: expected the ECR image the model was trained with"
    for builder in (model_kwargs, deploy_kwargs, model_builder_kwargs, model_builder_deploy_kwargs):
        with pytest.raises(ConfigError, match=refused):
            builder(spec)


def test_an_image_in_another_region_than_the_endpoint_is_refused():
    spec = DeploySpec(model_data=DATA, role=ROLE, image_uri=IMAGE, region="eu-west-1")
    with pytest.raises(ConfigError, match="is in us-west-2, the endpoint in eu-west-1"):
        model_kwargs(spec)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_data": "s3://bucket/output/"}, "expected the S3 URI of a model.tar.gz"),
        ({"model_data": "/local/model.tar.gz"}, "expected the S3 URI of a model.tar.gz"),
        ({"role": "SageMakerRole"}, "expected an IAM role ARN"),
        ({"instance_count": 0}, "instance count 0: must be at least 1"),
        ({"thresholds": {"CONF": "0.3"}}, r"threshold variables \['CONF'\]"),
        ({"thresholds": {"YOLOV5_CONF": "high"}}, "YOLOV5_CONF='high': not a number"),
        ({"thresholds": {"YOLOV5_IOU": "1.5"}}, r"YOLOV5_IOU=1.5: must lie in \[0, 1\]"),
        ({"thresholds": {"YOLOV5_MAX_DET": "2.5"}}, "YOLOV5_MAX_DET=2.5: must be a positive integer"),
    ],
)
def test_bad_specs_are_named(change, message):
    spec = DeploySpec(**{"model_data": DATA, "role": ROLE, "image_uri": IMAGE, **change})
    for builder in (model_kwargs, deploy_kwargs, model_builder_kwargs):
        with pytest.raises(ConfigError, match=message):
            builder(spec)


def _example():
    path = Path(__file__).resolve().parents[2] / "examples" / "deploy_sagemaker.py"
    spec = importlib.util.spec_from_file_location("deploy_sagemaker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_dry_run_prints_the_sdk_arguments(capsys):
    example = _example()
    common = ["--model-data", DATA, "--role", ROLE, "--image-uri", IMAGE, "--dry-run"]
    example.main([*common, "--env", "YOLOV5_IOU=0.5"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["Model"] == {
        "image_uri": IMAGE,
        "model_data": DATA,
        "role": ROLE,
        "env": {"YOLOV5_IOU": "0.5"},
        "predictor_cls": "sagemaker.predictor.Predictor",
    }
    assert printed["deploy"]["instance_type"] == "ml.g5.xlarge"
    example.main([*common, "--sdk", "v3"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["ModelBuilder"]["image_uri"] == IMAGE
    assert printed["ModelBuilder"]["env_vars"] == {}
    with pytest.raises(ConfigError, match="--env 'YOLOV5_CONF': expected KEY=VALUE"):
        example.main([*common, "--env", "YOLOV5_CONF"])
    with pytest.raises(ConfigError, match="image URI 'yolov5-smddp:latest'"):
        example.main([*common[:4], "--image-uri", "yolov5-smddp:latest", "--dry-run"])
