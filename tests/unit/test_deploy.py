"""Deploy builders (SDK v2 PyTorchModel / deploy, SDK v3 ModelBuilder) and the example's --dry-run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from yolov5_smddp.client.deploy import (
    DeploySpec,
    deploy_kwargs,
    inference_image_uri,
    model_builder_deploy_kwargs,
    model_builder_kwargs,
    pytorch_model_kwargs,
)
from yolov5_smddp.errors import ConfigError

ROLE = "arn:aws:iam::111111111111:role/SageMakerRole"
DATA = "s3://bucket/yolov5-smddp-2026/output/model.tar.gz"


def test_sdk_v2_arguments():
    spec = DeploySpec(model_data=DATA, role=ROLE, thresholds={"YOLOV5_CONF": "0.4"}, endpoint_name="det")
    assert pytorch_model_kwargs(spec) == {
        "model_data": DATA,
        "role": ROLE,
        "entry_point": "inference.py",
        "source_dir": "code",
        "framework_version": "2.5.1",
        "py_version": "py311",
        "env": {"YOLOV5_CONF": "0.4"},
    }
    assert deploy_kwargs(spec) == {
        "initial_instance_count": 1,
        "instance_type": "ml.g5.xlarge",
        "serializer": "IdentitySerializer(content_type='image/jpeg')",
        "deserializer": "JSONDeserializer()",
        "endpoint_name": "det",
    }


def test_sdk_v3_arguments_pick_the_inference_container_by_instance_type():
    spec = DeploySpec(model_data=DATA, role=ROLE, instance_type="ml.c5.xlarge", region="eu-west-1")
    assert model_builder_kwargs(spec) == {
        "model_path": DATA,
        "image_uri": "763104351884.dkr.ecr.eu-west-1.amazonaws.com/pytorch-inference:"
        "2.5.1-cpu-py311-ubuntu22.04-sagemaker",
        "role_arn": ROLE,
        "env_vars": {"SAGEMAKER_PROGRAM": "inference.py", "SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/code"},
        "instance_type": "ml.c5.xlarge",
    }
    assert model_builder_deploy_kwargs(spec) == {"initial_instance_count": 1, "instance_type": "ml.c5.xlarge"}
    assert inference_image_uri("us-east-1", "ml.g5.2xlarge") == (
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-inference:2.5.1-gpu-py311-cu124-ubuntu22.04-sagemaker"
    )


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
    spec = DeploySpec(**{"model_data": DATA, "role": ROLE, **change})
    for builder in (pytorch_model_kwargs, deploy_kwargs, model_builder_kwargs):
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
    example.main(["--model-data", DATA, "--role", ROLE, "--env", "YOLOV5_IOU=0.5", "--dry-run"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["PyTorchModel"]["entry_point"] == "inference.py"
    assert printed["PyTorchModel"]["source_dir"] == "code"
    assert printed["PyTorchModel"]["env"] == {"YOLOV5_IOU": "0.5"}
    assert printed["deploy"]["instance_type"] == "ml.g5.xlarge"
    example.main(["--model-data", DATA, "--role", ROLE, "--sdk", "v3", "--dry-run"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["ModelBuilder"]["env_vars"]["SAGEMAKER_PROGRAM"] == "inference.py"
    with pytest.raises(ConfigError, match="--env 'YOLOV5_CONF': expected KEY=VALUE"):
        example.main(["--model-data", DATA, "--role", ROLE, "--env", "YOLOV5_CONF", "--dry-run"])
