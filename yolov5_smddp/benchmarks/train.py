"""`yolov5-smddp bench train`: training-step throughput for every combination of batch per GPU, AMP mode
and memory format: samples/s, the step-time split (data wait, forward+backward, optimizer), peak device
memory and model FLOP utilisation. One process, one device; communication is not part of this benchmark
(single process: `comm_ms` is null; see `bench scaling --measure-overlap`).

Timing: device phases with CUDA events (read after one synchronize at the end), throughput from the
wall clock between two synchronizes around the measured steps; data wait is the host time spent getting
the next batch. `--loader device` cycles through a few batches already on the device (the GPU alone);
`--loader real` runs the full pipeline (dataset, mosaic, DataLoader workers) in the loop.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import platform
import resource
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from yolov5_smddp.benchmarks.mfu import model_flop_utilisation, peak_tflops, training_flops_per_sample
from yolov5_smddp.benchmarks.timing import PhaseClock
from yolov5_smddp.config.hyp import Hyp
from yolov5_smddp.config.train_config import TrainConfig
from yolov5_smddp.errors import ConfigError

log = logging.getLogger(__name__)

AMP_MODES = ("off", "bf16", "fp16")
SWITCH = {"on": True, "off": False}
DEFAULT_NC = 80


@dataclass(frozen=True, kw_only=True, order=True)
class Combination:
    """One measured setting."""

    batch: int
    amp: str
    channels_last: bool


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """Measurements of one combination; times are means per step in milliseconds."""

    batch: int
    amp: str
    channels_last: bool
    samples_per_s_per_gpu: float
    samples_per_s_total: float  # one process: equal to the per-GPU figure
    step_ms: float  # wall clock
    data_wait_ms: float  # host time to get the next batch
    forward_backward_ms: float  # device time: copy + uint8→float + forward + loss + backward
    optimizer_ms: float  # device time: unscale, clip, step, zero_grad, EMA update
    comm_ms: float | None  # not measurable in one process
    device_busy: float  # (forward_backward + optimizer) / step: below 1 = the device waited
    peak_memory_mb: float
    achieved_tflops: float
    mfu: float | None  # None without a known peak (CPU without --peak-tflops)
    host_ms: float  # host time spent issuing a step (micro_step + optimizer_step calls); = step on CPU
    ops_per_step: int | None  # operators one more step dispatches (bench.opcount); None with --compile
    first_step_ms: float  # the first warmup step alone (with --compile: compiling included)


def combinations(
    batches: Sequence[int], amps: Sequence[str], channels_last: Sequence[bool]
) -> list[Combination]:
    """Every (batch, amp, channels_last), in the order given (batch outermost)."""
    return [
        Combination(batch=b, amp=a, channels_last=c)
        for b, a, c in itertools.product(batches, amps, channels_last)
    ]


def summarise(
    combo: Combination,
    *,
    iters: int,
    wall_s: float,
    data_wait_s: float,
    forward_backward_s: float,
    optimizer_s: float,
    peak_memory_mb: float,
    flops_per_sample: float,
    peak: float | None,
    host_s: float,
    ops_per_step: int | None,
    first_step_s: float = 0.0,
) -> StepResult:
    """Totals over `iters` measured steps → per-step means, throughput, utilisation."""
    samples_per_s = combo.batch * iters / wall_s
    step_s = wall_s / iters
    return StepResult(
        batch=combo.batch,
        amp=combo.amp,
        channels_last=combo.channels_last,
        samples_per_s_per_gpu=samples_per_s,
        samples_per_s_total=samples_per_s,
        step_ms=step_s * 1e3,
        data_wait_ms=data_wait_s / iters * 1e3,
        forward_backward_ms=forward_backward_s / iters * 1e3,
        optimizer_ms=optimizer_s / iters * 1e3,
        comm_ms=None,
        device_busy=min((forward_backward_s + optimizer_s) / wall_s, 1.0),
        peak_memory_mb=peak_memory_mb,
        achieved_tflops=flops_per_sample * samples_per_s / 1e12,
        mfu=model_flop_utilisation(flops_per_sample, samples_per_s, peak),
        host_ms=host_s / iters * 1e3,
        ops_per_step=ops_per_step,
        first_step_ms=first_step_s * 1e3,
    )


def _list_of(convert: Callable[[str], object], what: str) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            values = [convert(v.strip()) for v in text.split(",") if v.strip()]
        except (KeyError, ValueError) as exc:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") from exc
        if not values:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}")
        return values

    return parse


def _amp(text: str) -> str:
    if text not in AMP_MODES:
        raise ValueError(text)
    return text


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cfg", default="yolov5s.yaml", help="model config name or YAML path")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument(
        "--batch-per-gpu", type=_list_of(_positive, "batch sizes"), default=[16, 32, 48], help="e.g. 16,32,48"
    )
    parser.add_argument("--amp", type=_list_of(_amp, "of off, bf16, fp16"), default=["bf16", "fp16"])
    parser.add_argument(
        "--channels-last",
        type=_list_of(SWITCH.__getitem__, "on/off"),
        default=[True, False],
        help="on, off or on,off",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model as `train --compile` does (reduce-overhead: CUDA graphs on CUDA; "
        "compiles in warmup, reported as first_step_ms)",
    )
    parser.add_argument("--iters", type=_positive, default=20, help="measured steps per combination")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured steps first (>= 1 with --compile)")
    parser.add_argument("--data", default="synthetic", help="'synthetic' or a data.yaml")
    parser.add_argument(
        "--loader",
        choices=("device", "real"),
        default="device",
        help="device: pre-staged uint8 batches on the device; real: the full data pipeline",
    )
    parser.add_argument(
        "--workers", type=int, default=8, help="DataLoader workers (--loader real / --data PATH)"
    )
    parser.add_argument(
        "--color-aug",
        choices=("auto", "workers", "device"),
        default="auto",
        help="HSV jitter and flips as in training (`train --color-aug`): auto = on the device batch on "
        "CUDA (timed in the step), in the loader workers on CPU",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="device peak for MFU (default: looked up by GPU name; none on CPU)",
    )
    parser.add_argument("--hyp", default="scratch-low", help="loss gains and augmentation")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")


def _check(args: argparse.Namespace, cuda_available: bool) -> str:
    if args.imgsz % 32 or args.imgsz < 32:
        raise ConfigError(f"--imgsz must be a positive multiple of 32 (the largest stride), got {args.imgsz}")
    if args.warmup < 0 or (args.compile and args.warmup < 1):
        raise ConfigError(f"--warmup must be >= 0 (>= 1 with --compile), got {args.warmup}")
    device = args.device or ("cuda" if cuda_available else "cpu")
    if device == "cuda" and not cuda_available:
        raise ConfigError("--device cuda: torch sees no CUDA device here")
    if args.data != "synthetic" and not Path(args.data).is_file():
        raise ConfigError(f"--data {args.data!r}: not 'synthetic' and no such data.yaml")
    return device


def _peak_memory_mb(device_type: str) -> float:
    import torch

    if device_type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux; process-wide peak


def _batches(args, combo: Combination, device, hyp: Hyp, scratch: Path) -> tuple[Iterator, int]:
    """(endless batches, number of classes) for one combination."""
    from yolov5_smddp.benchmarks import inputs
    from yolov5_smddp.data.color import runs_on_device

    color_on_device = runs_on_device(args.color_aug, device.type)
    if args.loader == "device" and args.data == "synthetic":
        staged = inputs.staged_synthetic(
            combo.batch, args.imgsz, DEFAULT_NC, device, hyp=hyp if color_on_device else None
        )
        return itertools.cycle(staged), DEFAULT_NC
    yaml_path = inputs.dataset_yaml(args.data, scratch, args.imgsz, combo.batch)
    batches, nc, workers = inputs.pipeline_batches(
        yaml_path,
        imgsz=args.imgsz,
        batch=combo.batch,
        workers=args.workers if args.loader == "real" else 0,
        hyp=hyp,
        cache_dir=scratch / "label-cache",
        local_gpus=1,
        color_on_device=color_on_device,
    )
    log.info("data: %s, %d DataLoader workers", yaml_path, workers)
    if args.loader == "device":
        return itertools.cycle(inputs.stage(batches, device)), nc
    return batches, nc


def bench_training_stack(model, hyp: Hyp, *, nc: int, imgsz: int, batch: int, amp):
    """The trainer's stack (`optim_recipe.build_training_stack`) for one GPU at `batch` with the training
    defaults (optimizer, label smoothing)."""
    # imported here like torch in this module: `yolov5-smddp -h` builds every command's parser without torch
    from yolov5_smddp.train.optim_recipe import build_training_stack

    defaults = TrainConfig()
    return build_training_stack(
        model,
        hyp,
        nc=nc,
        imgsz=imgsz,
        global_batch=batch,
        amp=amp,
        optimizer=defaults.optimizer,
        label_smoothing=defaults.label_smoothing,
    )


def measure(
    args,
    combo: Combination,
    device,
    hyp: Hyp,
    scratch: Path,
    flops_for: Callable[[int], float],
    peak: float | None,
) -> StepResult:
    """Builds a fresh model, EMA and optimizer for `combo` exactly as the trainer does, warms up, then
    times `args.iters` steps of the engine's own TrainStep (micro_step + optimizer_step: AMP, gradient
    clipping, the non-finite guard and the EMA update included)."""
    import torch

    from yolov5_smddp.benchmarks.opcount import count_operators
    from yolov5_smddp.models.yolo import build_model
    from yolov5_smddp.train.engine import TrainStep, compile_plan, resolve_amp

    batches, nc = _batches(args, combo, device, hyp, scratch)
    torch.manual_seed(0)
    model = build_model(args.cfg, nc=nc).to(device).train()
    if combo.channels_last:
        model.to(memory_format=torch.channels_last)
    amp = resolve_amp(
        combo.amp, device.type, torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    )
    stack = bench_training_stack(model, hyp, nc=nc, imgsz=args.imgsz, batch=combo.batch, amp=amp)
    net = model
    if args.compile:
        plan = compile_plan(device.type, rect=False, multi_scale=False)
        log.info("%s; compiling in the first warmup step", plan.reason)
        net = torch.compile(model, mode=plan.mode)
    step = TrainStep(
        net,
        stack.criterion,
        stack.optimizer,
        stack.scaler,
        stack.ema,
        amp,
        device,
        channels_last=combo.channels_last,
    )
    clock = PhaseClock(device.type)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    first_step = 0.0
    for i in range(args.warmup):
        images, targets, color = next(batches)
        started = time.perf_counter()
        step.micro_step(images, targets, sync=True, color=color)
        step.optimizer_step()
        if i == 0:
            synchronize()
            first_step = time.perf_counter() - started
    synchronize()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    data_wait = host = 0.0
    start = time.perf_counter()
    for _ in range(args.iters):
        fetch = time.perf_counter()
        images, targets, color = next(batches)
        issue = time.perf_counter()
        data_wait += issue - fetch
        clock.start()
        step.micro_step(images, targets, sync=True, color=color)
        clock.after_backward()
        step.optimizer_step()
        clock.after_optimizer()
        host += time.perf_counter() - issue
    synchronize()
    wall = time.perf_counter() - start
    totals = clock.totals()
    ops = None  # compiled code under a dispatch mode would run uncompiled (or recompile): not counted
    if not args.compile:
        images, targets, color = next(batches)
        ops = count_operators(
            lambda: (step.micro_step(images, targets, sync=True, color=color), step.optimizer_step())
        ).total
    return summarise(
        combo,
        iters=args.iters,
        wall_s=wall,
        data_wait_s=data_wait,
        forward_backward_s=totals.forward_backward_s,
        optimizer_s=totals.optimizer_s,
        peak_memory_mb=_peak_memory_mb(device.type),
        flops_per_sample=flops_for(nc),
        peak=peak,
        host_s=host,
        ops_per_step=ops,
        first_step_s=first_step,
    )


def format_table(results: Sequence[StepResult], failures: Sequence[tuple[Combination, str]] = ()) -> str:
    header = (
        f"{'batch':>5} {'amp':>4} {'ch_last':>7} {'img/s/GPU':>10} {'step ms':>9} {'data ms':>8} "
        f"{'fwd+bwd':>8} {'optim':>7} {'busy':>6} {'mem MB':>8} {'TFLOP/s':>8} {'MFU':>6} {'host ms':>8} {'ops':>6}"
    )
    rows = [header]
    for r in results:
        mfu = "-" if r.mfu is None else f"{r.mfu:.1%}"
        rows.append(
            f"{r.batch:>5} {r.amp:>4} {('on' if r.channels_last else 'off'):>7} {r.samples_per_s_per_gpu:>10.2f} "
            f"{r.step_ms:>9.1f} {r.data_wait_ms:>8.2f} {r.forward_backward_ms:>8.1f} {r.optimizer_ms:>7.1f} "
            f"{r.device_busy:>6.1%} {r.peak_memory_mb:>8.0f} {r.achieved_tflops:>8.4g} {mfu:>6} "
            f"{r.host_ms:>8.1f} {'-' if r.ops_per_step is None else r.ops_per_step:>6}"
        )
    for c, error in failures:
        rows.append(f"{c.batch:>5} {c.amp:>4} {('on' if c.channels_last else 'off'):>7}  failed: {error}")
    return "\n".join(rows)


def run(args: argparse.Namespace) -> int:
    import torch

    from yolov5_smddp.config.hyp import load_hyp
    from yolov5_smddp.data.color import runs_on_device
    from yolov5_smddp.models.yolo import build_model
    from yolov5_smddp.train.engine import resolve_amp

    device = torch.device(_check(args, torch.cuda.is_available()))
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed shapes: let cuDNN pick the fastest kernels
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = f"cpu {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"
    peak = peak_tflops(device_name, args.peak_tflops) if device.type == "cuda" or args.peak_tflops else None
    for mode in args.amp:  # refuse impossible modes before any measurement (fp16 needs CUDA)
        resolve_amp(
            mode, device.type, torch.cuda.get_device_capability(device) if device.type == "cuda" else None
        )
    hyp = Hyp.from_dict(load_hyp(args.hyp))  # the file boundary: typed from here on
    flops_cache: dict[int, tuple[float, float]] = {}

    def flops_for(nc: int) -> float:
        if nc not in flops_cache:
            flops_cache[nc] = training_flops_per_sample(lambda: build_model(args.cfg, nc=nc), args.imgsz)
        return flops_cache[nc][0]

    results: list[StepResult] = []
    failures: list[tuple[Combination, str]] = []

    def report() -> dict:
        train_flops, forward_flops = next(iter(flops_cache.values()), (0.0, 0.0))  # one dataset: one nc
        return {
            "benchmark": "train",
            "cfg": args.cfg,
            "imgsz": args.imgsz,
            "device": device_name,
            "torch": torch.__version__,
            "loader": args.loader,
            "data": args.data,
            "color_on_device": runs_on_device(args.color_aug, device.type),
            "iters": args.iters,
            "warmup": args.warmup,
            "compile": args.compile,
            "train_flops_per_sample": train_flops,
            "forward_flops_per_sample": forward_flops,
            "peak_tflops": peak,
            "peak_memory_source": "torch.cuda.max_memory_allocated"
            if device.type == "cuda"
            else "process max RSS (cumulative over combinations)",
            "results": [asdict(r) for r in results],
            "failures": [{**asdict(c), "error": error} for c, error in failures],
        }

    def write(final: bool) -> None:  # after every combination, so a run cut short keeps what it measured
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report(), indent=2))
            if final:
                print(f"wrote {args.json}")

    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        for combo in combinations(args.batch_per_gpu, args.amp, args.channels_last):
            try:
                results.append(measure(args, combo, device, hyp, Path(tmp), flops_for, peak))
            except torch.cuda.OutOfMemoryError:
                failures.append((combo, "out of device memory"))
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            log.info("%s done", combo)
            write(final=False)
    summary = report()
    print(
        f"{args.cfg} {args.imgsz}px on {device_name}, loader {args.loader} ({args.data}), "
        f"{args.iters} iters after {args.warmup} warmup{', compiled' if args.compile else ''}; "
        f"{summary['train_flops_per_sample'] / 1e9:.1f} GFLOPs per training sample "
        f"({summary['forward_flops_per_sample'] / 1e9:.1f} forward), peak {peak if peak is not None else '-'} TFLOP/s"
    )
    print(format_table(results, failures))
    write(final=True)
    return 0
