"""A model of multi-node data-parallel step time (a research tool: `python -m bench.scaling ...` from a checkout).

From the model it takes the gradient tensors (bytes each), the order the backward produces them and the
backward work behind each of them (convolution FLOPs); from the command line the measured single-GPU step time and the
links. It then follows what PyTorch DDP does:

1. buckets: gradients in the order one backward produces them (recorded with hooks; close to reverse
   registration order), the first bucket closed once it holds >= 1 MiB, every later one once it holds
   >= 25 MiB;
2. a bucket's all-reduce may start once its last gradient exists (its position in the backward, measured
   as the fraction of backward FLOPs done) and once the previous bucket's all-reduce has finished (one
   communication stream, buckets in order);
3. the all-reduce time of a bucket from the ring or hierarchical algorithm (bandwidth + per-hop latency);
4. what is still running when the backward ends is exposed: step(N) = step(1 GPU) + exposed.

Every assumption is a named argument with a default; docs/PERFORMANCE.md lists them. `bench/overlap.py`
checks the overlap assumption (2 and 3) against real DDP processes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from yolov5_smddp.config.parsing import parse_int_list
from yolov5_smddp.errors import ConfigError, UserError
from yolov5_smddp.models.yolo import build_model

MIB = 1024 * 1024
DDP_FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_BYTES = 25 * MIB  # DistributedDataParallel(bucket_cap_mb=25)
ALGORITHMS = ("ring", "hierarchical")
WORK_IMGSZ = 64  # conv FLOPs all scale with the input area, so their shares do not depend on imgsz


@dataclass(frozen=True, kw_only=True)
class Links:
    """The network one all-reduce runs on.

    `inter_node_Bps` is one node's total bandwidth to the other nodes (all its NICs, one direction);
    `intra_node_Bps` is one GPU's bandwidth to its node peers (one direction). Both already multiplied by
    the achievable fraction of line rate. Latencies are per ring hop.
    """

    nodes: int
    gpus_per_node: int
    inter_node_Bps: float
    intra_node_Bps: float
    inter_node_latency_s: float
    intra_node_latency_s: float

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(f"nodes ({self.nodes}) and gpus_per_node ({self.gpus_per_node}) must be >= 1")
        if self.inter_node_Bps <= 0 or self.intra_node_Bps <= 0:
            raise ValueError("link bandwidths must be > 0")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, kw_only=True)
class OverlapResult:
    """Communication of one step against its backward, in seconds."""

    comm_s: float  # sum of all bucket all-reduce times
    exposed_s: float  # how long communication runs past the end of the backward
    last_end_s: float  # when the last all-reduce ends, from the start of the backward


@dataclass(frozen=True, kw_only=True)
class ScalingPoint:
    """One predicted configuration (one node count, one algorithm)."""

    nodes: int
    world_size: int
    algorithm: str
    comm_ms: float
    exposed_ms: float
    hidden_fraction: float  # share of the communication that runs under the backward
    step_ms: float
    samples_per_s: float  # all GPUs together
    efficiency: float  # throughput(N nodes) / (world_size × throughput(1 GPU without communication))
    efficiency_vs_1_node: float  # throughput(N nodes) / (N × throughput(1 node)), what the sweep measures


def ddp_buckets(
    tensor_bytes: Sequence[int],
    *,
    ready_order: Sequence[int] | None = None,
    first_bucket_bytes: int = DDP_FIRST_BUCKET_BYTES,
    bucket_bytes: int = DDP_BUCKET_BYTES,
) -> list[list[int]]:
    """DDP's bucket assignment after its first iteration (when it rebuilds the buckets in the order the
    gradients became ready): tensor indices (registration order) per bucket, buckets in launch order.

    Tensors are taken in `ready_order` (default: reverse registration order); a bucket closes as soon as
    it holds >= its limit (first_bucket_bytes for the first bucket, bucket_bytes for all later ones)."""
    order = reversed(range(len(tensor_bytes))) if ready_order is None else ready_order
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for index in order:
        current.append(index)
        size += tensor_bytes[index]
        if size >= (first_bucket_bytes if not buckets else bucket_bytes):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def ring_allreduce_bytes(nbytes: float, world_size: int) -> float:
    """Bytes each participant sends in a ring all-reduce of `nbytes`: 2 (N - 1) / N × nbytes."""
    return 2 * (world_size - 1) / world_size * nbytes


def allreduce_seconds(nbytes: float, links: Links, algorithm: str) -> float:
    """Time of one all-reduce of `nbytes` over all GPUs of `links`.

    ring: one flat ring over every GPU (as many rings as GPUs per node, so each node's NICs carry
    2 (W - 1) / W × nbytes); with one node only NVLink is used.
    hierarchical: reduce-scatter inside the node, all-reduce of the 1/G shards across nodes (G parallel
    rings sharing the node's NICs: 2 (N - 1) / N × nbytes per node), all-gather inside the node.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; choose from {ALGORITHMS}")
    g, n, w = links.gpus_per_node, links.nodes, links.world_size
    if w == 1:
        return 0.0
    if n == 1 or algorithm == "hierarchical":
        intra = 2 * (g - 1) / g * nbytes / links.intra_node_Bps + 2 * (g - 1) * links.intra_node_latency_s
        inter = (
            ring_allreduce_bytes(nbytes, n) / links.inter_node_Bps + 2 * (n - 1) * links.inter_node_latency_s
        )
        return intra + inter
    bottleneck = min(links.inter_node_Bps, links.intra_node_Bps)
    return ring_allreduce_bytes(nbytes, w) / bottleneck + 2 * (w - 1) * links.inter_node_latency_s


def bucket_ready_fractions(
    buckets: Sequence[Sequence[int]], tensor_work: Sequence[float], ready_order: Sequence[int] | None = None
) -> list[float]:
    """For each bucket, the fraction of the backward done when its last gradient is produced.

    `tensor_work[i]` is the backward work that ends with tensor i's gradient (registration order); the
    backward produces gradients in `ready_order` (default: reverse registration order). With no work at
    all, gradients are spaced evenly."""
    count = len(tensor_work)
    order = reversed(range(count)) if ready_order is None else ready_order
    total = float(sum(tensor_work))
    done_after: dict[int, float] = {}
    running = 0.0
    for position, index in enumerate(order):
        running += tensor_work[index]
        done_after[index] = running / total if total > 0 else (position + 1) / count
    return [max(done_after[i] for i in bucket) for bucket in buckets]


def simulate_overlap(ready_s: Sequence[float], comm_s: Sequence[float], backward_s: float) -> OverlapResult:
    """Buckets all-reduced one after another, each starting once ready (`ready_s`, from the start of the
    backward) and once the previous one has finished; the part after `backward_s` is exposed."""
    end = 0.0
    for ready, duration in zip(ready_s, comm_s, strict=True):
        end = max(end, ready) + duration
    return OverlapResult(comm_s=float(sum(comm_s)), exposed_s=max(0.0, end - backward_s), last_end_s=end)


def predict_point(
    *,
    bucket_nbytes: Sequence[float],
    ready_fractions: Sequence[float],
    links: Links,
    algorithm: str,
    step_s: float,
    backward_fraction: float,
    batch_per_gpu: int,
    one_node_step_s: float,
) -> ScalingPoint:
    """One node count: bucket all-reduce times, overlap with the backward, step time and efficiencies.
    `one_node_step_s` is the same prediction for one node (for `efficiency_vs_1_node`)."""
    backward_s = step_s * backward_fraction
    comm = [allreduce_seconds(b, links, algorithm) for b in bucket_nbytes]
    overlap = simulate_overlap([f * backward_s for f in ready_fractions], comm, backward_s)
    step_n = step_s + overlap.exposed_s
    hidden = 1.0 - overlap.exposed_s / overlap.comm_s if overlap.comm_s > 0 else 1.0
    return ScalingPoint(
        nodes=links.nodes,
        world_size=links.world_size,
        algorithm=algorithm,
        comm_ms=overlap.comm_s * 1e3,
        exposed_ms=overlap.exposed_s * 1e3,
        hidden_fraction=hidden,
        step_ms=step_n * 1e3,
        samples_per_s=links.world_size * batch_per_gpu / step_n,
        efficiency=step_s / step_n,
        efficiency_vs_1_node=one_node_step_s / step_n,
    )


def predict_scaling(
    *,
    tensor_bytes: Sequence[int],
    tensor_work: Sequence[float],
    ready_order: Sequence[int] | None = None,
    node_counts: Sequence[int],
    links: Links,
    algorithm: str,
    step_s: float,
    backward_fraction: float,
    batch_per_gpu: int,
) -> list[ScalingPoint]:
    """`predict_point` for every node count, with the DDP buckets of `tensor_bytes` (gradient bytes per
    tensor, registration order) filled in `ready_order`. `links.nodes` is replaced by each node count."""
    buckets = ddp_buckets(tensor_bytes, ready_order=ready_order)
    bucket_nbytes = [sum(tensor_bytes[i] for i in bucket) for bucket in buckets]
    ready = bucket_ready_fractions(buckets, tensor_work, ready_order)

    def point(nodes: int, one_node_step_s: float) -> ScalingPoint:
        return predict_point(
            bucket_nbytes=bucket_nbytes,
            ready_fractions=ready,
            links=Links(**{**asdict(links), "nodes": nodes}),
            algorithm=algorithm,
            step_s=step_s,
            backward_fraction=backward_fraction,
            batch_per_gpu=batch_per_gpu,
            one_node_step_s=one_node_step_s,
        )

    one_node_step_s = point(1, step_s).step_ms / 1e3
    return [point(n, one_node_step_s) for n in node_counts]


def gbps_to_bytes_per_s(gbps: float) -> float:
    """Gigabits per second (network convention, 10^9) to bytes per second."""
    return gbps * 1e9 / 8


@dataclass(frozen=True, kw_only=True)
class GradientProfile:
    """What the model contributes to the prediction, per trainable tensor in registration order."""

    numels: list[int]
    work: list[float]  # FLOPs of the conv whose weight this is, one forward at WORK_IMGSZ; 0 otherwise
    ready_order: list[int]  # tensor indices in the order one backward produced their gradients

    def tensor_bytes(self, grad_bytes: int) -> list[int]:
        return [n * grad_bytes for n in self.numels]


def gradient_profile(model, imgsz: int = WORK_IMGSZ) -> GradientProfile:
    """One forward + backward of `model` (train mode; on the meta device it costs nothing) with hooks:
    conv FLOPs per weight and the order in which gradients are accumulated (the order DDP rebuilds its
    buckets in). Gradients are cleared afterwards."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    position = {id(p): i for i, p in enumerate(params)}
    work = [0.0] * len(params)
    ready_order: list[int] = []

    def count(module: torch.nn.Conv2d, _inputs: tuple, output: torch.Tensor) -> None:
        per_output = module.weight[0].numel()  # (cin / groups) × kh × kw multiply-adds per output value
        work[position[id(module.weight)]] += 2.0 * output.numel() * per_output

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    hooks += [
        p.register_post_accumulate_grad_hook(lambda _p, i=i: ready_order.append(i))
        for i, p in enumerate(params)
    ]
    try:
        outputs = model(torch.zeros(1, 3, imgsz, imgsz, device=params[0].device))
        sum(o.float().mean() for o in outputs).backward()
    finally:
        for hook in hooks:
            hook.remove()
        model.zero_grad(set_to_none=True)
    return GradientProfile(numels=[p.numel() for p in params], work=work, ready_order=ready_order)


def model_profile(cfg: str) -> GradientProfile:
    """`gradient_profile` of a freshly built `cfg` on the meta device (shapes only)."""
    return gradient_profile(build_model(cfg).train().to("meta"))


def _node_counts(text: str) -> list[int]:
    return parse_int_list(text, minimum=1, what="node counts")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cfg", default="yolov5x.yaml", help="model config (gradient sizes and layer work)")
    parser.add_argument(
        "--step-ms",
        type=float,
        required=True,
        help="measured single-GPU training step time in ms (bench train)",
    )
    parser.add_argument("--batch-per-gpu", type=int, default=32, help="only for the samples/s column")
    parser.add_argument("--nodes", type=_node_counts, default=[1, 2, 4, 8], help="node counts, e.g. 1,2,4,8")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument(
        "--inter-node-gbps",
        type=float,
        default=400.0,
        help="one node's total network bandwidth, Gbit/s (p4d: 4 × 100 Gbit/s EFA)",
    )
    parser.add_argument(
        "--intra-node-gbps",
        type=float,
        default=2400.0,
        help="one GPU's NVLink bandwidth to its peers, one direction, Gbit/s "
        "(A100: 600 GB/s both directions = 2400 Gbit/s each way)",
    )
    parser.add_argument(
        "--link-efficiency", type=float, default=0.8, help="achieved fraction of the line rates above"
    )
    parser.add_argument("--inter-node-latency-us", type=float, default=20.0, help="per ring hop")
    parser.add_argument("--intra-node-latency-us", type=float, default=5.0, help="per ring hop")
    parser.add_argument(
        "--grad-bytes",
        type=int,
        default=4,
        choices=(2, 4),
        help="bytes per gradient value: 4 = fp32 grads (AMP keeps fp32 params), "
        "2 = a bf16/fp16 compression hook",
    )
    parser.add_argument(
        "--backward-fraction",
        type=float,
        default=0.6,
        help="share of the step spent in the backward (forward ≈ 1/3 of the FLOPs, "
        "minus data and optimizer time)",
    )
    parser.add_argument("--algorithm", choices=(*ALGORITHMS, "both"), default="both")
    parser.add_argument("--json", type=Path, default=None, help="write the predictions here")


def _check(args: argparse.Namespace) -> None:
    if args.step_ms <= 0:
        raise ConfigError(f"--step-ms must be > 0, got {args.step_ms}")
    if not 0 < args.backward_fraction <= 1:
        raise ConfigError(f"--backward-fraction must be in (0, 1], got {args.backward_fraction}")
    if not 0 < args.link_efficiency <= 1:
        raise ConfigError(f"--link-efficiency must be in (0, 1], got {args.link_efficiency}")
    if args.inter_node_gbps <= 0 or args.intra_node_gbps <= 0:
        raise ConfigError("--inter-node-gbps and --intra-node-gbps must be > 0")
    if args.gpus_per_node < 1 or args.batch_per_gpu < 1:
        raise ConfigError("--gpus-per-node and --batch-per-gpu must be >= 1")


def format_table(points: Sequence[ScalingPoint]) -> str:
    header = (
        f"{'algorithm':<13}{'nodes':>6}{'GPUs':>6}{'comm ms':>10}{'exposed ms':>12}{'hidden':>8}"
        f"{'step ms':>10}{'samples/s':>11}{'eff':>7}{'eff/1node':>10}"
    )
    rows = [
        f"{p.algorithm:<13}{p.nodes:>6}{p.world_size:>6}{p.comm_ms:>10.2f}{p.exposed_ms:>12.2f}"
        f"{p.hidden_fraction:>8.1%}{p.step_ms:>10.2f}{p.samples_per_s:>11.1f}{p.efficiency:>7.1%}"
        f"{p.efficiency_vs_1_node:>10.1%}"
        for p in points
    ]
    return "\n".join([header, *rows])


def run(args: argparse.Namespace) -> int:
    _check(args)
    profile = model_profile(args.cfg)
    tensor_bytes = profile.tensor_bytes(args.grad_bytes)
    links = Links(
        nodes=1,
        gpus_per_node=args.gpus_per_node,
        inter_node_Bps=gbps_to_bytes_per_s(args.inter_node_gbps) * args.link_efficiency,
        intra_node_Bps=gbps_to_bytes_per_s(args.intra_node_gbps) * args.link_efficiency,
        inter_node_latency_s=args.inter_node_latency_us * 1e-6,
        intra_node_latency_s=args.intra_node_latency_us * 1e-6,
    )
    algorithms = ALGORITHMS if args.algorithm == "both" else (args.algorithm,)
    points = [
        point
        for algorithm in algorithms
        for point in predict_scaling(
            tensor_bytes=tensor_bytes,
            tensor_work=profile.work,
            ready_order=profile.ready_order,
            node_counts=args.nodes,
            links=links,
            algorithm=algorithm,
            step_s=args.step_ms / 1e3,
            backward_fraction=args.backward_fraction,
            batch_per_gpu=args.batch_per_gpu,
        )
    ]
    buckets = ddp_buckets(tensor_bytes, ready_order=profile.ready_order)
    print(
        f"{args.cfg}: {len(tensor_bytes)} gradient tensors, {sum(tensor_bytes) / 1e6:.1f} MB, "
        f"{len(buckets)} DDP buckets; step {args.step_ms:g} ms on 1 GPU, backward {args.backward_fraction:.0%}"
    )
    print(format_table(points))
    report: dict = {
        "cfg": args.cfg,
        "gradient_bytes": sum(tensor_bytes),
        "buckets": len(buckets),
        "assumptions": {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "json"},
        "predictions": [asdict(p) for p in points],
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {args.json}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench.scaling ARGS`: 0, or 2 with the message for a bad argument."""
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.splitlines()[0])
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
