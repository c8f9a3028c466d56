"""The SageMaker boundary: the ONLY module that reads SM_* variables and the /opt/ml tree.

`read_environment()` turns them into a plain `SageMakerEnv`; everything else receives paths and values.
Sources, in order: SM_* variables (set by the toolkit), /opt/ml/input/config/*.json (ranks that mpirun
starts over ssh lack SM_*), then local defaults (plain `docker run`, a laptop): one host, GPUs counted by
torch, the embedded default dataset, outputs under /opt/ml. `SAGEMAKER_BASE_DIR` moves /opt/ml.

`main(argv)` is the program behind entrypoint.py: options → environment → dataset check → launch, and the
exit contract (0 on success; otherwise a one-paragraph reason at the top of /opt/ml/output/failure, a
non-zero exit code and the full traceback in the log).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from yolov5_smddp.atomic import atomic_write
from yolov5_smddp.errors import ConfigError, DataError, UserError

log = logging.getLogger("yolov5_smddp.sagemaker")

DEFAULT_BASE_DIR = Path("/opt/ml")
TRAIN_CHANNELS = ("training", "train")
VAL_CHANNELS = ("validation", "val")
FAILURE_REASON_CHARS = 1024
WARMPOOL_CACHE_ENV = "SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY"
EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1


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
        """Label caches, the embedded dataset and the rebased data.yaml: the warm-pool cache when the job
        has one (a job restarted on a warm pool then skips the label scan), else a local folder. Never a
        channel, and never under output/ (SageMaker uploads output/intermediate while the job runs)."""
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
    base = Path(environ.get("SAGEMAKER_BASE_DIR") or DEFAULT_BASE_DIR)
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


# ---- local single-host config (plain `docker run IMAGE train`) ----------------------------------------


def hyperparameters_from_cli(args: Sequence[str]) -> dict[str, str]:
    """`--epochs 3 --rect --cfg=s` -> {"epochs": "3", "rect": "true", "cfg": "\"s\""}, as SageMaker writes them.

    The values are stored as the JSON-encoded strings SageMaker writes. Raises ConfigError for a word that
    is not an option.
    """
    hps: dict[str, str] = {}
    i = 0
    while i < len(args):
        word = args[i]
        if not word.startswith("-") or word in ("-", "--"):
            raise ConfigError(f"argument {word!r}: expected an option like --epochs 3 after 'train'")
        key, eq, value = word.lstrip("-").partition("=")
        if not eq:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                value = args[i + 1]
                i += 1
            else:
                value = "true"
        hps[key] = json.dumps(value) if _needs_json_quotes(value) else value
        i += 1
    return hps


def _needs_json_quotes(value: str) -> bool:
    """A string that does not decode as JSON by itself gets quoted, as the SDK does for str values."""
    try:
        json.loads(value)
    except ValueError:
        return True
    return False


def write_local_config(environ: Mapping[str, str], cli_args: Sequence[str], *, hostname: str) -> Path | None:
    """Writes a single-host SageMaker config when none is mounted, so the real toolkit's `train` runs.

    Writes input/config/{resourceconfig,hyperparameters,inputdataconfig}.json under the base dir (channels =
    the folders mounted under input/data). Returns the config folder, or None when a resourceconfig.json
    already exists (SageMaker, local mode, a mounted tree): then nothing is touched.
    """
    base = Path(environ.get("SAGEMAKER_BASE_DIR") or DEFAULT_BASE_DIR)
    config_dir = base / "input" / "config"
    if (config_dir / "resourceconfig.json").exists():
        return None
    hps = hyperparameters_from_cli(cli_args)
    data_root = base / "input" / "data"
    names = sorted(p.name for p in data_root.iterdir() if p.is_dir()) if data_root.is_dir() else []
    config_dir.mkdir(parents=True, exist_ok=True)
    resource = {
        "current_host": hostname,
        "hosts": [hostname],
        "network_interface_name": "eth0",
        "current_group_name": "homogeneousCluster",
        "current_instance_type": "local",
        "instance_groups": [
            {"instance_group_name": "homogeneousCluster", "instance_type": "local", "hosts": [hostname]}
        ],
    }
    hp_path = config_dir / "hyperparameters.json"
    if not hp_path.exists() or hps:
        hp_path.write_text(json.dumps(hps, indent=1))
    data_path = config_dir / "inputdataconfig.json"
    if not data_path.exists():
        data_path.write_text(
            json.dumps(
                {n: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"} for n in names},
                indent=1,
            )
        )
    (config_dir / "resourceconfig.json").write_text(json.dumps(resource, indent=1))
    return config_dir


# ---- failure file ---------------------------------------------------------------------------------------


def failure_reason(exc: BaseException) -> str:
    """One paragraph for /opt/ml/output/failure: what failed, which file/value, what to do."""
    from yolov5_smddp.launch import WorkerFailed

    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, WorkerFailed):
        return f"Training failed: {text}. The worker's full traceback is in the job's log (CloudWatch)."
    if isinstance(exc, UserError):
        kind = {ConfigError: "Invalid hyperparameter or option", DataError: "Dataset problem"}.get(
            type(exc), "Invalid input"
        )
        return f"{kind}: {text}"
    return (
        f"Training failed with {type(exc).__name__}: {text}. This is not a known input problem; "
        "the full traceback is in the job's log (CloudWatch)."
    )


def write_failure(path: Path, reason: str, details: str = "") -> None:
    """Reason first (SageMaker reads the first 1024 characters), then the details."""
    body = reason.strip() + "\n"
    if details:
        body += "\n" + details
    with atomic_write(path, "w", encoding="utf-8") as handle:
        handle.write(body)


# ---- the program ------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Options of the entrypoint itself; everything else goes to `yolov5-smddp train`."""
    parser = argparse.ArgumentParser(
        prog="entrypoint.py",
        allow_abbrev=False,
        description="SageMaker entry: reads the SageMaker contract, checks the dataset, starts the workers. "
        "Any option not listed here is a training hyperparameter (see `yolov5-smddp train -h`).",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="put model/, output/ and checkpoints/ under this folder instead of /opt/ml",
    )
    parser.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc_per_node",
        type=str,
        default=None,
        help="workers per host (default: one per GPU, one on a CPU host)",
    )
    parser.add_argument(
        "--master-port",
        "--master_port",
        dest="master_port",
        type=str,
        default=None,
        help="rendezvous port on the first host (default 7777, or MASTER_PORT)",
    )
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Runs the job; returns the process exit code (never raises for a training failure)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    environ = os.environ if environ is None else environ
    argv = list(sys.argv[1:] if argv is None else argv)
    failure_path = Path(environ.get("SAGEMAKER_BASE_DIR") or DEFAULT_BASE_DIR) / "output" / "failure"
    try:
        own, train_args = build_parser().parse_known_args(argv)
        env = read_environment(environ, output_root=own.output)
        failure_path = env.failure_file
        return run_job(env, own, train_args, environ)
    except BaseException as exc:  # noqa: B036 - the exit contract: every failure gets a reason and an exit code
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            return 0
        tb = traceback.format_exc()
        log.error("%s", tb)
        reason = failure_reason(exc)
        log.error("FAILURE: %s", reason)
        try:
            write_failure(failure_path, reason, tb)
        except OSError as write_exc:
            log.error("could not write %s: %s", failure_path, write_exc)
        if isinstance(exc, SystemExit) and isinstance(exc.code, int):
            return exc.code
        if getattr(exc, "exitcode", 0) and exc.exitcode > 0:
            return exc.exitcode
        return EXIT_USER_ERROR if isinstance(exc, UserError) else EXIT_INTERNAL_ERROR


# ---- dataset and launch ---------------------------------------------------------------------------


def _given(args: Sequence[str], option: str) -> bool:
    """Whether `--option` (either spelling, `--opt v` or `--opt=v`) is among `args`."""
    spellings = {"--" + option, "--" + option.replace("-", "_")}
    return any(a in spellings or a.split("=", 1)[0] in spellings for a in args)


def location_args(env: SageMakerEnv, train_args: Sequence[str]) -> list[str]:
    """The training options for the SageMaker folders, for each one the user did not set."""
    locations = {
        "model-dir": env.model_dir,
        "output-dir": env.output_data_dir,
        "checkpoint-dir": env.checkpoint_dir,
        "cache-dir": env.cache_dir,
        "tensorboard-dir": env.tensorboard_dir,
    }
    out: list[str] = []
    for option, path in locations.items():
        if not _given(train_args, option):
            out += [f"--{option}", str(path)]
    return out


def prepare_data_yaml(env: SageMakerEnv, data: str | None) -> Path | None:
    """The data.yaml the workers read, rebased onto the training channel; None = the embedded dataset.

    With a `training`/`train` channel: `data` (default data.yaml) is relative to the channel, its `path`
    is replaced by the channel folder, and a `validation`/`val` channel replaces `val`. The rebased copy is
    written to the cache folder (channels are read-only; output/ is uploaded). Without a channel, `data`
    is used as given. Raises DataError naming the channel for a missing or invalid data.yaml.
    """
    import yaml

    from yolov5_smddp.data.config import load_data_config

    train_channel = channel(env, TRAIN_CHANNELS)
    val_channel = channel(env, VAL_CHANNELS)
    if train_channel is None:
        if val_channel is not None:
            raise DataError(f"a validation channel ({val_channel}) was given without a 'training' channel")
        return Path(data) if data else None
    if not train_channel.is_dir():
        raise DataError(f"training channel {train_channel} is not a folder (is the channel mounted?)")
    yaml_path = train_channel / (data or "data.yaml")
    if not yaml_path.is_file():
        found = sorted(p.name for p in train_channel.glob("*.yaml"))
        hint = (
            f" (YAML files there: {', '.join(found)}; pass --data NAME)"
            if found
            else " (put a data.yaml with train/val/names at the channel's top level, or pass --data PATH relative to it)"
        )
        raise DataError(f"training channel {train_channel}: {yaml_path.name} not found{hint}")
    config = load_data_config(yaml_path, root_override=train_channel)
    val = [str(p) for p in config.val]
    if val_channel is not None:
        if not val_channel.is_dir():
            raise DataError(f"validation channel {val_channel} is not a folder (is the channel mounted?)")
        val = [str(val_channel)]
    rebased = {
        "path": str(config.root),
        "train": [str(p) for p in config.train],
        "val": val,
        "names": list(config.names),
        "nc": config.nc,
    }
    if config.test:
        rebased["test"] = [str(p) for p in config.test]
    out = env.cache_dir / "data" / "data.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"data.yaml.{os.getpid()}.tmp")
    tmp.write_text(yaml.safe_dump(rebased, sort_keys=False))
    os.replace(tmp, out)
    log.info("data: %s rebased onto channel %s -> %s", yaml_path, train_channel, out)
    return out


def check_dataset(data_yaml: Path, env: SageMakerEnv, *, cache_dir: Path, max_pixels: int) -> None:
    """Scan train and val labels once before any worker starts, as the workers will (stale/foreign caches
    are reported and ignored, our cache is written to `cache_dir`, so the workers load it). Raises
    DataError when a split has no usable image; the message names the folder."""
    from yolov5_smddp.data.config import load_data_config
    from yolov5_smddp.data.labels import build_label_index

    config = load_data_config(data_yaml)
    for split, sources in (("train", config.train), ("val", config.val)):
        index = build_label_index(
            sources,
            nc=config.nc,
            root=config.root,
            cache_policy="rebuild",
            cache_dir=cache_dir,
            workers=min(env.num_cpus, 16),
            max_pixels=max_pixels,
        )
        r = index.report
        log.info(
            "dataset check %s (%s): %d images, %d usable, %d missing labels, %d empty, %d bad, %d boxes; "
            "cache %s",
            split,
            ", ".join(str(s) for s in sources),
            r.found,
            r.usable,
            r.missing_labels,
            r.empty_labels,
            r.bad,
            r.boxes,
            r.cache,
        )


def _local_gpu_count(env: SageMakerEnv) -> int:
    if env.num_gpus is not None:
        return env.num_gpus
    import torch

    return torch.cuda.device_count()


def run_job(
    env: SageMakerEnv, own: argparse.Namespace, train_args: list[str], environ: Mapping[str, str]
) -> int:
    """Validate the hyperparameters, prepare and check the data, then run the workers; returns 0."""
    from yolov5_smddp import launch
    from yolov5_smddp.config import parse_train_args
    from yolov5_smddp.hyp_options import fold_hyp_options

    train_args = fold_hyp_options(train_args)  # tuning jobs' per-key `--hyp-lr0 V` into --hyp-override
    config = parse_train_args(train_args)  # ConfigError naming the option, before any work
    plan = launch.decide_launch(
        environ,
        hosts=env.hosts,
        current_host=env.current_host,
        num_gpus=_local_gpu_count(env),
        nproc_per_node=own.nproc_per_node,
        master_port=own.master_port,
    )
    log.info(
        "launch: %s, %d host(s) x %d worker(s), this host %s (node %d), master %s:%d",
        plan.mode,
        plan.nnodes,
        plan.nproc_per_node,
        env.current_host,
        plan.node_rank,
        plan.master_addr,
        plan.master_port,
    )
    data_yaml = prepare_data_yaml(env, config.data)
    if data_yaml is not None and plan.local_rank == 0:
        cache_dir = Path(config.cache_dir) if config.cache_dir else env.cache_dir
        check_dataset(data_yaml, env, cache_dir=cache_dir, max_pixels=config.max_image_pixels)
    worker_args = list(train_args) + location_args(env, train_args)
    if environ.get("TRAINING_JOB_NAME") and not _given(train_args, "run-name"):
        worker_args += ["--run-name", environ["TRAINING_JOB_NAME"]]  # names the MLflow run (mlflow_log)
    if data_yaml is not None:
        worker_args += ["--data", str(data_yaml)]
    if plan.prefer_smddp and not _given(train_args, "backend"):
        from yolov5_smddp.distributed import smddp_importable

        worker_args += ["--backend", "smddp" if smddp_importable() else "auto"]
    for folder in (env.model_dir, env.output_data_dir, env.checkpoint_dir, env.cache_dir):
        folder.mkdir(parents=True, exist_ok=True)

    if plan.in_process:
        # mpirun ranks may lack MASTER_ADDR/MASTER_PORT: the first host and the agreed port.
        os.environ.setdefault("MASTER_ADDR", plan.master_addr)
        os.environ.setdefault("MASTER_PORT", str(plan.master_port))
        from yolov5_smddp.commands.train import main as train_main

        code = int(train_main(worker_args) or 0)
    else:
        from yolov5_smddp.sagemaker_efa import network_environment

        # the toolkit sets EFA/NCCL variables only for the ranks it starts; our workers inherit these
        network = network_environment(env.instance_type, env.network_interface, os.environ)
        os.environ.update(network.added)
        log.info("%s", network.log_line(env.instance_type))
        code = launch.run_elastic(
            plan, worker_args, run_id=environ.get("TRAINING_JOB_NAME") or "yolov5-smddp"
        )
    if code == launch.EXIT_INTERRUPTED:
        raise launch.WorkerFailed(
            f"training was stopped by SIGTERM (StopTrainingJob, spot interruption or docker "
            f"stop); the last checkpoint is in {env.checkpoint_dir} and a new run with the "
            "same checkpoint folder resumes from it",
            code,
        )
    if code != 0:
        raise launch.WorkerFailed(f"training exited with code {code}; its error is in the log above", code)
    return 0
