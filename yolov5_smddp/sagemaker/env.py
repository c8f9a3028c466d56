"""The SageMaker contract as plain values: the ONLY reader of SM_* variables and the /opt/ml tree.

`read_environment(environ)` is a pure reader of a Mapping (os.environ or a test dict) and of the config
files under the base folder. Sources, in order: SM_* variables (set by the toolkit), /opt/ml/input/config/
*.json (ranks that mpirun starts over ssh lack SM_*), then local defaults (plain `docker run`, a laptop):
one host, GPUs counted by torch, the embedded default dataset, outputs under /opt/ml.
`SAGEMAKER_BASE_DIR` moves /opt/ml; `base_dir(environ)` is the one place that says so.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from yolov5_smddp.errors import ConfigError

DEFAULT_BASE_DIR = Path("/opt/ml")
TRAIN_CHANNELS = ("training", "train")
VAL_CHANNELS = ("validation", "val")
WEIGHTS_CHANNELS = ("weights", "model")
"""Channels holding the pretrained weights (a .pt: ours, a training checkpoint, or the release's)."""
WARMPOOL_CACHE_ENV = "SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY"


def base_dir(environ: Mapping[str, str]) -> Path:
    """The /opt/ml root of this process ($SAGEMAKER_BASE_DIR moves it: tests, local runs)."""
    return Path(environ.get("SAGEMAKER_BASE_DIR") or DEFAULT_BASE_DIR)


def default_failure_file(environ: Mapping[str, str]) -> Path:
    """Where the failure file goes before the environment is read (or when reading it failed)."""
    return base_dir(environ) / "output" / "failure"


@dataclass(frozen=True, kw_only=True)
class SageMakerEnv:
    """What the SageMaker contract tells this process, as plain values."""

    base_dir: Path
    """The /opt/ml root (SAGEMAKER_BASE_DIR moves it)."""
    hosts: list[str]
    """All hosts of the job, sorted (["algo-1", "algo-2"]); one entry outside SageMaker."""
    current_host: str
    num_gpus: int | None
    """GPUs on this host from SM_NUM_GPUS; None when unknown (count them with torch)."""
    num_cpus: int
    channels: dict[str, Path] = field(default_factory=dict)
    """Data channel name -> mount folder (e.g. "training" -> /opt/ml/input/data/training)."""
    model_dir: Path
    output_dir: Path
    """/opt/ml/output: the failure file, tensorboard/, intermediate/."""
    output_data_dir: Path
    """/opt/ml/output/data: results.csv and plots (uploaded as output.tar.gz)."""
    intermediate_dir: Path
    checkpoint_dir: Path
    hyperparameters: dict[str, object] = field(default_factory=dict)
    """User hyperparameters (the `sagemaker_*` keys removed)."""
    framework_params: dict[str, object] = field(default_factory=dict)
    """The `sagemaker_*` hyperparameters (distribution flags, instance type)."""
    job_name: str | None = None
    """$TRAINING_JOB_NAME (set by SageMaker and by the SDK's local mode); None outside a training job."""
    instance_type: str | None = None
    network_interface: str = "eth0"
    on_sagemaker: bool = False
    """True when a resource config exists (the toolkit, SageMaker, local mode or our local stand-in)."""
    warmpool_cache_dir: Path | None = None
    """$SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY: kept between jobs on a warm pool; None without one."""
    local_tmp_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    """This host's temporary folder: the cache folder's parent without a warm pool."""

    @property
    def node_rank(self) -> int:
        """Index of this host in `hosts`."""
        return self.hosts.index(self.current_host)

    @property
    def master_addr(self) -> str:
        """The first host: rank 0 and the rendezvous endpoint."""
        return self.hosts[0]

    @property
    def failure_file(self) -> Path:
        return self.output_dir / "failure"

    @property
    def tensorboard_dir(self) -> Path:
        return self.output_dir / "tensorboard"

    @property
    def cache_dir(self) -> Path:
        """The job's default cache folder (label caches, the embedded dataset, the rebased data.yaml), for
        `data.cache.choose_cache_dir` (--cache-dir wins): the warm-pool cache when the job has one (a job
        restarted on a warm pool then skips the label scan), else a local folder. Never a channel, and
        never under output/ (SageMaker uploads output/intermediate while the job runs)."""
        if self.warmpool_cache_dir is not None:
            return self.warmpool_cache_dir / "yolov5-smddp"
        return self.local_tmp_dir / "yolov5-smddp-cache"


def _read_json(path: Path) -> object | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from exc


def _json_env(environ: Mapping[str, str], name: str) -> object | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"environment variable {name}={raw!r} is not valid JSON") from exc


def _decode_hyperparameter(value: object) -> object:
    """hyperparameters.json values are JSON-encoded strings ("3", "\"yolov5s\""); decode when possible."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def read_environment(
    environ: Mapping[str, str],
    *,
    hostname: str | None = None,
    cpu_count: int | None = None,
    output_root: Path | None = None,
) -> SageMakerEnv:
    """The SageMaker contract of this process.

    `environ` is os.environ (or a test dict); `hostname`/`cpu_count` default to this machine's;
    `output_root` (entrypoint `--output`) moves model, output and checkpoint folders under one folder.
    Raises ConfigError for malformed JSON in SM_* or the config files.
    """
    base = base_dir(environ)
    config_dir = Path(environ.get("SM_INPUT_CONFIG_DIR") or base / "input" / "config")
    resource = _read_json(Path(environ.get("SM_RESOURCE_CONFIG_FILE") or config_dir / "resourceconfig.json"))
    resource = resource if isinstance(resource, dict) else {}

    hosts = _json_env(environ, "SM_HOSTS") or resource.get("hosts")
    current = environ.get("SM_CURRENT_HOST") or resource.get("current_host")
    if not hosts:
        current = current or hostname or socket.gethostname()
        hosts = [current]
    hosts = sorted(str(h) for h in hosts)
    if not current:
        current = hostname or socket.gethostname()
    if current not in hosts:
        raise ConfigError(
            f"current host {current!r} is not among the job's hosts {hosts} "
            "(SM_CURRENT_HOST / resourceconfig.json current_host)"
        )

    gpus_raw = environ.get("SM_NUM_GPUS")
    cpus_raw = environ.get("SM_NUM_CPUS")
    num_gpus = int(gpus_raw) if gpus_raw not in (None, "") else None
    num_cpus = int(cpus_raw) if cpus_raw not in (None, "") else (cpu_count or os.cpu_count() or 1)

    channels = _channels(environ, base, config_dir)

    hps_source = _json_env(environ, "SM_HPS")
    if hps_source is None:
        raw = _read_json(config_dir / "hyperparameters.json")
        hps_source = (
            {k: _decode_hyperparameter(v) for k, v in (raw or {}).items()} if isinstance(raw, dict) else {}
        )
    framework = _json_env(environ, "SM_FRAMEWORK_PARAMS")
    if framework is None:
        raw = _read_json(config_dir / "hyperparameters.json")
        framework = (
            {k: _decode_hyperparameter(v) for k, v in (raw or {}).items() if k.startswith("sagemaker_")}
            if isinstance(raw, dict)
            else {}
        )
    user_hps = {k: v for k, v in hps_source.items() if not k.startswith("sagemaker_")}

    out_root = Path(output_root) if output_root is not None else None
    model_dir = out_root / "model" if out_root else Path(environ.get("SM_MODEL_DIR") or base / "model")
    output_dir = out_root / "output" if out_root else Path(environ.get("SM_OUTPUT_DIR") or base / "output")
    output_data_dir = (
        output_dir / "data" if out_root else Path(environ.get("SM_OUTPUT_DATA_DIR") or output_dir / "data")
    )
    intermediate = (
        output_dir / "intermediate"
        if out_root
        else Path(environ.get("SM_OUTPUT_INTERMEDIATE_DIR") or output_dir / "intermediate")
    )
    checkpoint_dir = out_root / "checkpoints" if out_root else base / "checkpoints"

    instance_type = (
        environ.get("SM_CURRENT_INSTANCE_TYPE")
        or resource.get("current_instance_type")
        or framework.get("sagemaker_instance_type")
    )
    return SageMakerEnv(
        base_dir=base,
        hosts=hosts,
        current_host=str(current),
        num_gpus=num_gpus,
        num_cpus=num_cpus,
        channels=channels,
        model_dir=model_dir,
        output_dir=output_dir,
        output_data_dir=output_data_dir,
        intermediate_dir=intermediate,
        checkpoint_dir=checkpoint_dir,
        hyperparameters=user_hps,
        framework_params=dict(framework),
        job_name=environ.get("TRAINING_JOB_NAME") or None,
        instance_type=str(instance_type) if instance_type else None,
        network_interface=environ.get("SM_NETWORK_INTERFACE_NAME")
        or resource.get("network_interface_name")
        or "eth0",
        on_sagemaker=bool(resource) or "SM_HOSTS" in environ,
        warmpool_cache_dir=Path(environ[WARMPOOL_CACHE_ENV]) if environ.get(WARMPOOL_CACHE_ENV) else None,
    )


def _channels(environ: Mapping[str, str], base: Path, config_dir: Path) -> dict[str, Path]:
    data_root = Path(environ.get("SM_INPUT_DIR") or base / "input") / "data"
    names = _json_env(environ, "SM_CHANNELS")
    if names is None:
        input_config = _read_json(config_dir / "inputdataconfig.json")
        names = list(input_config) if isinstance(input_config, dict) else None
    if names is None:  # no config at all: whatever is mounted under input/data
        names = sorted(p.name for p in data_root.iterdir() if p.is_dir()) if data_root.is_dir() else []
    channels = {}
    for name in names:
        env_name = "SM_CHANNEL_" + str(name).upper()
        channels[str(name)] = Path(environ.get(env_name) or data_root / str(name))
    return channels


def channel(env: SageMakerEnv, names: Sequence[str]) -> Path | None:
    """The first channel of `names` that the job has (e.g. TRAIN_CHANNELS), or None."""
    for name in names:
        if name in env.channels:
            return env.channels[name]
    return None
