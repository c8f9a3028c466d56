"""Start a yolov5-smddp training job on Amazon SageMaker with the Python SDK (v2 `PyTorch`, or v3
`ModelTrainer` with `Torchrun`). All arguments come from `yolov5_smddp.client.job`, which is tested without AWS;
this script only turns them into SDK objects.

    pip install "sagemaker>=2.200,<3"            # or sagemaker>=3 for --sdk v3
    python examples/launch_sagemaker.py \
        --image 111111111111.dkr.ecr.us-west-2.amazonaws.com/yolov5-smddp:0.1.0-abc123 \
        --role arn:aws:iam::111111111111:role/SageMakerRole \
        --train s3://my-bucket/coco128/ --checkpoints s3://my-bucket/ckpt/run1/ \
        --instance-type ml.p4d.24xlarge --instance-count 2 --spot \
        --hp cfg=yolov5s --hp epochs=300 --hp batch-size=512

`--dry-run` prints the arguments instead of starting a job (no SDK or credentials needed).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from yolov5_smddp.client.job import (
    DISTRIBUTIONS,
    JobSpec,
    data_channels,
    file_system_inputs,
    model_trainer_kwargs,
    pytorch_estimator_kwargs,
)
from yolov5_smddp.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", required=True, help="our image in ECR (./build.sh push prints it)")
    p.add_argument("--role", required=True, help="IAM role ARN for the job")
    p.add_argument("--sdk", choices=("v2", "v3"), default="v2")
    p.add_argument("--instance-type", default="ml.p4d.24xlarge")
    p.add_argument("--instance-count", type=int, default=1)
    p.add_argument("--distribution", choices=DISTRIBUTIONS, default="smddp")
    p.add_argument(
        "--train", help="S3 prefix of the training channel (with data.yaml); omit for the embedded dataset"
    )
    p.add_argument("--val", help="S3 prefix of a separate validation channel")
    # Pipe is listed so that the builder says why it cannot work (a FIFO per channel, not a folder)
    p.add_argument("--input-mode", default="FastFile", choices=("File", "FastFile", "Pipe"))
    p.add_argument(
        "--keep-alive", type=int, help="warm pool: seconds (<= 3600) the instances wait for the next job"
    )
    p.add_argument("--tensorboard", help="S3 prefix the TensorBoard events are uploaded to")
    p.add_argument("--subnet", action="append", default=[], help="VPC subnet (with --security-group)")
    p.add_argument("--security-group", action="append", default=[], help="VPC security group id")
    p.add_argument("--checkpoints", help="S3 prefix synced with /opt/ml/checkpoints (needed for --spot)")
    p.add_argument("--output", help="S3 prefix for model.tar.gz / output.tar.gz")
    p.add_argument("--spot", action="store_true", help="managed spot training")
    p.add_argument("--max-run", type=int, default=24 * 3600, help="seconds")
    p.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE", help="a training hyperparameter")
    p.add_argument("--wait", action="store_true", help="stream the logs until the job ends")
    p.add_argument("--dry-run", action="store_true", help="print the SDK arguments and stop")
    return p.parse_args(argv)


def spec_from_args(args: argparse.Namespace, source_dir: str | None = None) -> JobSpec:
    hps = {}
    for item in args.hp:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--hp {item!r}: expected KEY=VALUE")
        hps[key] = value
    return JobSpec(
        image_uri=args.image,
        role=args.role,
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        distribution=args.distribution,
        hyperparameters=hps,
        train_s3_uri=args.train,
        val_s3_uri=args.val,
        input_mode=args.input_mode,
        checkpoint_s3_uri=args.checkpoints,
        output_path=args.output,
        use_spot_instances=args.spot,
        max_run_s=args.max_run,
        keep_alive_s=args.keep_alive,
        tensorboard_s3_uri=args.tensorboard,
        subnets=tuple(args.subnet),
        security_group_ids=tuple(args.security_group),
        source_dir=source_dir,
        entry_point="entrypoint.py" if source_dir else str(REPO / "entrypoint.py"),
    )


def launch_v2(spec: JobSpec, wait: bool, dry_run: bool) -> None:
    kwargs = pytorch_estimator_kwargs(spec)
    channels = data_channels(spec)
    if dry_run:
        print(json.dumps({"PyTorch": kwargs, "fit": channels}, indent=2))
        return
    from sagemaker.debugger import TensorBoardOutputConfig
    from sagemaker.inputs import FileSystemInput, TrainingInput
    from sagemaker.pytorch import PyTorch

    if "tensorboard_output_config" in kwargs:
        kwargs["tensorboard_output_config"] = TensorBoardOutputConfig(**kwargs["tensorboard_output_config"])
    estimator = PyTorch(**kwargs)
    inputs = {name: TrainingInput(uri, input_mode=spec.input_mode) for name, uri in channels.items()}
    inputs |= {name: FileSystemInput(**v) for name, v in file_system_inputs(spec).items()}
    estimator.fit(inputs or None, wait=wait)
    print("started", estimator.latest_training_job.name)


def launch_v3(spec: JobSpec, wait: bool, dry_run: bool) -> None:
    kwargs = model_trainer_kwargs(spec)
    channels = data_channels(spec)
    if dry_run:
        print(json.dumps({"ModelTrainer": kwargs, "train": channels}, indent=2))
        return
    from sagemaker.train.configs import (
        CheckpointConfig,
        Compute,
        FileSystemDataSource,
        InputData,
        Networking,
        OutputDataConfig,
        SourceCode,
        StoppingCondition,
        TensorBoardOutputConfig,
    )
    from sagemaker.train.distributed import Torchrun
    from sagemaker.train.model_trainer import ModelTrainer

    classes = {
        "compute": Compute,
        "stopping_condition": StoppingCondition,
        "checkpoint_config": CheckpointConfig,
        "source_code": SourceCode,
        "distributed": Torchrun,
        "output_data_config": OutputDataConfig,
        "networking": Networking,
    }
    tensorboard = kwargs.pop("tensorboard_output_config", None)
    trainer = ModelTrainer(**{k: classes[k](**v) if k in classes else v for k, v in kwargs.items()})
    if tensorboard is not None:
        trainer = trainer.with_tensorboard_output_config(TensorBoardOutputConfig(**tensorboard))
    data = [InputData(channel_name=k, data_source=v) for k, v in channels.items()]
    data += [
        InputData(channel_name=k, data_source=FileSystemDataSource(**v))
        for k, v in file_system_inputs(spec).items()
    ]
    trainer.train(
        input_data_config=data or None,
        wait=wait,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as code_dir:
        source_dir = None
        if args.sdk == "v3" and args.distribution == "torchrun":
            shutil.copy(REPO / "entrypoint.py", code_dir)  # SDK v3 uploads a folder: only the entry script
            source_dir = code_dir
        spec = spec_from_args(args, source_dir)
        (launch_v2 if args.sdk == "v2" else launch_v3)(spec, args.wait, args.dry_run)


if __name__ == "__main__":
    try:
        main()
    except ConfigError as exc:  # a job-spec problem: the message says which value and why
        raise SystemExit(f"error: {exc}") from None
