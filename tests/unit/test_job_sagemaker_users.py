"""Job builders as SageMaker users need them (issue 51): Debugger hook and Profiler off unless asked, a warm
pool, TensorBoard uploaded, a VPC with FSx/EFS channels, Pipe refused with the reason, one list of SMDDP
instance types."""

from __future__ import annotations

import pytest

from yolov5_smddp import dlc
from yolov5_smddp.client import job
from yolov5_smddp.client.job import (
    FileSystemChannel,
    JobSpec,
    file_system_inputs,
    model_trainer_kwargs,
    pytorch_estimator_kwargs,
)
from yolov5_smddp.distributed import process_group
from yolov5_smddp.errors import ConfigError

IMAGE = "111111111111.dkr.ecr.us-west-2.amazonaws.com/yolov5-smddp:test"
ROLE = "arn:aws:iam::111111111111:role/SageMakerRole"
V3 = {"distribution": "none"}


def test_a_default_spec_has_the_debugger_hook_and_profiler_off_and_asking_turns_them_on():
    kwargs = pytorch_estimator_kwargs(JobSpec(image_uri=IMAGE, role=ROLE))
    assert kwargs["debugger_hook_config"] is False and kwargs["disable_profiler"] is True
    asked = pytorch_estimator_kwargs(JobSpec(image_uri=IMAGE, role=ROLE, debugger=True, profiler=True))
    assert "debugger_hook_config" not in asked and "disable_profiler" not in asked  # the SDK's defaults
    v3 = model_trainer_kwargs(JobSpec(image_uri=IMAGE, role=ROLE, **V3))
    assert not {k for k in v3 if "debug" in k or "profil" in k}  # ModelTrainer runs neither


def test_a_warm_pool_and_a_tensorboard_prefix_map_to_the_sdk_arguments():
    spec = JobSpec(
        image_uri=IMAGE,
        role=ROLE,
        keep_alive_s=1800,
        tensorboard_s3_uri="s3://b/tb/run1/",
        hyperparameters={"epochs": 3},
    )
    v2 = pytorch_estimator_kwargs(spec)
    assert v2["keep_alive_period_in_seconds"] == 1800
    assert v2["tensorboard_output_config"] == {
        "s3_output_path": "s3://b/tb/run1/",
        "container_local_output_path": "/opt/ml/output/tensorboard",
    }
    assert v2["hyperparameters"] == {"epochs": "3", "tensorboard-dir": "/opt/ml/output/tensorboard"}
    v3 = model_trainer_kwargs(JobSpec(**{**spec.__dict__, **V3}))
    assert v3["compute"]["keep_alive_period_in_seconds"] == 1800
    assert v3["tensorboard_output_config"] == {
        "s3_output_path": "s3://b/tb/run1/",
        "local_path": "/opt/ml/output/tensorboard",
    }
    assert v3["hyperparameters"]["tensorboard-dir"] == "/opt/ml/output/tensorboard"
    plain = pytorch_estimator_kwargs(JobSpec(image_uri=IMAGE, role=ROLE))
    assert "keep_alive_period_in_seconds" not in plain and "tensorboard_output_config" not in plain


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"keep_alive_s": 3601}, "1..3600"),
        ({"keep_alive_s": 60, "use_spot_instances": True, "checkpoint_s3_uri": "s3://b/c/"}, "spot"),
        ({"tensorboard_s3_uri": "/local/tb"}, "s3://"),
        (
            {"tensorboard_s3_uri": "s3://b/tb/", "hyperparameters": {"tensorboard-dir": "/tmp/tb"}},
            "leave tensorboard-dir unset",
        ),
        ({"subnets": ("subnet-1",)}, "go together"),
    ],
)
def test_warm_pool_tensorboard_and_vpc_mistakes_are_named(changes, match):
    with pytest.raises(ConfigError, match=match):
        pytorch_estimator_kwargs(JobSpec(image_uri=IMAGE, role=ROLE, **changes))


def test_fsx_and_efs_channels_in_a_vpc():
    fsx = FileSystemChannel("fs-0123", "FSxLustre", "/fsx/coco")
    spec = JobSpec(
        image_uri=IMAGE,
        role=ROLE,
        subnets=("subnet-1", "subnet-2"),
        security_group_ids=("sg-1",),
        file_system_channels={"training": fsx},
    )
    v2 = pytorch_estimator_kwargs(spec)
    assert v2["subnets"] == ["subnet-1", "subnet-2"] and v2["security_group_ids"] == ["sg-1"]
    assert file_system_inputs(spec) == {
        "training": {
            "file_system_id": "fs-0123",
            "file_system_type": "FSxLustre",
            "directory_path": "/fsx/coco",
            "file_system_access_mode": "ro",
        }
    }
    assert model_trainer_kwargs(JobSpec(**{**spec.__dict__, **V3}))["networking"] == {
        "subnets": ["subnet-1", "subnet-2"],
        "security_group_ids": ["sg-1"],
    }
    with pytest.raises(ConfigError, match="VPC: set subnets"):
        pytorch_estimator_kwargs(JobSpec(image_uri=IMAGE, role=ROLE, file_system_channels={"training": fsx}))
    with pytest.raises(ConfigError, match="file_system_type 'Lustre'"):
        file_system_inputs(
            JobSpec(
                **{
                    **spec.__dict__,
                    "file_system_channels": {"training": FileSystemChannel("fs-1", "Lustre", "/x")},
                }
            )
        )
    with pytest.raises(ConfigError, match="both as an S3 prefix and as a file system"):
        pytorch_estimator_kwargs(JobSpec(**{**spec.__dict__, "train_s3_uri": "s3://b/train/"}))


def test_pipe_is_refused_by_both_builders_naming_file_and_fastfile():
    for build, extra in ((pytorch_estimator_kwargs, {}), (model_trainer_kwargs, V3)):
        with pytest.raises(ConfigError, match="input_mode 'Pipe' .*FIFO.*'FastFile'.*'File'"):
            build(JobSpec(image_uri=IMAGE, role=ROLE, input_mode="Pipe", **extra))
    assert (
        model_trainer_kwargs(JobSpec(image_uri=IMAGE, role=ROLE, input_mode="File", **V3))[
            "training_input_mode"
        ]
        == "File"
    )


def test_one_list_of_smddp_instance_types():
    assert job.SMDDP_INSTANCE_TYPES is dlc.SMDDP_INSTANCE_TYPES
    assert process_group.SMDDP_INSTANCE_TYPES == set(dlc.SMDDP_OPTIMISED_INSTANCE_TYPES)
    assert process_group.SMDDP_INSTANCE_TYPES <= set(job.SMDDP_INSTANCE_TYPES)
    pytorch_estimator_kwargs(JobSpec(image_uri=IMAGE, role=ROLE, instance_type="ml.p3dn.24xlarge"))
    with pytest.raises(ConfigError, match="does not support instance type 'ml.g5.48xlarge'"):
        pytorch_estimator_kwargs(JobSpec(image_uri=IMAGE, role=ROLE, instance_type="ml.g5.48xlarge"))


def test_the_image_installs_a_pinned_tensorboard_so_tensorboard_dir_writes_events():
    import re
    from pathlib import Path

    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    assert re.search(
        r'python3 -c "import tensorboard" 2>/dev/null \|\| pip_install "tensorboard==\d+\.\d+\.\d+"',
        dockerfile,
    )
