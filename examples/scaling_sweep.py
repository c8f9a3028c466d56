"""Submit the same training job at several node counts / DataLoader workers / batch sizes, then collect
each job's metrics.json and print throughput and scaling efficiency.

    # 1. submit (needs AWS credentials and the sagemaker SDK v2); writes the job names to sweep.json
    python examples/scaling_sweep.py submit --image-uri ACCOUNT.dkr.ecr.REGION.amazonaws.com/yolov5-smddp:latest \\
        --role arn:aws:iam::ACCOUNT:role/SageMakerRole --nodes 1,2,4,8 --workers 8,12 --batch-per-gpu 32 \\
        --hp cfg=yolov5x --hp epochs=3 --manifest sweep.json
    # 2. collect once the jobs are done (waits for the ones still running)
    python examples/scaling_sweep.py collect --manifest sweep.json

The job arguments come from `yolov5_smddp.client.job.pytorch_estimator_kwargs`, the same builder as
examples/launch_sagemaker.py. Scaling efficiency(N) = throughput(N nodes) / (N × throughput(1 node)) with
the same workers and batch per GPU. Everything but `submit_jobs` / `download_model_tar` is pure and tested
without AWS (tests/unit/test_scaling_sweep.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import itertools
import json
import re
import sys
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from yolov5_smddp.client.job import JobSpec, pytorch_estimator_kwargs
from yolov5_smddp.errors import ConfigError, DataError

METRICS_FILE = "metrics.json"
DEFAULT_THROUGHPUT_KEY = "throughput.samples_per_sec"  # written by reporting.write_final_outputs
MAX_BASE_JOB_NAME = 32  # the SDK appends "-YYYY-MM-DD-HH-MM-SS-mmm" (24 chars); job names are <= 63


@dataclass(frozen=True, kw_only=True, order=True)
class SweepPoint:
    """One job of the sweep."""

    nodes: int
    workers: int
    batch_per_gpu: int


@dataclass(frozen=True, kw_only=True)
class SweepRow:
    """One collected job with its throughput and efficiency against the 1-node job of its group."""

    point: SweepPoint
    job_name: str
    samples_per_s: float
    per_node_samples_per_s: float
    efficiency: float | None  # None when the group has no 1-node job


def sweep_points(nodes: Iterable[int], workers: Iterable[int], batches: Iterable[int]) -> list[SweepPoint]:
    """Every combination, sorted by (nodes, workers, batch)."""
    points = [
        SweepPoint(nodes=n, workers=w, batch_per_gpu=b)
        for n, w, b in itertools.product(nodes, workers, batches)
    ]
    for p in points:
        if min(p.nodes, p.batch_per_gpu) < 1 or p.workers < 0:
            raise ConfigError(f"sweep point {p}: nodes and batch per GPU must be >= 1, workers >= 0")
    return sorted(set(points))


def base_job_name(prefix: str, point: SweepPoint) -> str:
    """`<prefix>-n<nodes>-w<workers>-b<batch>`, cut to what SageMaker accepts before the SDK's suffix."""
    suffix = f"-n{point.nodes}-w{point.workers}-b{point.batch_per_gpu}"
    cleaned = re.sub(r"[^A-Za-z0-9-]", "-", prefix).strip("-") or "sweep"
    return cleaned[: MAX_BASE_JOB_NAME - len(suffix)].rstrip("-") + suffix


def job_spec_for(base: JobSpec, point: SweepPoint) -> JobSpec:
    """`base` with this point's node count, workers and batch per GPU (as train options). A global
    `batch-size` in `base` is dropped: the batch is per GPU so that every node count does the same
    work per GPU."""
    hyperparameters = {k: v for k, v in base.hyperparameters.items() if k not in ("batch-size", "batch_size")}
    hyperparameters.update({"batch-per-gpu": point.batch_per_gpu, "workers": point.workers})
    return dataclasses.replace(
        base,
        instance_count=point.nodes,
        hyperparameters=hyperparameters,
        base_job_name=base_job_name(base.base_job_name, point),
    )


def sweep_estimator_kwargs(base: JobSpec, points: Sequence[SweepPoint]) -> list[dict]:
    """SDK v2 `PyTorch(**kwargs)` arguments for every point, from the project's own builder."""
    return [pytorch_estimator_kwargs(job_spec_for(base, p)) for p in points]


def metrics_from_model_tar(data: bytes, *, source: str = "model.tar.gz") -> dict:
    """The metrics.json inside a model.tar.gz (at its top level or in a folder), parsed as JSON. Nothing
    is extracted to disk and only a regular file is read."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            members = [m for m in archive.getmembers() if m.isfile() and Path(m.name).name == METRICS_FILE]
            if not members:
                raise DataError(
                    f"{source}: no {METRICS_FILE} inside (files: "
                    f"{', '.join(m.name for m in archive.getmembers()[:10]) or 'none'})"
                )
            member = min(members, key=lambda m: m.name.count("/"))  # the shallowest one
            raw = archive.extractfile(member).read()
    except tarfile.TarError as exc:
        raise DataError(f"{source}: not a readable tar archive ({exc})") from exc
    try:
        metrics = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DataError(f"{source}: {member.name} is not valid JSON ({exc})") from exc
    if not isinstance(metrics, dict):
        raise DataError(f"{source}: {member.name} holds a {type(metrics).__name__}, expected an object")
    return metrics


def throughput(metrics: Mapping, key: str = DEFAULT_THROUGHPUT_KEY, *, source: str = METRICS_FILE) -> float:
    """The total samples/s of a job: `key` is a dotted path into metrics.json ("throughput.samples_per_s")."""
    value: object = metrics
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            present = ", ".join(sorted(value)) if isinstance(value, Mapping) else type(value).__name__
            raise DataError(f"{source}: no {key!r} (at {part!r}; present: {present})")
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise DataError(f"{source}: {key!r} is {value!r}, expected a positive number")
    return float(value)


def scaling_efficiency(results: Sequence[tuple[SweepPoint, str, float]]) -> list[SweepRow]:
    """(point, job name, total samples/s) → rows with efficiency(N) = thr(N) / (N × thr(1 node)), the
    1-node job being the one with the same workers and batch per GPU. Rows sorted by point."""
    one_node = {(p.workers, p.batch_per_gpu): thr for p, _, thr in results if p.nodes == 1}
    rows = []
    for point, job_name, thr in sorted(results, key=lambda r: r[0]):
        baseline = one_node.get((point.workers, point.batch_per_gpu))
        rows.append(
            SweepRow(
                point=point,
                job_name=job_name,
                samples_per_s=thr,
                per_node_samples_per_s=thr / point.nodes,
                efficiency=None if baseline is None else thr / (point.nodes * baseline),
            )
        )
    return rows


def format_rows(rows: Sequence[SweepRow]) -> str:
    header = f"{'nodes':>5} {'workers':>7} {'batch/GPU':>9} {'samples/s':>11} {'per node':>10} {'efficiency':>10}  job"
    lines = [header]
    for r in rows:
        eff = "-" if r.efficiency is None else f"{r.efficiency:.1%}"
        lines.append(
            f"{r.point.nodes:>5} {r.point.workers:>7} {r.point.batch_per_gpu:>9} {r.samples_per_s:>11.1f} "
            f"{r.per_node_samples_per_s:>10.1f} {eff:>10}  {r.job_name}"
        )
    return "\n".join(lines)


def parse_int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


def parse_hp(items: Sequence[str]) -> dict[str, str]:
    """`--hp key=value` pairs → hyperparameters (values stay strings; the trainer parses them)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--hp {item!r}: expected key=value")
        out[key] = value
    return out


# --- the AWS side (not unit-tested: needs credentials) ---------------------------------------------------


def submit_jobs(base: JobSpec, points: Sequence[SweepPoint]) -> list[dict]:
    """Starts every job without waiting; returns manifest entries {point, job_name}."""
    from sagemaker.inputs import TrainingInput
    from sagemaker.pytorch import PyTorch

    from yolov5_smddp.client.job import data_channels

    entries = []
    for point, kwargs in zip(points, sweep_estimator_kwargs(base, points), strict=True):
        spec = job_spec_for(base, point)
        estimator = PyTorch(**kwargs)
        channels = {
            name: TrainingInput(uri, input_mode=spec.input_mode) for name, uri in data_channels(spec).items()
        }
        estimator.fit(channels or None, wait=False)
        job_name = estimator.latest_training_job.name
        print(f"submitted {job_name}: {point}")
        entries.append({"point": dataclasses.asdict(point), "job_name": job_name})
    return entries


def download_model_tar(job_name: str) -> bytes:
    """Waits for the job, then reads its model.tar.gz from S3 into memory."""
    import boto3

    sm = boto3.client("sagemaker")
    sm.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName=job_name, WaiterConfig={"Delay": 60, "MaxAttempts": 24 * 60}
    )
    job = sm.describe_training_job(TrainingJobName=job_name)
    if job["TrainingJobStatus"] != "Completed":
        raise DataError(f"job {job_name} ended {job['TrainingJobStatus']}: {job.get('FailureReason', '')}")
    uri = job["ModelArtifacts"]["S3ModelArtifacts"]
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    submit = sub.add_parser("submit", help="start one job per sweep point")
    submit.add_argument("--image-uri", required=True)
    submit.add_argument("--role", required=True)
    submit.add_argument("--instance-type", default="ml.p4d.24xlarge")
    submit.add_argument("--distribution", default="smddp", help="smddp, torchrun or none")
    submit.add_argument("--nodes", type=parse_int_list, default=[1, 2, 4, 8])
    submit.add_argument("--workers", type=parse_int_list, default=[8])
    submit.add_argument("--batch-per-gpu", type=parse_int_list, default=[32])
    submit.add_argument("--train-s3-uri", default=None, help="training channel (default: embedded dataset)")
    submit.add_argument("--output-path", default=None)
    submit.add_argument("--base-job-name", default="yolov5-sweep")
    submit.add_argument("--hp", action="append", default=[], help="train option key=value (repeatable)")
    collect = sub.add_parser("collect", help="wait for the jobs, read metrics.json, print efficiency")
    collect.add_argument(
        "--throughput-key",
        default=DEFAULT_THROUGHPUT_KEY,
        help="dotted path of total samples/s in metrics.json",
    )
    for p in (submit, collect):
        p.add_argument("--manifest", type=Path, default=Path("sweep.json"))
    args = parser.parse_args(argv)

    if args.action == "submit":
        base = JobSpec(
            image_uri=args.image_uri,
            role=args.role,
            instance_type=args.instance_type,
            distribution=args.distribution,
            hyperparameters=parse_hp(args.hp),
            train_s3_uri=args.train_s3_uri,
            output_path=args.output_path,
            base_job_name=args.base_job_name,
        )
        entries = submit_jobs(base, sweep_points(args.nodes, args.workers, args.batch_per_gpu))
        args.manifest.write_text(json.dumps(entries, indent=2))
        print(f"wrote {args.manifest}; run `collect --manifest {args.manifest}` when the jobs are done")
        return 0

    results = []
    for entry in json.loads(args.manifest.read_text()):
        name = entry["job_name"]
        metrics = metrics_from_model_tar(download_model_tar(name), source=f"{name}/model.tar.gz")
        results.append(
            (SweepPoint(**entry["point"]), name, throughput(metrics, args.throughput_key, source=name))
        )
    print(format_rows(scaling_efficiency(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
