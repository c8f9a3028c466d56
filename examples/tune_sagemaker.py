"""Tune yolov5-smddp hyperparameters with SageMaker Automatic Model Tuning (SDK v2 `HyperparameterTuner`),
the replacement for the release's `--evolve` (which does not work under DDP). All arguments come from
`yolov5_smddp.client.job` (`tuner_kwargs`), which is tested without AWS; this script only turns them into SDK objects.

    pip install "sagemaker>=2.200,<3"
    python examples/tune_sagemaker.py \
        --image 111111111111.dkr.ecr.us-west-2.amazonaws.com/yolov5-smddp:0.1.0-abc123 \
        --role arn:aws:iam::111111111111:role/SageMakerRole \
        --train s3://my-bucket/coco128/ --instance-type ml.g5.12xlarge --distribution none \
        --hp cfg=yolov5s --hp epochs=50 --hp batch-size=64 \
        --range hyp-lr0=0.001:0.1:Logarithmic --range hyp-mosaic=0.5:1.0 --range optimizer=SGD,AdamW \
        --max-jobs 20 --max-parallel-jobs 2

`--range NAME=MIN:MAX[:SCALING]` is a continuous range (an integer range when both bounds are integers and
NAME is a training option);
`--range NAME=A,B,...` picks one of the values. NAME is a training option or `hyp-<key>` for one key of the
hyperparameter YAML. The objective is `val:mAP50-95` (maximised). `--dry-run` prints the arguments instead of
starting the tuning job (no SDK or credentials needed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from yolov5_smddp.client.job import (
    DISTRIBUTIONS,
    EARLY_STOPPING_TYPES,
    TUNING_STRATEGIES,
    CategoricalRange,
    ContinuousRange,
    IntegerRange,
    JobSpec,
    ParameterRange,
    TuningSpec,
    data_channels,
    tuner_kwargs,
)
from yolov5_smddp.config.hyp_options import hyp_key
from yolov5_smddp.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def parse_range(text: str) -> tuple[str, ParameterRange]:
    """'hyp-lr0=0.001:0.1:Logarithmic' -> ("hyp-lr0", ContinuousRange(0.001, 0.1, "Logarithmic"));
    'epochs=10:50' -> IntegerRange; 'optimizer=SGD,AdamW' -> CategoricalRange(("SGD", "AdamW"))."""
    name, sep, spec = text.partition("=")
    if not sep or not name or not spec:
        raise SystemExit(f"--range {text!r}: expected NAME=MIN:MAX[:SCALING] or NAME=A,B,...")
    if ":" not in spec:
        return name, CategoricalRange(tuple(v for v in spec.split(",") if v))
    low, _, rest = spec.partition(":")
    high, _, scaling = rest.partition(":")
    try:
        # hyperparameter YAML values are floats: `hyp-mosaic=0:1` is continuous, `epochs=10:50` integer
        if hyp_key(name) is None and low.lstrip("-").isdigit() and high.lstrip("-").isdigit():
            return name, IntegerRange(int(low), int(high), scaling or "Auto")
        return name, ContinuousRange(float(low), float(high), scaling or "Auto")
    except ValueError as exc:
        raise SystemExit(f"--range {text!r}: MIN and MAX must be numbers") from exc


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", required=True, help="our image in ECR (./build.sh push prints it)")
    p.add_argument("--role", required=True, help="IAM role ARN for the training jobs")
    p.add_argument("--instance-type", default="ml.g5.12xlarge")
    p.add_argument("--instance-count", type=int, default=1)
    p.add_argument("--distribution", choices=DISTRIBUTIONS, default="none")
    p.add_argument("--train", help="S3 prefix of the training channel (with data.yaml)")
    p.add_argument("--val", help="S3 prefix of a separate validation channel")
    p.add_argument("--output", help="S3 prefix for every job's model.tar.gz / output.tar.gz")
    p.add_argument("--max-run", type=int, default=24 * 3600, help="seconds per training job")
    p.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE", help="a fixed hyperparameter")
    p.add_argument("--range", action="append", default=[], dest="ranges", help="a tuned hyperparameter")
    p.add_argument("--max-jobs", type=int, default=20)
    p.add_argument("--max-parallel-jobs", type=int, default=2)
    p.add_argument("--strategy", choices=TUNING_STRATEGIES, default="Bayesian")
    p.add_argument("--early-stopping", choices=EARLY_STOPPING_TYPES, default="Off")
    p.add_argument("--wait", action="store_true", help="block until the tuning job ends")
    p.add_argument("--dry-run", action="store_true", help="print the SDK arguments and stop")
    return p.parse_args(argv)


def spec_from_args(args: argparse.Namespace) -> TuningSpec:
    hps = {}
    for item in args.hp:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--hp {item!r}: expected KEY=VALUE")
        hps[key] = value
    job = JobSpec(
        image_uri=args.image,
        role=args.role,
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        distribution=args.distribution,
        hyperparameters=hps,
        train_s3_uri=args.train,
        val_s3_uri=args.val,
        output_path=args.output,
        max_run_s=args.max_run,
        entry_point=str(REPO / "entrypoint.py"),
    )
    return TuningSpec(
        job=job,
        ranges=dict(parse_range(text) for text in args.ranges),
        strategy=args.strategy,
        max_jobs=args.max_jobs,
        max_parallel_jobs=args.max_parallel_jobs,
        early_stopping_type=args.early_stopping,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tuning = spec_from_args(args)
    kwargs = tuner_kwargs(tuning)
    channels = data_channels(tuning.job)
    if args.dry_run:
        print(json.dumps({"HyperparameterTuner": kwargs, "fit": channels}, indent=2))
        return
    from sagemaker.inputs import TrainingInput
    from sagemaker.pytorch import PyTorch
    from sagemaker.tuner import (
        CategoricalParameter,
        ContinuousParameter,
        HyperparameterTuner,
        IntegerParameter,
    )

    classes = {
        "ContinuousParameter": ContinuousParameter,
        "IntegerParameter": IntegerParameter,
        "CategoricalParameter": CategoricalParameter,
    }
    ranges = {
        name: classes[kind](**params)
        for name, spec in kwargs.pop("hyperparameter_ranges").items()
        for kind, params in spec.items()
    }
    estimator = PyTorch(**kwargs.pop("estimator"))
    tuner = HyperparameterTuner(estimator=estimator, hyperparameter_ranges=ranges, **kwargs)
    inputs = {name: TrainingInput(uri, input_mode=tuning.job.input_mode) for name, uri in channels.items()}
    tuner.fit(inputs or None, wait=args.wait)
    print("started", tuner.latest_tuning_job.name)


if __name__ == "__main__":
    try:
        main()
    except ConfigError as exc:  # a job-spec problem: the message says which value and why
        raise SystemExit(f"error: {exc}") from None
