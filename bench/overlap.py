"""Checks the scaling model's overlap assumption on this machine (a research tool, run from a checkout:
`python -m bench.overlap --cfg yolov5s --imgsz 128 --batch 2 --iters 8 [--emulate-device-ms MS] [--json F]`): 2 Gloo processes train the same model
with DDP, rotating through three kinds of step: inside `no_sync()`; with DDP's gradient sync but a comm
hook that only scales each bucket locally (`sync_local`: DDP's bucket bookkeeping, no communication); and
with the real all-reduce of every bucket (`sync`, the same hook calling torch's default all-reduce hook).
The exposed communication, sync − sync_local (paired), is compared with what `scaling.simulate_overlap`
predicts from the measured backward time and the measured all-reduce time of each DDP bucket alone.
sync_local − no_sync, DDP's own host work per step (reducer bookkeeping, the 1/world scaling of every
bucket), is reported beside it: on a CPU it is a pass over all gradient bytes, on a GPU a short kernel.

The loss is a plain sum of the raw outputs' means: the backward through the network is what matters
here, not the detection loss.

On a CPU, Gloo's reduction and the backward compete for the same cores, which an accelerator does not do
(its kernels run on the device; NCCL uses a few SMs, NVLink and the NICs). `emulate_device_ms` stands in
for that: every convolution's backward also waits (sleeping, so the core is free) for its share of that
many milliseconds, proportional to its weight count — a backward of device kernels the host only waits
on. The communication then has idle host cores to run on, as beside a GPU, and the check tests what the
scaling model assumes: DDP's buckets go out while the rest of the backward still runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.scaling import bucket_ready_fractions, ddp_buckets, gradient_profile, simulate_overlap

WARMUP_STEPS = 2  # DDP rebuilds its buckets in gradient-ready order after the first iteration
COMM_REPEATS = 5
STEP_KINDS = ("no_sync", "sync_local", "sync")


class _CommSwitch:
    """State of the comm hook: all-reduce the buckets (`communicate`) or only scale them locally."""

    def __init__(self, world_size: int) -> None:
        self.communicate = True
        self.world_size = world_size


def _switchable_allreduce(state: _CommSwitch, bucket):
    """torch's default all-reduce hook (divide by the world size, all-reduce) when communicating; the same
    division and an already completed future otherwise."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if state.communicate:
        return default_hooks.allreduce_hook(None, bucket)
    done = torch.futures.Future()
    done.set_result(bucket.buffer().div_(state.world_size))
    return done


@dataclass(frozen=True, kw_only=True)
class OverlapMeasurement:
    """Milliseconds per step on rank 0 (the ranks start each step together after a barrier)."""

    cfg: str
    imgsz: int
    batch_per_rank: int
    world_size: int
    iters: int
    threads_per_rank: int
    emulate_device_ms: float  # emulated device backward per step (0: plain CPU compute)
    buckets: int
    gradient_mb: float
    model_bucket_bytes: list[int]  # the scaling model's buckets
    ddp_bucket_bytes: list[int]  # the buckets DDP built (should be equal)
    forward_ms: float  # sync_local steps
    backward_ms: float  # sync_local steps
    step_no_sync_ms: float
    step_sync_local_ms: float  # DDP's sync path with a local-only comm hook
    step_sync_ms: float
    bucket_allreduce_ms: float  # every bucket all-reduced alone, one after another, nothing else running
    measured_exposed_ms: float  # step_sync − step_sync_local (paired)
    noise_ms: float  # 2 × standard error of the paired (sync − sync_local) differences
    ddp_overhead_ms: float  # step_sync_local − step_no_sync: DDP's host work without communication
    predicted_exposed_ms: float  # the scaling model with the measured backward and bucket times
    predicted_if_no_overlap_ms: float  # = bucket_allreduce_ms: what no overlap at all would cost
    host_compute_share: float  # part of the backward the host computes itself (not emulated device time)
    predicted_with_contention_ms: float  # model + share × (no overlap − model): see contention_estimate

    @property
    def agrees(self) -> bool:
        return abs(self.measured_exposed_ms - self.predicted_exposed_ms) <= self.noise_ms

    def summary(self) -> str:
        verdict = "agrees" if self.agrees else "DISAGREES"
        buckets = "equal to" if self.model_bucket_bytes == self.ddp_bucket_bytes else "DIFFERENT from"
        return (
            f"overlap check ({self.cfg} {self.imgsz}px, batch {self.batch_per_rank}/rank, {self.world_size} "
            f"Gloo ranks × {self.threads_per_rank} thread, {self.iters} paired steps, {self.buckets} buckets, "
            f"emulated device backward {self.emulate_device_ms:.0f} ms, "
            f"{self.gradient_mb:.1f} MB, bucket sizes {buckets} DDP's):\n"
            f"  forward {self.forward_ms:.1f} ms, backward {self.backward_ms:.1f} ms (sync_local), "
            f"step no_sync {self.step_no_sync_ms:.1f} ms, sync_local {self.step_sync_local_ms:.1f} ms, "
            f"sync {self.step_sync_ms:.1f} ms\n"
            f"  DDP's host work without communication (sync_local − no_sync) {self.ddp_overhead_ms:.1f} ms\n"
            f"  all-reduce of the buckets alone {self.bucket_allreduce_ms:.1f} ms\n"
            f"  exposed communication: measured {self.measured_exposed_ms:.1f} ± {self.noise_ms:.1f} ms, "
            f"model {self.predicted_exposed_ms:.1f} ms (no overlap would be {self.predicted_if_no_overlap_ms:.1f}"
            f" ms) → {verdict}\n"
            f"  with the host's own compute share of the backward ({self.host_compute_share:.0%}) taking the "
            f"cores from the communication: {self.predicted_with_contention_ms:.1f} ms expected"
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ddp_bucket_bytes(ddp) -> list[int]:
    """The bucket sizes DDP itself chose when it rebuilt its buckets (from its logging data)."""
    sizes = ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes", "")
    return [int(v) for v in str(sizes).split(",") if v.strip()]


def _emulate_device_backward(model, images, total_s: float) -> None:
    """Make each Conv2d's backward also sleep for its FLOP share of `total_s` (see the module doc); the
    shares are the scaling model's work measure: 2 × output elements × weights per output."""
    import torch
    from torch import nn

    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    flops: dict[nn.Module, float] = {}
    probes = [
        m.register_forward_hook(
            lambda mod, _i, out: flops.__setitem__(mod, 2.0 * out.numel() * mod.weight[0].numel())
        )
        for m in convs
    ]
    with torch.no_grad():
        model(images)
    for probe in probes:
        probe.remove()
    total_flops = sum(flops.values())

    def attach(module: nn.Module, seconds: float) -> None:
        def forward_hook(_module, _inputs, output: torch.Tensor) -> None:
            if output.requires_grad:
                output.register_hook(lambda grad: (time.sleep(seconds), grad)[1])

        module.register_forward_hook(forward_hook)

    for conv in convs:
        attach(conv, total_s * flops[conv] / total_flops)


def _worker(
    rank: int,
    world_size: int,
    port: int,
    cfg: str,
    imgsz: int,
    batch: int,
    iters: int,
    out_path: str,
    emulate_device_ms: float,
) -> None:
    import torch

    from yolov5_smddp.distributed import process_group

    torch.set_num_threads(1)
    info = process_group.DistInfo(
        rank=rank,
        local_rank=rank,
        world_size=world_size,
        local_world_size=world_size,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=port,
        launcher="torchrun",
        use_libuv=os.environ.get("USE_LIBUV", "1") != "0",
    )
    process_group.init(info, "gloo", "cpu", timeout_s=600)  # the trainer's own process-group setup
    try:
        raw = _measure(world_size, cfg, imgsz, batch, iters, emulate_device_ms)
    except BaseException:
        process_group.teardown(None)
        raise
    if rank == 0:
        Path(out_path).write_text(json.dumps(raw))
    # as the trainer leaves: the final barrier, then the store's host (rank 0) last; the DDP wrapper
    # built by _measure is garbage by now, so leaving the group frees its backend (process_group.py)
    process_group.teardown(0)


def _measure(world_size: int, cfg: str, imgsz: int, batch: int, iters: int, emulate_device_ms: float) -> dict:
    """The measurement on this rank, in the process group: its timings, and the buckets (JSON-ready)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from yolov5_smddp.models.yolo import build_model

    torch.manual_seed(0)
    model = build_model(cfg).train()
    profile = gradient_profile(build_model(cfg).train().to("meta"))  # work shares do not depend on imgsz
    tensor_bytes = profile.tensor_bytes(4)  # fp32 gradients
    images = torch.rand(batch, 3, imgsz, imgsz)
    if emulate_device_ms > 0:
        _emulate_device_backward(model, images, emulate_device_ms / 1e3)
    ddp = DistributedDataParallel(
        model, gradient_as_bucket_view=True
    )  # as the trainer; an explicit bucket_cap_mb would also cap the first bucket
    switch = _CommSwitch(world_size)
    ddp.register_comm_hook(switch, _switchable_allreduce)

    def step(kind: str) -> tuple[float, float]:
        switch.communicate = kind == "sync"
        context = ddp.no_sync if kind == "no_sync" else contextlib.nullcontext
        dist.barrier()
        start = time.perf_counter()
        with context():
            outputs = ddp(images)
            loss = sum(o.mean() for o in outputs)
            forward_done = time.perf_counter()
            loss.backward()
        end = time.perf_counter()
        # zeroed in place, not freed: every kind of step then accumulates into the same gradient tensors
        # (DDP's bucket views), so no kind is charged for memory another allocates
        ddp.zero_grad(set_to_none=False)
        return forward_done - start, end - forward_done

    for _ in range(WARMUP_STEPS):
        step("sync")
    timings: dict[str, list[tuple[float, float]]] = {kind: [] for kind in STEP_KINDS}
    for i in range(iters):
        for k in range(len(STEP_KINDS)):  # rotate the order to cancel drift
            kind = STEP_KINDS[(i + k) % len(STEP_KINDS)]
            timings[kind].append(step(kind))

    buckets = ddp_buckets(tensor_bytes, ready_order=profile.ready_order)
    bucket_tensors = [torch.zeros(sum(tensor_bytes[i] for i in b) // 4) for b in buckets]
    per_bucket: list[list[float]] = [[] for _ in buckets]
    for _ in range(COMM_REPEATS):
        dist.barrier()
        for k, tensor in enumerate(bucket_tensors):
            start = time.perf_counter()
            dist.all_reduce(tensor)
            per_bucket[k].append(time.perf_counter() - start)

    return {
        **timings,
        "bucket_s": [statistics.median(t) for t in per_bucket],
        "ready": bucket_ready_fractions(buckets, profile.work, profile.ready_order),
        "gradient_bytes": sum(tensor_bytes),
        "model_bucket_bytes": [sum(tensor_bytes[i] for i in b) for b in buckets],
        "ddp_bucket_bytes": _ddp_bucket_bytes(ddp),
    }


def measure_overlap(
    *, cfg: str, imgsz: int, batch: int, iters: int, world_size: int = 2, emulate_device_ms: float = 0.0
) -> OverlapMeasurement:
    """Spawns `world_size` Gloo processes on this machine and returns rank 0's measurement."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "overlap.json")
        mp.spawn(
            _worker,
            args=(world_size, _free_port(), cfg, imgsz, batch, iters, out_path, emulate_device_ms),
            nprocs=world_size,
            join=True,
        )
        raw = json.loads(Path(out_path).read_text())
    return summarise(
        raw,
        cfg=cfg,
        imgsz=imgsz,
        batch=batch,
        iters=iters,
        world_size=world_size,
        emulate_device_ms=emulate_device_ms,
    )


def contention_estimate(model_exposed: float, no_overlap: float, host_compute_share: float) -> float:
    """First-order exposed communication when the ranks' communication only progresses while their cores
    are idle: the part of the backward the host computes itself (share h) hides nothing, the rest hides as
    the model says, so exposed ≈ model + h × (no overlap − model). h = 0 is the model (an accelerator's
    backward), h = 1 no overlap at all (a CPU backward on cores shared with the communication)."""
    return model_exposed + host_compute_share * (no_overlap - model_exposed)


def summarise(
    raw: dict,
    *,
    cfg: str,
    imgsz: int,
    batch: int,
    iters: int,
    world_size: int,
    emulate_device_ms: float = 0.0,
) -> OverlapMeasurement:
    """Turns rank 0's raw timings (seconds; lists of (forward, backward) per kind of step) into the
    comparison."""
    steps = {kind: [f + b for f, b in raw[kind]] for kind in STEP_KINDS}
    mean_s = {kind: statistics.mean(times) for kind, times in steps.items()}
    differences = [s - n for s, n in zip(steps["sync"], steps["sync_local"], strict=True)]
    spread = statistics.stdev(differences) if len(differences) > 1 else 0.0
    noise_s = 2 * spread / math.sqrt(len(differences))
    backward_s = statistics.mean(b for _, b in raw["sync_local"])
    bucket_s = raw["bucket_s"]
    predicted = simulate_overlap([r * backward_s for r in raw["ready"]], bucket_s, backward_s)
    host_share = (
        min(max(backward_s - emulate_device_ms / 1e3, 0.0) / backward_s, 1.0) if backward_s > 0 else 1.0
    )
    return OverlapMeasurement(
        cfg=cfg,
        imgsz=imgsz,
        batch_per_rank=batch,
        world_size=world_size,
        iters=iters,
        threads_per_rank=1,
        emulate_device_ms=emulate_device_ms,
        buckets=len(bucket_s),
        gradient_mb=raw["gradient_bytes"] / 1e6,
        model_bucket_bytes=raw["model_bucket_bytes"],
        ddp_bucket_bytes=raw["ddp_bucket_bytes"],
        forward_ms=statistics.mean(f for f, _ in raw["sync_local"]) * 1e3,
        backward_ms=backward_s * 1e3,
        step_no_sync_ms=mean_s["no_sync"] * 1e3,
        step_sync_local_ms=mean_s["sync_local"] * 1e3,
        step_sync_ms=mean_s["sync"] * 1e3,
        bucket_allreduce_ms=sum(bucket_s) * 1e3,
        measured_exposed_ms=statistics.mean(differences) * 1e3,
        noise_ms=noise_s * 1e3,
        ddp_overhead_ms=(mean_s["sync_local"] - mean_s["no_sync"]) * 1e3,
        predicted_exposed_ms=predicted.exposed_s * 1e3,
        predicted_if_no_overlap_ms=predicted.comm_s * 1e3,
        host_compute_share=host_share,
        predicted_with_contention_ms=contention_estimate(predicted.exposed_s, predicted.comm_s, host_share)
        * 1e3,
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.overlap ARGS`: measure, print the comparison, optionally write it as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.overlap", description=__doc__.splitlines()[0])
    parser.add_argument("--cfg", default="yolov5s.yaml")
    parser.add_argument("--imgsz", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2, help="images per rank")
    parser.add_argument("--iters", type=int, default=8, help="steps of each kind")
    parser.add_argument(
        "--emulate-device-ms",
        type=float,
        default=0.0,
        help="emulate an accelerator: each step's backward also waits this long on device "
        "kernels (sleeping, cores free for Gloo); 0 = plain CPU compute",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the measurement here")
    args = parser.parse_args(argv)
    result = measure_overlap(
        cfg=args.cfg,
        imgsz=args.imgsz,
        batch=args.batch,
        iters=args.iters,
        emulate_device_ms=args.emulate_device_ms,
    )
    print(result.summary())
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**dataclasses.asdict(result), "agrees": result.agrees}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
