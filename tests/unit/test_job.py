"""Exact SageMaker SDK arguments built by yolov5_smddp.client.job (no SDK, no AWS)."""

import pytest

from yolov5_smddp.client.job import (
    OBJECTIVE_METRIC,
    CategoricalRange,
    ContinuousRange,
    IntegerRange,
    JobSpec,
    TuningSpec,
    data_channels,
    distribution_config,
    dlc_image_uri,
    hyperparameter_strings,
    model_trainer_kwargs,
    pytorch_estimator_kwargs,
    tuner_kwargs,
)
from yolov5_smddp.errors import ConfigError

IMAGE = "111111111111.dkr.ecr.us-east-1.amazonaws.com/yolov5-smddp:0.1.0-abc1234"
ROLE = "arn:aws:iam::111111111111:role/SageMaker"
METRICS = [{"Name": "train:loss", "Regex": "train_loss=([0-9.]+)"}]


def test_estimator_kwargs_smddp_spot_exact():
    spec = JobSpec(
        image_uri=IMAGE,
        role=ROLE,
        instance_count=2,
        hyperparameters={"epochs": 3, "batch-size": 256, "rect": False},
        checkpoint_s3_uri="s3://b/ckpt/",
        use_spot_instances=True,
        max_run_s=3600,
        metric_definitions=METRICS,
    )
    assert pytorch_estimator_kwargs(spec) == {
        "entry_point": "entrypoint.py",
        "image_uri": IMAGE,
        "role": ROLE,
        "instance_type": "ml.p4d.24xlarge",
        "instance_count": 2,
        "hyperparameters": {"epochs": "3", "batch-size": "256", "rect": "False"},
        "metric_definitions": METRICS,
        "max_run": 3600,
        "volume_size": 100,
        "base_job_name": "yolov5-smddp",
        "environment": {},
        "input_mode": "FastFile",
        "use_spot_instances": True,
        "debugger_hook_config": False,
        "disable_profiler": True,
        "distribution": {"smdistributed": {"dataparallel": {"enabled": True}}},
        "max_wait": 7200,
        "checkpoint_s3_uri": "s3://b/ckpt/",
        "checkpoint_local_path": "/opt/ml/checkpoints",
    }


def test_estimator_kwargs_no_distribution_has_no_distribution_key():
    spec = JobSpec(
        image_uri=IMAGE,
        role=ROLE,
        instance_type="ml.g5.12xlarge",
        distribution="none",
        metric_definitions=METRICS,
        output_path="s3://b/out",
        source_dir="/tmp/code",
    )
    kwargs = pytorch_estimator_kwargs(spec)
    assert "distribution" not in kwargs and "max_wait" not in kwargs and "checkpoint_s3_uri" not in kwargs
    assert kwargs["output_path"] == "s3://b/out"
    assert kwargs["source_dir"] == "/tmp/code"


def test_distribution_config_values():
    assert distribution_config("torchrun", "ml.p5.48xlarge") == {"torch_distributed": {"enabled": True}}
    assert distribution_config("none", "ml.g5.xlarge") is None
    with pytest.raises(ConfigError, match="ml.p5.48xlarge"):
        distribution_config("smddp", "ml.p5.48xlarge")
    with pytest.raises(ConfigError, match="'horovod'"):
        distribution_config("horovod", "ml.p4d.24xlarge")


def test_hyperparameter_strings_rejects_bad_names_and_values():
    assert hyperparameter_strings({"lr0": 0.01, "sync-bn": True, "cfg": "yolov5s"}) == {
        "lr0": "0.01",
        "sync-bn": "True",
        "cfg": "yolov5s",
    }
    with pytest.raises(ConfigError, match="'epochs; rm'"):
        hyperparameter_strings({"epochs; rm": 1})
    with pytest.raises(ConfigError, match="'names'"):
        hyperparameter_strings({"names": ["a", "b"]})


def test_a_time_budget_must_end_before_max_run():
    def spec(hours, max_run_s):
        hps = {"time": hours, "cfg": "yolov5s"}
        return JobSpec(image_uri=IMAGE, role=ROLE, hyperparameters=hps, max_run_s=max_run_s)

    with pytest.raises(ConfigError, match=r"time=2 \(7200 s\) is not below max_run_s \(7200\).*e\.g\. 8460"):
        pytorch_estimator_kwargs(spec(2, 7200))
    assert pytorch_estimator_kwargs(spec("1.5", 7200))["max_run"] == 7200


def test_spot_checks():
    with pytest.raises(ConfigError, match="checkpoint_s3_uri"):
        pytorch_estimator_kwargs(
            JobSpec(image_uri=IMAGE, role=ROLE, use_spot_instances=True, metric_definitions=METRICS)
        )
    with pytest.raises(ConfigError, match="max_wait_s"):
        pytorch_estimator_kwargs(
            JobSpec(
                image_uri=IMAGE,
                role=ROLE,
                use_spot_instances=True,
                checkpoint_s3_uri="s3://b/c/",
                max_run_s=100,
                max_wait_s=50,
                metric_definitions=METRICS,
            )
        )


def test_data_channels():
    spec = JobSpec(image_uri=IMAGE, role=ROLE, train_s3_uri="s3://b/train", val_s3_uri="s3://b/val")
    assert data_channels(spec) == {"training": "s3://b/train", "validation": "s3://b/val"}
    assert data_channels(JobSpec(image_uri=IMAGE, role=ROLE)) == {}
    with pytest.raises(ConfigError, match="val_s3_uri"):
        data_channels(JobSpec(image_uri=IMAGE, role=ROLE, val_s3_uri="s3://b/val"))


def test_model_trainer_kwargs_torchrun_exact():
    spec = JobSpec(
        image_uri=IMAGE,
        role=ROLE,
        instance_type="ml.p5.48xlarge",
        instance_count=4,
        distribution="torchrun",
        hyperparameters={"epochs": 1},
        checkpoint_s3_uri="s3://b/c/",
        source_dir="/tmp/code",
    )
    assert model_trainer_kwargs(spec) == {
        "training_image": IMAGE,
        "role": ROLE,
        "base_job_name": "yolov5-smddp",
        "hyperparameters": {"epochs": "1"},
        "environment": {},
        "compute": {
            "instance_type": "ml.p5.48xlarge",
            "instance_count": 4,
            "volume_size_in_gb": 100,
            "enable_managed_spot_training": False,
        },
        "stopping_condition": {"max_runtime_in_seconds": 86400},
        "training_input_mode": "FastFile",
        "source_code": {"source_dir": "/tmp/code", "entry_script": "entrypoint.py"},
        "distributed": {},
        "checkpoint_config": {"s3_uri": "s3://b/c/", "local_path": "/opt/ml/checkpoints"},
    }


def test_model_trainer_refuses_smddp_and_torchrun_without_source():
    with pytest.raises(ConfigError, match="SDK v2"):
        model_trainer_kwargs(JobSpec(image_uri=IMAGE, role=ROLE))
    with pytest.raises(ConfigError, match="source_dir"):
        model_trainer_kwargs(JobSpec(image_uri=IMAGE, role=ROLE, distribution="torchrun"))
    none = model_trainer_kwargs(JobSpec(image_uri=IMAGE, role=ROLE, distribution="none"))
    assert "source_code" not in none and "distributed" not in none


def test_dlc_image_uri():
    assert dlc_image_uri("eu-west-1") == (
        "763104351884.dkr.ecr.eu-west-1.amazonaws.com/pytorch-training:2.5.1-gpu-py311-cu124-ubuntu22.04-sagemaker"
    )


def test_example_script_dry_run_prints_the_sdk_arguments(capsys):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "launch_sagemaker.py"
    spec = importlib.util.spec_from_file_location("launch_sagemaker", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(
        ["--image", IMAGE, "--role", ROLE, "--train", "s3://b/train", "--hp", "epochs=3", "--dry-run"]
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed["fit"] == {"training": "s3://b/train"}
    assert printed["PyTorch"]["hyperparameters"] == {"epochs": "3"}
    assert printed["PyTorch"]["distribution"] == {"smdistributed": {"dataparallel": {"enabled": True}}}
    assert printed["PyTorch"]["entry_point"] == str(path.parents[1] / "entrypoint.py")
    from yolov5_smddp.telemetry import METRIC_DEFINITIONS

    assert printed["PyTorch"]["metric_definitions"] == METRIC_DEFINITIONS


# ---- job-spec checks users hit ------------------------------------------------------------------------


def _spec(**kw) -> JobSpec:
    return JobSpec(image_uri=IMAGE, role=ROLE, metric_definitions=METRICS, **kw)


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        (
            "s3://b/ckpt/run1",
            "checkpoint_s3_uri 's3://b/ckpt/run1' must end with '/': SageMaker syncs every key that starts with "
            "it, so the checkpoints under sibling prefixes such as 's3://b/ckpt/run1-old/' would be restored and "
            "resumed too; use 's3://b/ckpt/run1/'",
        ),
        ("s3://b/", "checkpoint_s3_uri 's3://b/' is a whole bucket"),
        ("s3://b", "checkpoint_s3_uri 's3://b' is a whole bucket"),
        ("/opt/ml/checkpoints/", "checkpoint_s3_uri '/opt/ml/checkpoints/' must start with s3://"),
    ],
)
def test_checkpoint_uri_must_be_a_folder_prefix(uri, message):
    for build in (pytorch_estimator_kwargs, model_trainer_kwargs):
        with pytest.raises(ConfigError) as caught:
            build(_spec(distribution="none", checkpoint_s3_uri=uri))
        assert str(caught.value).startswith(message)
    assert pytorch_estimator_kwargs(_spec(checkpoint_s3_uri="s3://b/ckpt/run1/"))["checkpoint_s3_uri"] == (
        "s3://b/ckpt/run1/"
    )


@pytest.mark.parametrize(
    ("hyperparameters", "message"),
    [
        (
            {"checkpoint-dir": "/opt/ml/model/ckpt"},
            "hyperparameter checkpoint-dir='/opt/ml/model/ckpt' puts the training checkpoints in "
            "/opt/ml/model/ckpt, inside the model folder /opt/ml/model: every last/best checkpoint (with "
            "optimizer state) would be packed into model.tar.gz; leave it unset (checkpoints go to "
            "/opt/ml/checkpoints)",
        ),
        ({"checkpoint_dir": "/opt/ml/model/"}, "hyperparameter checkpoint-dir='/opt/ml/model/' puts"),
        (
            {"output": "/opt/ml/model"},
            "hyperparameter output='/opt/ml/model' puts the training checkpoints in ",
        ),
    ],
)
def test_checkpoints_inside_the_model_folder_are_refused(hyperparameters, message):
    with pytest.raises(ConfigError) as caught:
        pytorch_estimator_kwargs(_spec(hyperparameters=hyperparameters))
    assert str(caught.value).startswith(message)


def test_checkpoints_outside_the_synced_folder_are_refused_with_a_checkpoint_uri():
    synced = _spec(hyperparameters={"checkpoint-dir": "/tmp/ckpt"}, checkpoint_s3_uri="s3://b/ckpt/")
    with pytest.raises(ConfigError) as caught:
        pytorch_estimator_kwargs(synced)
    assert str(caught.value) == (
        "hyperparameter checkpoint-dir='/tmp/ckpt' puts the training checkpoints in /tmp/ckpt, but "
        "checkpoint_s3_uri syncs /opt/ml/checkpoints: nothing would be uploaded and a restarted job would start "
        "from zero; leave it unset"
    )
    # a subfolder of the synced folder, or any folder without a checkpoint URI, is fine; so is the model
    # folder's sibling that merely shares its name prefix
    for hps, uri in (
        ({"checkpoint-dir": "/opt/ml/checkpoints/run1"}, "s3://b/ckpt/"),
        ({"checkpoint-dir": "/tmp/ckpt"}, None),
        ({"checkpoint-dir": "/opt/ml/model-ckpt"}, None),
    ):
        pytorch_estimator_kwargs(_spec(hyperparameters=hps, checkpoint_s3_uri=uri))


def test_backend_smddp_needs_an_smddp_instance_type():
    spec = _spec(instance_type="ml.g5.12xlarge", distribution="none", hyperparameters={"backend": "smddp"})
    for build in (pytorch_estimator_kwargs, model_trainer_kwargs):
        with pytest.raises(ConfigError) as caught:
            build(spec)
        assert str(caught.value) == (
            "hyperparameter backend=smddp: instance type 'ml.g5.12xlarge' has no SMDDP support (SMDDP runs on "
            "ml.p4d.24xlarge, ml.p4de.24xlarge, ml.p3dn.24xlarge); use backend 'nccl' or leave it unset ('auto')"
        )
    with pytest.raises(ConfigError, match="'ml.p5.48xlarge' has no SMDDP support"):
        pytorch_estimator_kwargs(
            _spec(
                instance_type="ml.p5.48xlarge", distribution="torchrun", hyperparameters={"backend": "SMDDP"}
            )
        )
    ok = pytorch_estimator_kwargs(_spec(distribution="none", hyperparameters={"backend": "smddp"}))  # p4d
    assert ok["hyperparameters"] == {"backend": "smddp"}
    pytorch_estimator_kwargs(
        _spec(instance_type="ml.g5.12xlarge", distribution="none", hyperparameters={"backend": "nccl"})
    )
    # the SMDDP distribution itself on such a type: refused by distribution_config
    with pytest.raises(
        ConfigError, match="distribution 'smddp' does not support instance type 'ml.g5.12xlarge'"
    ):
        pytorch_estimator_kwargs(_spec(instance_type="ml.g5.12xlarge"))


# ---- Automatic Model Tuning ---------------------------------------------------------------------------


def _tuning(**kw) -> TuningSpec:
    job = kw.pop(
        "job",
        JobSpec(
            image_uri=IMAGE,
            role=ROLE,
            instance_type="ml.g5.12xlarge",
            distribution="none",
            hyperparameters={"cfg": "yolov5s", "epochs": 50, "hyp-override": "mosaic=1.0"},
            train_s3_uri="s3://b/coco128/",
        ),
    )
    ranges = kw.pop(
        "ranges",
        {
            "hyp-lr0": ContinuousRange(0.001, 0.1, "Logarithmic"),
            "hyp-weight_decay": ContinuousRange(0.0, 0.001),
            "batch-size": IntegerRange(32, 128),
            "optimizer": CategoricalRange(("SGD", "AdamW")),
            "cos-lr": CategoricalRange((True, False)),
        },
    )
    return TuningSpec(job=job, ranges=ranges, **kw)


def test_tuner_kwargs_exact():
    from yolov5_smddp.telemetry import METRIC_DEFINITIONS

    kwargs = tuner_kwargs(_tuning(max_jobs=12, max_parallel_jobs=3))
    assert kwargs["estimator"] == pytorch_estimator_kwargs(_tuning().job)
    assert kwargs["estimator"]["hyperparameters"] == {
        "cfg": "yolov5s",
        "epochs": "50",
        "hyp-override": "mosaic=1.0",
    }
    del kwargs["estimator"]
    assert kwargs == {
        "objective_metric_name": "val:mAP50-95",
        "objective_type": "Maximize",
        "metric_definitions": METRIC_DEFINITIONS,
        "hyperparameter_ranges": {
            "hyp-lr0": {
                "ContinuousParameter": {"min_value": 0.001, "max_value": 0.1, "scaling_type": "Logarithmic"}
            },
            "hyp-weight_decay": {
                "ContinuousParameter": {"min_value": 0.0, "max_value": 0.001, "scaling_type": "Auto"}
            },
            "batch-size": {"IntegerParameter": {"min_value": 32, "max_value": 128, "scaling_type": "Auto"}},
            "optimizer": {"CategoricalParameter": {"values": ["SGD", "AdamW"]}},
            "cos-lr": {"CategoricalParameter": {"values": ["True", "False"]}},
        },
        "strategy": "Bayesian",
        "max_jobs": 12,
        "max_parallel_jobs": 3,
        "early_stopping_type": "Off",
        "base_tuning_job_name": "yolov5-smddp",
    }
    assert OBJECTIVE_METRIC == "val:mAP50-95"


def test_tuned_values_reach_the_trainer_as_overrides():
    # what a training job of the tuning job receives: the static hyperparameters plus one value per range
    from yolov5_smddp.config.hyp_options import fold_hyp_options
    from yolov5_smddp.config.train_config import parse_train_args

    words = ["--cfg", "yolov5s", "--epochs", "50", "--hyp-override", "mosaic=1.0"]
    words += [
        "--hyp-lr0",
        "0.0123",
        "--hyp-weight_decay",
        "0.0004",
        "--optimizer",
        "AdamW",
        "--cos-lr",
        "True",
    ]
    config = parse_train_args(fold_hyp_options(words))
    assert config.hyp_overrides == {"mosaic": 1.0, "lr0": 0.0123, "weight_decay": 0.0004}
    assert config.optimizer == "AdamW" and config.cos_lr is True and config.epochs == 50


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ranges": {}}, "a tuning job needs at least one hyperparameter range"),
        ({"ranges": {f"hyp-{k}": ContinuousRange(0.0, 0.5) for k in range(31)}}, "31 tuned hyperparameters"),
        (
            {"ranges": {"hyp-lr9": ContinuousRange(0.1, 0.2)}},
            "tuning range 'hyp-lr9': unknown hyperparameter 'lr9'",
        ),
        (
            {"ranges": {"hyp-scale": ContinuousRange(0.5, 1.5)}},
            r"tuning range 'hyp-scale': hyperparameter scale=1.5 is out of range \[0.0, 0.99\]",
        ),
        ({"ranges": {"epochz": IntegerRange(1, 5)}}, "tuning range 'epochz': value '1' is not accepted"),
        (
            {"ranges": {"workers": IntegerRange(0, 65)}},
            "tuning range 'workers': value '65' is not accepted: --workers=65",
        ),
        ({"ranges": {"imgsz": IntegerRange(320, 640)}}, "tuning range 'imgsz': value '321' is not accepted"),
        (
            {"ranges": {"optimizer": CategoricalRange(("SGD", "Lion"))}},
            "tuning range 'optimizer': value 'Lion'",
        ),
        ({"ranges": {"optimizer": CategoricalRange(())}}, "tuning range 'optimizer': no values"),
        ({"ranges": {"hyp-lr0": ContinuousRange(0.1, 0.01)}}, "min_value 0.1 must be < max_value 0.01"),
        (
            {"ranges": {"hyp-lr0": ContinuousRange(0.0, 0.1, "Logarithmic")}},
            "Logarithmic scaling needs min_value > 0",
        ),
        ({"ranges": {"hyp-lr0": ContinuousRange(0.1, 0.2, "Log")}}, "scaling_type 'Log' is not one of"),
        (
            {"ranges": {"batch-size": IntegerRange(16, 64, "ReverseLogarithmic")}},
            "ReverseLogarithmic scaling is for continuous ranges within 0 <= x < 1",
        ),
        ({"ranges": {"epochs": IntegerRange(10, 50)}}, "hyperparameter 'epochs' is both fixed"),
        (
            {"ranges": {"hyp-mosaic": ContinuousRange(0.5, 1.0)}},
            r"mosaic is both fixed \(in hyp-override\) and tuned",
        ),
        ({"ranges": {"lr0; rm": ContinuousRange(0.1, 0.2)}}, "hyperparameter name 'lr0; rm'"),
        ({"objective_metric": "val:mAP"}, "objective metric 'val:mAP' is not among the metric definitions"),
        ({"objective_type": "Max"}, "objective_type 'Max' is not one of Maximize, Minimize"),
        ({"strategy": "Grid"}, "strategy 'Grid' is not one of Bayesian, Random"),
        ({"early_stopping_type": "On"}, "early_stopping_type 'On' is not one of Off, Auto"),
        ({"max_jobs": 2, "max_parallel_jobs": 3}, r"max_parallel_jobs \(3\) must be in 1..max_jobs \(2\)"),
        (
            {"job": JobSpec(image_uri=IMAGE, role=ROLE, checkpoint_s3_uri="s3://b/ckpt/")},
            "checkpoint_s3_uri with a tuning job: all its training jobs share that prefix",
        ),
        (
            {"job": JobSpec(image_uri=IMAGE, role=ROLE, hyperparameters={"hyp-override": "lr0"})},
            "hyperparameter hyp-override='lr0': expected key=value",
        ),
    ],
)
def test_tuning_errors_name_the_problem(change, message):
    with pytest.raises(ConfigError, match=message):
        tuner_kwargs(_tuning(**change))


def test_the_final_metric_line_carries_the_objective():
    """AMT keeps the LAST value its regex finds. The trainer's per-epoch line (metric_line over the epoch's
    row, as below) is a job's last metric line; the last epoch always validates (also with --noval) and an
    early stop ends right after a validated epoch. The objective's regex must read mAP50-95 from that line,
    behind mpirun's tag, and not mAP50; the trainer's closing `done: {"mAP50-95": ...}` JSON is no match."""
    import re

    from yolov5_smddp.telemetry import METRIC_DEFINITIONS, metric_line

    row = {
        "box_loss": 0.05,
        "obj_loss": 0.03,
        "cls_loss": 0.01,
        "precision": 0.61,
        "recall": 0.52,
        "mAP50": 0.55,
        "mAP50-95": 0.3125,
        "fitness": 0.33625,
        "samples_per_sec": 812.5,
    }
    line = "[1,mpirank:0,algo-1]<stdout>:" + metric_line(epoch=50, epochs=50, **row)
    regex = {d["Name"]: d["Regex"] for d in tuner_kwargs(_tuning())["metric_definitions"]}[OBJECTIVE_METRIC]
    assert [float(v) for v in re.findall(regex, line)] == [0.3125]
    assert [float(v) for v in re.findall(regex, metric_line(epoch=3, step=40, loss=1.5, box_loss=0.1))] == []
    assert re.findall(regex, 'done: {"mAP50": 0.55, "mAP50-95": 0.3125}') == []
    assert {"Name": OBJECTIVE_METRIC, "Regex": regex} in METRIC_DEFINITIONS


def test_tune_example_dry_run_prints_the_sdk_arguments(capsys):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "tune_sagemaker.py"
    spec = importlib.util.spec_from_file_location("tune_sagemaker", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    argv = ["--image", IMAGE, "--role", ROLE, "--train", "s3://b/train/", "--hp", "epochs=30"]
    argv += ["--range", "hyp-lr0=0.001:0.1:Logarithmic", "--range", "hyp-mosaic=0:1"]
    argv += ["--range", "batch-size=32:128", "--range", "optimizer=SGD,AdamW", "--max-jobs", "8", "--dry-run"]
    example.main(argv)
    printed = json.loads(capsys.readouterr().out)
    tuner = printed["HyperparameterTuner"]
    assert printed["fit"] == {"training": "s3://b/train/"}
    assert tuner["hyperparameter_ranges"] == {
        "hyp-lr0": {
            "ContinuousParameter": {"min_value": 0.001, "max_value": 0.1, "scaling_type": "Logarithmic"}
        },
        "hyp-mosaic": {"ContinuousParameter": {"min_value": 0.0, "max_value": 1.0, "scaling_type": "Auto"}},
        "batch-size": {"IntegerParameter": {"min_value": 32, "max_value": 128, "scaling_type": "Auto"}},
        "optimizer": {"CategoricalParameter": {"values": ["SGD", "AdamW"]}},
    }
    assert tuner["objective_metric_name"] == "val:mAP50-95" and tuner["objective_type"] == "Maximize"
    assert tuner["max_jobs"] == 8 and tuner["max_parallel_jobs"] == 2
    assert tuner["estimator"]["hyperparameters"] == {"epochs": "30"}
    assert (
        tuner["estimator"]["instance_type"] == "ml.g5.12xlarge" and "distribution" not in tuner["estimator"]
    )
    with pytest.raises(ConfigError, match="hyperparameter 'epochs' is both fixed"):
        example.main([*argv, "--range", "epochs=10:50"])


def test_the_dlc_is_written_once_and_the_dockerfile_repeats_it():
    from pathlib import Path

    from yolov5_smddp import dlc

    root = Path(__file__).resolve().parents[2]
    dockerfile = (root / "Dockerfile").read_text()
    assert f"ARG DLC_ACCOUNT={dlc.DLC_ACCOUNT}\n" in dockerfile
    assert f"ARG SMDDP_DLC_TAG={dlc.SMDDP_DLC_TAG}\n" in dockerfile
    assert f"ARG CURRENT_DLC_TAG={dlc.CURRENT_DLC_TAG}\n" in dockerfile
    sources = [root / "build.sh", *sorted((root / "yolov5_smddp").rglob("*.py"))]
    for tag in (dlc.SMDDP_DLC_TAG, dlc.CURRENT_DLC_TAG):
        writers = sorted(str(p.relative_to(root)) for p in sources if tag in p.read_text())
        assert writers == ["yolov5_smddp/dlc.py"]
