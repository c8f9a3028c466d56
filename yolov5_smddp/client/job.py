"""Pure builders of SageMaker training-job arguments: the keyword arguments of the SDK v2
`sagemaker.pytorch.PyTorch(...)` estimator and a plain description of the SDK v3 `ModelTrainer(...)`.

Nothing here imports the SageMaker SDK or talks to AWS, so every argument can be checked in unit tests;
`examples/launch_sagemaker.py` turns the results into SDK objects and starts the job.

Distributions (the `distribution` argument):
- "smddp":    SMDDP all-reduce (`{"smdistributed": {"dataparallel": {"enabled": True}}}`); the toolkit runs
              mpirun on the first host, one rank per GPU. Only on the instance types SMDDP supports.
- "torchrun": `{"torch_distributed": {"enabled": True}}`; torchrun on every host, NCCL.
- "none":     one process per host; our entrypoint starts one worker per GPU itself (torch elastic, NCCL).

Job-spec checks users hit run before any SDK object exists (`ConfigError` naming the value): checkpoint URIs
that are not a folder prefix, checkpoints written into the model folder or outside the synced folder,
SMDDP (distribution or `backend` hyperparameter) on instance types without it (dlc.SMDDP_INSTANCE_TYPES), Pipe
input mode (a FIFO per channel, which a folder of images cannot be read from), a warm pool past the API's
limit, half a VPC, file-system channels without one.

As AWS's own YOLOv5 samples do, the SageMaker Debugger hook and Profiler are off unless the spec asks for them
(`debugger=True`, `profiler=True`): they add a rule job and hooks the trainer does not use.

`tuner_kwargs(tuning)` builds SageMaker Automatic Model Tuning (SDK v2 `HyperparameterTuner`) around the same
estimator: our answer to the release's `--evolve`, which does not work under DDP.
"""

from __future__ import annotations

import argparse
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field

from yolov5_smddp import dlc
from yolov5_smddp.config.hyp import check_hyp_value
from yolov5_smddp.config.hyp_options import hyp_key
from yolov5_smddp.config.parsing import parse_overrides
from yolov5_smddp.config.train_config import parse_train_args
from yolov5_smddp.errors import ConfigError
from yolov5_smddp.telemetry import METRIC_DEFINITIONS

DISTRIBUTIONS = ("smddp", "torchrun", "none")
SMDDP_INSTANCE_TYPES = dlc.SMDDP_INSTANCE_TYPES
DEFAULT_REGION = "us-west-2"
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
MODEL_DIR = "/opt/ml/model"
CHECKPOINT_URI_SCHEMES = ("s3://", "https://")
INPUT_MODES = ("File", "FastFile")
"""Pipe is refused: it streams each channel as a FIFO (`training_0`), not a folder of images and labels."""
PIPE_REFUSAL = (
    "input_mode 'Pipe' streams each channel through a FIFO (/opt/ml/input/data/<channel>_0) that is read once, "
    "in order; a YOLO dataset is a folder of images and labels read in a new random order every epoch, so it "
    "cannot train from one: use 'FastFile' (the files are streamed from S3 on first read; the first epoch "
    "waits on S3, the later ones read the local cache) or 'File' (the channel is copied before training starts)"
)
MAX_KEEP_ALIVE_S = 3600
"""The API's limit on ResourceConfig.KeepAlivePeriodInSeconds (a warm pool's idle time)."""
TENSORBOARD_LOCAL_PATH = "/opt/ml/output/tensorboard"
"""Where the trainer writes TensorBoard events (--tensorboard-dir) when the spec names an S3 prefix for them;
SageMaker uploads that folder as the events appear."""
FILE_SYSTEM_TYPES = ("FSxLustre", "EFS")
FILE_SYSTEM_ACCESS_MODES = ("ro", "rw")


@dataclass(frozen=True)
class FileSystemChannel:
    """A channel mounted from Amazon FSx for Lustre or EFS (SDK v2 `FileSystemInput(**kwargs)`, v3
    `FileSystemDataSource(**kwargs)`): COCO-scale data without a copy from S3. Needs the job in the file
    system's VPC (JobSpec.subnets and security_group_ids)."""

    file_system_id: str
    file_system_type: str
    """One of FILE_SYSTEM_TYPES."""
    directory_path: str
    """For FSx for Lustre: /<mount name>/<path>; for EFS: /<path>."""
    file_system_access_mode: str = "ro"


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """Everything a training job needs, in plain values."""

    image_uri: str
    """The training image (ours, pushed to ECR by `build.sh push`)."""
    role: str
    """IAM role ARN the job runs as."""
    instance_type: str = "ml.p4d.24xlarge"
    instance_count: int = 1
    distribution: str = "smddp"
    """One of DISTRIBUTIONS."""
    hyperparameters: Mapping[str, object] = field(default_factory=dict)
    """Options of `yolov5-smddp train` (e.g. {"epochs": 300, "batch-size": 256, "cfg": "yolov5s"})."""
    train_s3_uri: str | None = None
    """S3 prefix of the training channel (holding data.yaml); None trains on the embedded default dataset."""
    val_s3_uri: str | None = None
    """Optional separate validation channel."""
    input_mode: str = "FastFile"
    checkpoint_s3_uri: str | None = None
    """Where /opt/ml/checkpoints is synced; needed to resume spot jobs."""
    output_path: str | None = None
    """S3 prefix for model.tar.gz and output.tar.gz; None lets the SDK use the session's default bucket."""
    use_spot_instances: bool = False
    max_run_s: int = 24 * 3600
    max_wait_s: int | None = None
    """Spot only: total time including waiting for capacity; defaults to 2 x max_run_s."""
    volume_size_gb: int = 100
    base_job_name: str = "yolov5-smddp"
    environment: Mapping[str, str] = field(default_factory=dict)
    metric_definitions: list[dict[str, str]] | None = None
    """None: `yolov5_smddp.telemetry.METRIC_DEFINITIONS`."""
    entry_point: str = "entrypoint.py"
    """The program: the image's SAGEMAKER_PROGRAM (/opt/ml/code/entrypoint.py) wins under the toolkit."""
    source_dir: str | None = None
    """A local folder holding `entry_point` (a copy of the repo's entrypoint.py); SDK v3 with Torchrun
    uploads it and runs it under torchrun. None: SDK v2 uploads `entry_point` alone."""
    keep_alive_s: int | None = None
    """A warm pool: seconds (1..3600) the instances stay up after the job for the next job of the same
    configuration, which starts in seconds and finds /opt/ml/sagemaker/warmpoolcache, where our label caches
    live (SDK `keep_alive_period_in_seconds`). None: no warm pool."""
    tensorboard_s3_uri: str | None = None
    """S3 prefix the job's TensorBoard events are uploaded to as they are written (SDK
    `tensorboard_output_config`); the trainer gets `--tensorboard-dir` TENSORBOARD_LOCAL_PATH."""
    subnets: tuple[str, ...] = ()
    """VPC subnets the job runs in (with security_group_ids): needed for FSx/EFS channels."""
    security_group_ids: tuple[str, ...] = ()
    file_system_channels: Mapping[str, FileSystemChannel] = field(default_factory=dict)
    """Channel name -> FSx for Lustre / EFS location (instead of an S3 prefix), e.g. {"training": ...}."""
    debugger: bool = False
    """The SageMaker Debugger hook (SDK v2 default: on). Off unless asked, as in AWS's YOLOv5 samples."""
    profiler: bool = False
    """The SageMaker Profiler (SDK v2 default: on). Off unless asked."""


def dlc_image_uri(region: str = DEFAULT_REGION, tag: str = dlc.DLC_TAG) -> str:
    """The AWS PyTorch training DLC for `region` (the default base of our image)."""
    return dlc.dlc_image_uri(region, tag)


def distribution_config(distribution: str, instance_type: str) -> dict | None:
    """The SDK v2 `distribution=` value, or None for one process per host.

    Raises ConfigError for an unknown name, or for SMDDP on an instance type it does not support.
    """
    if distribution not in DISTRIBUTIONS:
        raise ConfigError(f"distribution {distribution!r} is not one of {', '.join(DISTRIBUTIONS)}")
    if distribution == "smddp":
        if instance_type not in SMDDP_INSTANCE_TYPES:
            raise ConfigError(
                f"distribution 'smddp' does not support instance type {instance_type!r} (SMDDP runs on "
                f"{', '.join(SMDDP_INSTANCE_TYPES)}); use distribution 'torchrun' (NCCL) there"
            )
        return {"smdistributed": {"dataparallel": {"enabled": True}}}
    if distribution == "torchrun":
        return {"torch_distributed": {"enabled": True}}
    return None


def hyperparameter_strings(hyperparameters: Mapping[str, object]) -> dict[str, str]:
    """Hyperparameters as the strings the toolkit turns into `--key value` (booleans as True/False).

    Raises ConfigError for a key that is not a plain option name or a value that is not a scalar.
    """
    out: dict[str, str] = {}
    for key, value in hyperparameters.items():
        _check_name(key)
        if isinstance(value, bool):
            out[key] = "True" if value else "False"
        elif isinstance(value, int | float | str):
            out[key] = str(value)
        else:
            raise ConfigError(f"hyperparameter {key!r}: value {value!r} is not a string, number or boolean")
    return out


def _check_name(key: str) -> None:
    if not key or not all(c.isalnum() or c in "-_" for c in key):
        raise ConfigError(f"hyperparameter name {key!r}: use letters, digits, '-' and '_' only")


def data_channels(spec: JobSpec) -> dict[str, str]:
    """Channel name -> S3 URI (`training`, and `validation` when given); empty for the embedded dataset.
    File-system channels: `file_system_inputs`."""
    channels: dict[str, str] = {}
    if spec.train_s3_uri:
        channels["training"] = spec.train_s3_uri
    if spec.val_s3_uri:
        if not spec.train_s3_uri and "training" not in spec.file_system_channels:
            raise ConfigError("val_s3_uri is set without train_s3_uri: give the training channel too")
        channels["validation"] = spec.val_s3_uri
    return channels


def file_system_inputs(spec: JobSpec) -> dict[str, dict[str, str]]:
    """Channel name -> keyword arguments of SDK v2 `sagemaker.inputs.FileSystemInput(**v)` (the same as SDK
    v3 `FileSystemDataSource(**v)`), for `.fit()` / `.train()` beside `data_channels`."""
    _check_file_systems(spec)
    return {
        name: {
            "file_system_id": fs.file_system_id,
            "file_system_type": fs.file_system_type,
            "directory_path": fs.directory_path,
            "file_system_access_mode": fs.file_system_access_mode,
        }
        for name, fs in spec.file_system_channels.items()
    }


def _check_file_systems(spec: JobSpec) -> None:
    s3_channels = {"training"} if spec.train_s3_uri else set()
    s3_channels |= {"validation"} if spec.val_s3_uri else set()
    for name, fs in spec.file_system_channels.items():
        _check_name(name)
        if name in s3_channels:
            raise ConfigError(
                f"channel {name!r} is given both as an S3 prefix and as a file system: give one"
            )
        if fs.file_system_type not in FILE_SYSTEM_TYPES:
            raise ConfigError(
                f"channel {name!r}: file_system_type {fs.file_system_type!r} is not one of "
                f"{', '.join(FILE_SYSTEM_TYPES)}"
            )
        if fs.file_system_access_mode not in FILE_SYSTEM_ACCESS_MODES:
            raise ConfigError(
                f"channel {name!r}: file_system_access_mode {fs.file_system_access_mode!r} is not 'ro' or 'rw'"
            )
        if not fs.directory_path.startswith("/"):
            raise ConfigError(
                f"channel {name!r}: directory_path {fs.directory_path!r} must be absolute (FSx for Lustre: "
                "/<mount name>/<path>, EFS: /<path>)"
            )
    if spec.file_system_channels and not (spec.subnets and spec.security_group_ids):
        raise ConfigError(
            f"file-system channels ({', '.join(spec.file_system_channels)}) need the job in the file system's "
            "VPC: set subnets and security_group_ids"
        )


def _check(spec: JobSpec) -> None:
    if spec.instance_count < 1:
        raise ConfigError(f"instance_count must be >= 1, got {spec.instance_count}")
    if spec.input_mode == "Pipe":
        raise ConfigError(PIPE_REFUSAL)
    if spec.input_mode not in INPUT_MODES:
        raise ConfigError(f"input_mode {spec.input_mode!r} is not one of {', '.join(INPUT_MODES)}")
    if spec.keep_alive_s is not None and not 1 <= spec.keep_alive_s <= MAX_KEEP_ALIVE_S:
        raise ConfigError(
            f"keep_alive_s {spec.keep_alive_s}: a warm pool is kept 1..{MAX_KEEP_ALIVE_S} s after the job; "
            "None for no warm pool"
        )
    if spec.keep_alive_s is not None and spec.use_spot_instances:
        raise ConfigError(
            "keep_alive_s with use_spot_instances: SageMaker keeps no warm pool of spot instances"
        )
    if bool(spec.subnets) != bool(spec.security_group_ids):
        raise ConfigError("subnets and security_group_ids go together: a job in a VPC needs both")
    _check_file_systems(spec)
    _check_tensorboard(spec)
    if spec.max_wait_s is not None and not spec.use_spot_instances:
        raise ConfigError("max_wait_s is only valid with use_spot_instances=True")
    if spec.use_spot_instances and _max_wait(spec) < spec.max_run_s:
        raise ConfigError(
            f"max_wait_s ({spec.max_wait_s}) must be >= max_run_s ({spec.max_run_s}) for spot jobs"
        )
    if spec.use_spot_instances and not spec.checkpoint_s3_uri:
        raise ConfigError(
            "use_spot_instances=True needs checkpoint_s3_uri, or an interrupted job restarts from zero"
        )
    if spec.checkpoint_s3_uri:
        _check_checkpoint_uri(spec.checkpoint_s3_uri)
    _check_checkpoint_dir(spec)
    _check_backend(spec)
    _check_time_budget(spec)


def _check_checkpoint_uri(uri: str) -> None:
    scheme = next((s for s in CHECKPOINT_URI_SCHEMES if uri.startswith(s)), None)
    if scheme is None:
        raise ConfigError(f"checkpoint_s3_uri {uri!r} must start with s3:// (e.g. 's3://bucket/ckpt/run1/')")
    bucket, _, key = uri[len(scheme) :].partition("/")
    if not bucket or not key.strip("/"):
        raise ConfigError(
            f"checkpoint_s3_uri {uri!r} is a whole bucket: every object in it would be restored into "
            "/opt/ml/checkpoints at the start of the job; give a folder prefix such as 's3://bucket/ckpt/run1/'"
        )
    if not uri.endswith("/"):
        raise ConfigError(
            f"checkpoint_s3_uri {uri!r} must end with '/': SageMaker syncs every key that starts with it, so "
            f"the checkpoints under sibling prefixes such as {uri + '-old/'!r} would be restored and resumed "
            f"too; use {uri + '/'!r}"
        )


def _hyperparameter(spec: JobSpec, name: str) -> object | None:
    """A hyperparameter under either spelling (`checkpoint-dir` or `checkpoint_dir`), else None."""
    for key in (name, name.replace("-", "_")):
        if key in spec.hyperparameters:
            return spec.hyperparameters[key]
    return None


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + "/")


def _check_checkpoint_dir(spec: JobSpec) -> None:
    """Where the trainer will write checkpoints: not into the model folder, and inside the synced folder."""
    given = _hyperparameter(spec, "checkpoint-dir")
    output = _hyperparameter(spec, "output")  # the entrypoint's --output moves checkpoints/ under it
    if given is not None:
        local, source = str(given), f"hyperparameter checkpoint-dir={given!r}"
    elif output is not None:
        local, source = posixpath.join(str(output), "checkpoints"), f"hyperparameter output={output!r}"
    else:
        return
    local = posixpath.normpath(local)
    if _within(local, MODEL_DIR):
        raise ConfigError(
            f"{source} puts the training checkpoints in {local}, inside the model folder {MODEL_DIR}: every "
            "last/best checkpoint (with optimizer state) would be packed into model.tar.gz; leave it unset "
            f"(checkpoints go to {CHECKPOINT_LOCAL_PATH})"
        )
    if spec.checkpoint_s3_uri and not _within(local, CHECKPOINT_LOCAL_PATH):
        raise ConfigError(
            f"{source} puts the training checkpoints in {local}, but checkpoint_s3_uri syncs "
            f"{CHECKPOINT_LOCAL_PATH}: nothing would be uploaded and a restarted job would start from zero; "
            "leave it unset"
        )


def _check_tensorboard(spec: JobSpec) -> None:
    if not spec.tensorboard_s3_uri:
        return
    if not spec.tensorboard_s3_uri.startswith("s3://"):
        raise ConfigError(f"tensorboard_s3_uri {spec.tensorboard_s3_uri!r} must start with s3://")
    given = _hyperparameter(spec, "tensorboard-dir")
    if given is not None and posixpath.normpath(str(given)) != TENSORBOARD_LOCAL_PATH:
        raise ConfigError(
            f"hyperparameter tensorboard-dir={given!r}: with tensorboard_s3_uri the events must go to "
            f"{TENSORBOARD_LOCAL_PATH}, the folder SageMaker uploads; leave tensorboard-dir unset"
        )


def _hyperparameters(spec: JobSpec) -> dict[str, str]:
    """The job's hyperparameter strings, with --tensorboard-dir pointed at the uploaded folder when the spec
    names a TensorBoard prefix."""
    out = hyperparameter_strings(spec.hyperparameters)
    if spec.tensorboard_s3_uri and _hyperparameter(spec, "tensorboard-dir") is None:
        out["tensorboard-dir"] = TENSORBOARD_LOCAL_PATH
    return out


def _check_backend(spec: JobSpec) -> None:
    backend = _hyperparameter(spec, "backend")
    if backend is None or str(backend).strip().strip('"').lower() != "smddp":
        return
    if spec.instance_type not in SMDDP_INSTANCE_TYPES:
        raise ConfigError(
            f"hyperparameter backend=smddp: instance type {spec.instance_type!r} has no SMDDP support (SMDDP "
            f"runs on {', '.join(SMDDP_INSTANCE_TYPES)}); use backend 'nccl' or leave it unset ('auto')"
        )


def _check_time_budget(spec: JobSpec) -> None:
    """Hyperparameter `time` (hours, --time): the budget must end before max_run, or SageMaker stops the
    job before the final validation and the exports."""
    hours = _hyperparameter(spec, "time")
    if hours is None:
        return
    try:
        seconds = float(str(hours).strip().strip('"')) * 3600
    except ValueError:
        return  # the trainer names a bad value itself, before any work
    if seconds >= spec.max_run_s:
        suggested = int(seconds * 1.05 + 900)
        raise ConfigError(
            f"hyperparameter time={hours} ({seconds:.0f} s) is not below max_run_s ({spec.max_run_s}): SageMaker "
            "would stop the job before the final validation of best.pt and the exports; set max_run_s a "
            f"little above it, e.g. {suggested}"
        )


def _max_wait(spec: JobSpec) -> int:
    return spec.max_wait_s if spec.max_wait_s is not None else 2 * spec.max_run_s


def _metric_definitions(spec: JobSpec) -> list[dict[str, str]]:
    if spec.metric_definitions is not None:
        return list(spec.metric_definitions)
    return list(METRIC_DEFINITIONS)


def pytorch_estimator_kwargs(spec: JobSpec) -> dict:
    """Keyword arguments of SDK v2 `sagemaker.pytorch.PyTorch(**kwargs)` for `spec`.

    `tensorboard_output_config` is the kwargs of `sagemaker.debugger.TensorBoardOutputConfig(**v)`.
    `.fit(data_channels(spec))` (as `TrainingInput(uri, input_mode=spec.input_mode)`, plus
    `FileSystemInput(**v)` for each of `file_system_inputs(spec)`) starts the job.
    """
    _check(spec)
    kwargs: dict = {
        "entry_point": spec.entry_point,
        **({"source_dir": spec.source_dir} if spec.source_dir else {}),
        "image_uri": spec.image_uri,
        "role": spec.role,
        "instance_type": spec.instance_type,
        "instance_count": spec.instance_count,
        "hyperparameters": _hyperparameters(spec),
        "metric_definitions": _metric_definitions(spec),
        "max_run": spec.max_run_s,
        "volume_size": spec.volume_size_gb,
        "base_job_name": spec.base_job_name,
        "environment": dict(spec.environment),
        "input_mode": spec.input_mode,
        "use_spot_instances": spec.use_spot_instances,
    }
    if not spec.debugger:
        kwargs["debugger_hook_config"] = False
    if not spec.profiler:
        kwargs["disable_profiler"] = True
    if spec.keep_alive_s is not None:
        kwargs["keep_alive_period_in_seconds"] = spec.keep_alive_s
    if spec.tensorboard_s3_uri:
        kwargs["tensorboard_output_config"] = {
            "s3_output_path": spec.tensorboard_s3_uri,
            "container_local_output_path": TENSORBOARD_LOCAL_PATH,
        }
    if spec.subnets:
        kwargs["subnets"] = list(spec.subnets)
        kwargs["security_group_ids"] = list(spec.security_group_ids)
    distribution = distribution_config(spec.distribution, spec.instance_type)
    if distribution is not None:
        kwargs["distribution"] = distribution
    if spec.use_spot_instances:
        kwargs["max_wait"] = _max_wait(spec)
    if spec.checkpoint_s3_uri:
        kwargs["checkpoint_s3_uri"] = spec.checkpoint_s3_uri
        kwargs["checkpoint_local_path"] = CHECKPOINT_LOCAL_PATH
    if spec.output_path:
        kwargs["output_path"] = spec.output_path
    return kwargs


def model_trainer_kwargs(spec: JobSpec) -> dict:
    """SDK v3 `sagemaker.train.model_trainer.ModelTrainer(**kwargs)` arguments, as plain values.

    Values that the SDK takes as objects are dicts named by their class, for the caller to construct:
    `compute` -> `Compute(**v)`, `stopping_condition` -> `StoppingCondition(**v)`,
    `checkpoint_config` -> `CheckpointConfig(**v)`, `source_code` -> `SourceCode(**v)`,
    `distributed` -> `Torchrun(**v)`, `networking` -> `Networking(**v)`; `tensorboard_output_config` is not a
    constructor argument: `.with_tensorboard_output_config(TensorBoardOutputConfig(**v))`. ModelTrainer runs
    no Debugger hook or Profiler (it has no such arguments). SDK v3 has no SMDDP class: "smddp" is refused
    here (use SDK v2).
    "torchrun" uploads `source_dir` and runs `entry_point` under torchrun (one worker per process);
    "none" passes no source code, so the image's own toolkit path runs entrypoint.py once per host.
    Data channels go to `.train(input_data_config=[InputData(channel_name=k, data_source=v), ...])`, with
    `FileSystemDataSource(**v)` as the data source of each of `file_system_inputs(spec)`.
    """
    _check(spec)
    if spec.distribution == "smddp":
        raise ConfigError(
            "SDK v3 ModelTrainer has no SMDDP distribution: use pytorch_estimator_kwargs (SDK v2) "
            "or distribution 'torchrun'"
        )
    distribution_config(spec.distribution, spec.instance_type)
    stopping: dict = {"max_runtime_in_seconds": spec.max_run_s}
    if spec.use_spot_instances:
        stopping["max_wait_time_in_seconds"] = _max_wait(spec)
    kwargs: dict = {
        "training_image": spec.image_uri,
        "role": spec.role,
        "base_job_name": spec.base_job_name,
        "hyperparameters": _hyperparameters(spec),
        "environment": dict(spec.environment),
        "compute": {
            "instance_type": spec.instance_type,
            "instance_count": spec.instance_count,
            "volume_size_in_gb": spec.volume_size_gb,
            "enable_managed_spot_training": spec.use_spot_instances,
        },
        "stopping_condition": stopping,
        "training_input_mode": spec.input_mode,
    }
    if spec.keep_alive_s is not None:
        kwargs["compute"]["keep_alive_period_in_seconds"] = spec.keep_alive_s
    if spec.subnets:
        kwargs["networking"] = {
            "subnets": list(spec.subnets),
            "security_group_ids": list(spec.security_group_ids),
        }
    if spec.tensorboard_s3_uri:
        kwargs["tensorboard_output_config"] = {
            "s3_output_path": spec.tensorboard_s3_uri,
            "local_path": TENSORBOARD_LOCAL_PATH,
        }
    if spec.distribution == "torchrun":
        if not spec.source_dir:
            raise ConfigError(
                "SDK v3 with distribution 'torchrun' needs source_dir: a local folder holding "
                f"{spec.entry_point} (a copy of the repo's entrypoint.py)"
            )
        kwargs["source_code"] = {"source_dir": spec.source_dir, "entry_script": spec.entry_point}
        kwargs["distributed"] = {}
    if spec.checkpoint_s3_uri:
        kwargs["checkpoint_config"] = {"s3_uri": spec.checkpoint_s3_uri, "local_path": CHECKPOINT_LOCAL_PATH}
    if spec.output_path:
        kwargs["output_data_config"] = {"s3_output_path": spec.output_path}
    return kwargs


# ---- Automatic Model Tuning (SDK v2 HyperparameterTuner) ------------------------------------------------

OBJECTIVE_METRIC = "val:mAP50-95"
"""The tuning objective: our metric lines' `mAP50-95=` (telemetry.METRIC_DEFINITIONS). AMT takes the LAST
value a job prints (API FinalHyperParameterTuningJobObjectiveMetric), i.e. best.pt's re-validation (`final=1`)."""
OBJECTIVE_TYPES = ("Maximize", "Minimize")
TUNING_STRATEGIES = ("Bayesian", "Random")
EARLY_STOPPING_TYPES = ("Off", "Auto")
SCALING_TYPES = ("Auto", "Linear", "Logarithmic", "ReverseLogarithmic")
MAX_TUNED_HYPERPARAMETERS = 30  # API ParameterRanges: at most 30 over all ranges


@dataclass(frozen=True)
class ContinuousRange:
    """SDK v2 `ContinuousParameter(min_value, max_value, scaling_type)`: any float in [min, max]."""

    min_value: float
    max_value: float
    scaling_type: str = "Auto"


@dataclass(frozen=True)
class IntegerRange:
    """SDK v2 `IntegerParameter(min_value, max_value, scaling_type)`: any integer in [min, max]."""

    min_value: int
    max_value: int
    scaling_type: str = "Auto"


@dataclass(frozen=True)
class CategoricalRange:
    """SDK v2 `CategoricalParameter(values)`: one of `values` (passed to the job as strings)."""

    values: tuple[str | int | float | bool, ...]


ParameterRange = ContinuousRange | IntegerRange | CategoricalRange


@dataclass(frozen=True, kw_only=True)
class TuningSpec:
    """A tuning job: the training job it repeats and the hyperparameters it searches."""

    job: JobSpec
    """Every training job of the tuning job; its `hyperparameters` are the static (not tuned) ones."""
    ranges: Mapping[str, ParameterRange]
    """Hyperparameter name -> range. A training option (`epochs`, `optimizer`, `cos-lr`, ...) or one key of
    the hyperparameter YAML as `hyp-<key>` (`hyp-lr0`, `hyp-mosaic`): the entrypoint folds those into
    `--hyp-override` (yolov5_smddp.config.hyp_options), since AMT tunes whole hyperparameters only."""
    objective_metric: str = OBJECTIVE_METRIC
    objective_type: str = "Maximize"
    strategy: str = "Bayesian"
    max_jobs: int = 20
    max_parallel_jobs: int = 2
    early_stopping_type: str = "Off"
    """"Auto" lets AMT stop jobs whose per-epoch objective lags (it reads every epoch's metric line)."""
    base_tuning_job_name: str | None = None
    """None: the job's base_job_name."""


def _check_tuned_value(name: str, value: object) -> None:
    """ConfigError unless the training job accepts `--name value` (checked with the real option parser)."""
    key = hyp_key(name)
    if key is not None:
        try:
            number = float(value) if isinstance(value, str) else value
        except ValueError:
            number = value  # named as "not a number" below
        check_hyp_value(key, number, source=f"tuning range {name!r}")
        return
    text = hyperparameter_strings({name: value})[name]
    try:
        parse_train_args([f"--{name}", text])
    except ConfigError as exc:
        raise ConfigError(f"tuning range {name!r}: value {text!r} is not accepted: {exc}") from exc


def _range_kwargs(name: str, spec: ParameterRange) -> dict:
    """One range as {SDK class name: constructor kwargs}, its values checked against our options."""
    if isinstance(spec, CategoricalRange):
        if not spec.values:
            raise ConfigError(f"tuning range {name!r}: no values")
        for value in spec.values:
            _check_tuned_value(name, value)
        values = [hyperparameter_strings({name: v})[name] for v in spec.values]
        return {"CategoricalParameter": {"values": values}}
    kind = "ContinuousParameter" if isinstance(spec, ContinuousRange) else "IntegerParameter"
    if spec.scaling_type not in SCALING_TYPES:
        raise ConfigError(
            f"tuning range {name!r}: scaling_type {spec.scaling_type!r} is not one of {', '.join(SCALING_TYPES)}"
        )
    if not spec.min_value < spec.max_value:
        raise ConfigError(
            f"tuning range {name!r}: min_value {spec.min_value} must be < max_value {spec.max_value}"
        )
    # API ContinuousParameterRange / IntegerParameterRange ScalingType rules
    if spec.scaling_type == "Logarithmic" and spec.min_value <= 0:
        raise ConfigError(f"tuning range {name!r}: Logarithmic scaling needs min_value > 0")
    if spec.scaling_type == "ReverseLogarithmic" and (
        isinstance(spec, IntegerRange) or not (0 <= spec.min_value and spec.max_value < 1)
    ):
        raise ConfigError(
            f"tuning range {name!r}: ReverseLogarithmic scaling is for continuous ranges within 0 <= x < 1"
        )
    # the bounds, and for integers min + 1 too: catches a step rule such as imgsz's multiples of 32
    checked = [spec.min_value, spec.max_value]
    if isinstance(spec, IntegerRange):
        checked.append(spec.min_value + 1)
    for value in checked:
        _check_tuned_value(name, value)
    return {
        kind: {"min_value": spec.min_value, "max_value": spec.max_value, "scaling_type": spec.scaling_type}
    }


def _check_tuning(tuning: TuningSpec, metric_definitions: list[dict[str, str]]) -> None:
    if not tuning.ranges:
        raise ConfigError("a tuning job needs at least one hyperparameter range")
    if len(tuning.ranges) > MAX_TUNED_HYPERPARAMETERS:
        raise ConfigError(
            f"{len(tuning.ranges)} tuned hyperparameters: SageMaker allows at most {MAX_TUNED_HYPERPARAMETERS}"
        )
    names = [d["Name"] for d in metric_definitions]
    if tuning.objective_metric not in names:
        raise ConfigError(
            f"objective metric {tuning.objective_metric!r} is not among the metric definitions ({', '.join(names)})"
        )
    for value, allowed, what in (
        (tuning.objective_type, OBJECTIVE_TYPES, "objective_type"),
        (tuning.strategy, TUNING_STRATEGIES, "strategy"),
        (tuning.early_stopping_type, EARLY_STOPPING_TYPES, "early_stopping_type"),
    ):
        if value not in allowed:
            raise ConfigError(f"{what} {value!r} is not one of {', '.join(allowed)}")
    if not 1 <= tuning.max_parallel_jobs <= tuning.max_jobs:
        raise ConfigError(
            f"max_parallel_jobs ({tuning.max_parallel_jobs}) must be in 1..max_jobs ({tuning.max_jobs})"
        )
    if tuning.job.checkpoint_s3_uri:
        # every training job of a tuning job gets the same CheckpointConfig: each would restore (and resume!)
        # the others' last.pt from the shared prefix
        raise ConfigError(
            "checkpoint_s3_uri with a tuning job: all its training jobs share that prefix, so each would resume "
            "another job's checkpoint; tune without checkpoint_s3_uri (and without spot instances)"
        )
    static = set(hyperparameter_strings(tuning.job.hyperparameters))
    fixed_keys = _fixed_hyp_keys(tuning.job)
    for name in tuning.ranges:
        _check_name(name)
        if {name, name.replace("-", "_"), name.replace("_", "-")} & static:
            raise ConfigError(
                f"hyperparameter {name!r} is both fixed (in the job's hyperparameters) and tuned"
            )
        key = hyp_key(name)
        if key is not None and key in fixed_keys:
            raise ConfigError(f"hyperparameter {key} is both fixed (in hyp-override) and tuned (as {name!r})")


def _fixed_hyp_keys(job: JobSpec) -> set[str]:
    """The keys the job's static `hyp-override` hyperparameter sets."""
    text = _hyperparameter(job, "hyp-override") or _hyperparameter(job, "hyp-overrides")
    if text is None:
        return set()
    try:
        return set(parse_overrides(str(text)))
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"hyperparameter hyp-override={text!r}: {exc}") from exc


def tuner_kwargs(tuning: TuningSpec) -> dict:
    """Keyword arguments of SDK v2 `sagemaker.tuner.HyperparameterTuner(**kwargs)`, as plain values.

    Construct the SDK objects from them: `estimator` -> `PyTorch(**v)`, and every `hyperparameter_ranges`
    value {class name: kwargs} -> `ContinuousParameter(**kwargs)` / `IntegerParameter` / `CategoricalParameter`.
    `.fit(data_channels(tuning.job))` starts the tuning job. The metric definitions are passed to the tuner
    itself: it does not take the estimator's. Raises ConfigError for every problem, before any AWS call.
    """
    estimator = pytorch_estimator_kwargs(tuning.job)
    metric_definitions = list(estimator["metric_definitions"])
    _check_tuning(tuning, metric_definitions)
    return {
        "estimator": estimator,
        "objective_metric_name": tuning.objective_metric,
        "objective_type": tuning.objective_type,
        "metric_definitions": metric_definitions,
        "hyperparameter_ranges": {name: _range_kwargs(name, r) for name, r in tuning.ranges.items()},
        "strategy": tuning.strategy,
        "max_jobs": tuning.max_jobs,
        "max_parallel_jobs": tuning.max_parallel_jobs,
        "early_stopping_type": tuning.early_stopping_type,
        "base_tuning_job_name": tuning.base_tuning_job_name or tuning.job.base_job_name,
    }
