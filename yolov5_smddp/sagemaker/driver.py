"""The program behind entrypoint.py: options → environment → dataset check → launch, and the exit contract.

`main(argv, environ)` never raises for a training failure: it returns the exit code (see failure.py).
`run_job()` never writes os.environ: a worker in this process gets its place (`DistInfo`) directly, the
elastic launcher gets the environment for its workers (`worker_environment`). The hyperparameters are
parsed once: every worker gets that TrainConfig (`job_config`), in this process as it is, through the
elastic launcher as JSON (yolov5_smddp.config.worker_config).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from yolov5_smddp import launch
from yolov5_smddp.commands.train import run_config
from yolov5_smddp.config.hyp_options import fold_hyp_options
from yolov5_smddp.config.train_config import TrainConfig, parse_train_args
from yolov5_smddp.config.worker_config import with_options
from yolov5_smddp.data.cache import choose_cache_dir
from yolov5_smddp.distributed.process_group import DistInfo, detect_dist_info
from yolov5_smddp.errors import EXIT_INTERRUPTED
from yolov5_smddp.files.atomic import make_folder
from yolov5_smddp.sagemaker.dataset import check_dataset, prepare_data_yaml, weights_from_channel
from yolov5_smddp.sagemaker.efa import network_environment
from yolov5_smddp.sagemaker.env import SageMakerEnv, default_failure_file, read_environment
from yolov5_smddp.sagemaker.failure import report_failure, report_stop

log = logging.getLogger(__name__)


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
    failure_file = default_failure_file(environ)
    try:
        own, train_args = build_parser().parse_known_args(argv)
        env = read_environment(environ, output_root=own.output)
        failure_file = env.failure_file
        return run_job(env, own, train_args, environ)
    except BaseException as exc:  # noqa: B036 - the exit contract: every failure gets a reason and an exit code
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            return 0
        return report_failure(exc, failure_file)


def location_options(env: SageMakerEnv, config: TrainConfig) -> dict[str, str]:
    """The training options for the SageMaker folders (TrainConfig field → path), for each one the user
    did not set."""
    locations = {
        "model_dir": env.model_dir,
        "output_dir": env.output_data_dir,
        "checkpoint_dir": env.checkpoint_dir,
        "cache_dir": env.cache_dir,
        "tensorboard_dir": env.tensorboard_dir,
    }
    return {name: str(path) for name, path in locations.items() if name not in config.given}


def job_config(
    env: SageMakerEnv, config: TrainConfig, *, data_yaml: Path | None, weights: Path | None
) -> TrainConfig:
    """What every worker trains (pure): the hyperparameters' `config` with the SageMaker folders the user
    did not set, the job name as --run-name unless set (it names the MLflow run), the data.yaml rebased
    onto the channels and the weights from the weights channel where there are those."""
    values: dict[str, str] = location_options(env, config)
    if env.job_name and "run_name" not in config.given:
        values["run_name"] = env.job_name
    if data_yaml is not None:
        values["data"] = str(data_yaml)
    if weights is not None:
        values["weights"] = str(weights)
    return with_options(config, **values)


def worker_environment(environ: Mapping[str, str], network: Mapping[str, str]) -> dict[str, str]:
    """The environment of the elastic launcher's workers (pure): `environ` plus the EFA/NCCL variables
    `network` (the toolkit sets those only for the ranks it starts); a variable already set is kept."""
    return {**network, **environ}


def worker_info(info: DistInfo, plan: launch.LaunchPlan) -> DistInfo:
    """Where the worker in this process sits: `info`, with the port every rank agreed on (--master-port)."""
    return dataclasses.replace(info, master_port=plan.master_port)


def _local_gpu_count(env: SageMakerEnv) -> int:
    if env.num_gpus is not None:
        return env.num_gpus
    import torch  # only without SM_NUM_GPUS (local runs): a bad option fails before torch's import

    return torch.cuda.device_count()


def run_job(
    env: SageMakerEnv, own: argparse.Namespace, train_args: list[str], environ: Mapping[str, str]
) -> int:
    """Validate the hyperparameters, prepare and check the data, then run the workers; returns 0, or
    EXIT_INTERRUPTED after a SIGTERM (reported in one line, see failure.report_stop)."""
    train_args = fold_hyp_options(train_args)  # tuning jobs' per-key `--hyp-lr0 V` into --hyp-override
    config = parse_train_args(train_args)  # ConfigError naming the option, before any work
    info = detect_dist_info(
        environ, default_master=env.master_addr, hosts_in_job=len(env.hosts), instance_type=env.instance_type
    )
    plan = launch.decide_launch(
        info,
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
        env.hosts[plan.node_rank],  # not SM_CURRENT_HOST: the toolkit's mpirun gives every rank algo-1's
        plan.node_rank,
        plan.master_addr,
        plan.master_port,
    )
    cache_dir = choose_cache_dir(config.cache_dir, job_default=env.cache_dir)
    data_yaml = prepare_data_yaml(env, config.data, cache_dir)
    if data_yaml is not None and plan.local_rank == 0:
        check_dataset(data_yaml, env, cache_dir=cache_dir, max_pixels=config.max_image_pixels)
    weights = weights_from_channel(env, config.weights)
    worker = job_config(env, config, data_yaml=data_yaml, weights=weights)
    for folder in (env.model_dir, env.output_data_dir, env.checkpoint_dir, env.cache_dir):
        make_folder(folder)

    if plan.in_process:
        code = int(run_config(worker, info=worker_info(info, plan)) or 0)
    else:
        network = network_environment(env.instance_type, env.network_interface, environ)
        log.info("%s", network.log_line(env.instance_type))
        code = launch.run_elastic(
            plan,
            worker,
            run_id=env.job_name or "yolov5-smddp",
            environ=worker_environment(environ, network.added),
        )
    if code == EXIT_INTERRUPTED:
        return report_stop(
            f"Training was stopped by SIGTERM (StopTrainingJob, max_run, a spot interruption or docker stop). "
            f'{env.model_dir} holds the model so far (best.pt, metrics.json with "interrupted": true); '
            f"the last checkpoint is in {env.checkpoint_dir}, and a new job with the same checkpoint "
            "folder resumes from it.",
            env.failure_file,
        )
    if code != 0:
        raise launch.WorkerFailed(f"training exited with code {code}; its error is in the log above", code)
    return 0
