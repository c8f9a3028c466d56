"""The compute: one training step (micro-steps with gradient accumulation, then an optimizer step),
one training epoch, and evaluation. Everything arrives as explicit arguments; nothing here reads the
environment, the command line or the file system.

Precision is decided once (`AmpPolicy`) so the loop has no precision branches. Host syncs happen only
on logging steps (`log_every`): losses, the non-finite counter and the stop flag stay on the device
between them.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from yolov5_smddp.config.hyp import Hyp
from yolov5_smddp.data.color import apply_color
from yolov5_smddp.detection.boxes import scale_boxes, xywh_to_xyxy
from yolov5_smddp.detection.metrics import (
    DetectionMetrics,
    MetricAccumulator,
    metrics_from_state,
    pack_state,
    unpack_states,
)
from yolov5_smddp.detection.postprocess import non_max_suppression
from yolov5_smddp.distributed import collectives, process_group
from yolov5_smddp.errors import ConfigError, UserError
from yolov5_smddp.models.wrappers import unwrap
from yolov5_smddp.telemetry import Throughput, emit, metric_line
from yolov5_smddp.train.ema import ModelEMA

GRAD_CLIP_NORM = 10.0
NOMINAL_BATCH = 64
"""Images per optimizer step the recipe's hyperparameters are tuned for: smaller global batches
accumulate gradients up to about this many, and weight decay scales with the images per step."""


class NonFiniteLossError(UserError):
    """Training produced non-finite losses or gradients for too many consecutive optimizer steps."""


# ------------------------------------------------------------------------------------------- precision


@dataclass(frozen=True)
class AmpPolicy:
    """mode "fp16" (autocast + GradScaler), "bf16" (autocast, no scaler) or "off"."""

    mode: str
    device_type: str
    reason: str = field(default="", compare=False)
    """Why this mode (one clause for the log), from resolve_amp."""

    @property
    def dtype(self) -> torch.dtype | None:
        return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(self.mode)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def make_scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device_type, enabled=self.mode == "fp16")


BF16_MIN_CAPABILITY = (8, 0)
"""bf16 autocast only from compute capability 8.0 (A100, A10G, L4, H100): below it (V100, T4)
torch.cuda.is_bf16_supported() is true since torch 2.4 by emulation, without fast cuDNN convolutions."""


def resolve_amp(requested: str, device_type: str, capability: tuple[int, int] | None) -> AmpPolicy:
    """The precision policy (pure). `capability` is the CUDA device's compute capability (major, minor),
    None on the CPU. auto → bf16 at capability >= 8.0, fp16 below, off on the CPU. fp16 needs CUDA; bf16
    on a CUDA device below 8.0 is refused (no fast kernels there: fp16 is the mode for it)."""
    on_cuda = device_type == "cuda"
    bf16_fast = on_cuda and capability is not None and tuple(capability) >= BF16_MIN_CAPABILITY
    where = f"compute capability {capability[0]}.{capability[1]}" if on_cuda and capability else device_type
    if requested == "auto":
        if not on_cuda:
            return AmpPolicy("off", device_type, "auto: no CUDA device")
        mode = "bf16" if bf16_fast else "fp16"
        return AmpPolicy(mode, device_type, f"auto: {where} {'>=' if bf16_fast else '<'} 8.0")
    if requested == "fp16" and not on_cuda:
        raise ConfigError("--amp fp16 needs a CUDA device; on CPU use --amp bf16 or --amp off")
    if requested == "bf16" and on_cuda and not bf16_fast:
        raise ConfigError(
            f"--amp bf16: this GPU ({where}) has no fast bfloat16 (it needs compute capability 8.0 or "
            "newer); use --amp fp16 or auto"
        )
    return AmpPolicy(requested, device_type, f"--amp {requested}")


@dataclass(frozen=True)
class CompilePlan:
    """How `--compile` wraps the model: torch.compile's `mode` and the one line that says why."""

    mode: str
    reason: str


def compile_plan(device_type: str, *, rect: bool, multi_scale: bool) -> CompilePlan:
    """reduce-overhead (the forward and backward replayed as CUDA graphs: one launch each instead of
    one per kernel) on CUDA when every batch has one shape (mosaic at a fixed imgsz); the default mode
    otherwise: graphs recorded per shape would be recaptured for --rect's and --multi-scale's shapes."""
    if device_type != "cuda":
        return CompilePlan("default", "torch.compile mode default: CUDA graphs need a CUDA device")
    changing = [name for name, on in (("--rect", rect), ("--multi-scale", multi_scale)) if on]
    if changing:
        verb = "change" if len(changing) > 1 else "changes"
        return CompilePlan(
            "default",
            f"torch.compile mode default, no CUDA graphs: {' and '.join(changing)} {verb} the batch shape",
        )
    return CompilePlan(
        "reduce-overhead", "torch.compile mode reduce-overhead: fixed batch shape, CUDA graphs"
    )


def prepare_images(
    imgs: torch.Tensor, device: torch.device, channels_last: bool | None, color: torch.Tensor | None = None
) -> torch.Tensor:
    """uint8 [B, 3, H, W] on the host → float [B, 3, H, W] in [0, 1] on `device` (converted there), in
    channels-last memory (`channels_last` True), NCHW memory (False: `--channels-last off`; the loader's
    batches are channels-last) or the memory format `imgs` has (None). The layout changes on the uint8
    batch (a quarter of the float copy). With `color` (float64 [B, 6], see data.color) imgs are BGR and
    get their HSV jitter and flips there."""
    x = imgs.to(device, non_blocking=True)
    if color is not None:
        x = apply_color(x, color)
    if channels_last is not None:
        x = x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    return x.float().div_(255.0)


# ------------------------------------------------------------------------------------------ train step


@dataclass
class TrainStep:
    """The state one rank needs to run micro-steps and optimizer steps.

    `model` may be DDP-wrapped; the loss is multiplied by `loss_multiplier` (the world size under DDP,
    cancelling DDP's gradient averaging so the update matches one process with the global batch).
    """

    model: nn.Module
    criterion: Callable[[list[torch.Tensor], torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    ema: ModelEMA | None
    amp: AmpPolicy
    device: torch.device
    loss_multiplier: float = 1.0
    channels_last: bool = False
    inject_nonfinite_step: int | None = None
    micro_steps: int = 0
    nonfinite_run: torch.Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.int64))
    keep_grads: bool = False
    """CUDA graphs (compile_settings): gradients allocated here, before the first micro-step, and zeroed in
    place after each optimizer step, so no backward takes a graph-owned buffer as `.grad`."""
    mark_steps: bool = False
    """CUDA graphs: torch.compiler.cudagraph_mark_step_begin() before each micro-step."""

    def __post_init__(self) -> None:
        self.nonfinite_run = self.nonfinite_run.to(self.device)
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        use_fused_kernels(self.optimizer)
        if self.keep_grads:
            for p in self._params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)

    def micro_step(
        self,
        imgs: torch.Tensor,
        targets: torch.Tensor,
        *,
        sync: bool,
        size: int | None = None,
        color: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Forward + backward of one batch; gradients are all-reduced only when `sync` (DDP no_sync
        otherwise). imgs uint8 [B, 3, H, W] (host or device); targets [n, 6]. `size` resizes the batch
        (multi-scale); `color` (the loader's, or None) is applied first. Returns the detached loss parts
        [3] (box, obj, cls), on the device."""
        x = prepare_images(imgs, self.device, self.channels_last, color)
        if size is not None and size != x.shape[-1]:
            scale = size / max(x.shape[-2:])
            new_hw = [max(32, math.ceil(d * scale / 32) * 32) for d in x.shape[-2:]]
            x = F.interpolate(x, size=new_hw, mode="bilinear", align_corners=False)
        no_sync = getattr(self.model, "no_sync", None)
        context = no_sync() if (no_sync is not None and not sync) else contextlib.nullcontext()
        if self.mark_steps:
            torch.compiler.cudagraph_mark_step_begin()
        with context:
            with self.amp.autocast():
                preds = self.model(x)
                loss, items = self.criterion(preds, targets.to(self.device, non_blocking=True))
            loss = loss.float() * self.loss_multiplier
            if self.inject_nonfinite_step is not None and self.micro_steps >= self.inject_nonfinite_step:
                loss, items = loss * float("nan"), items * float("nan")  # test hook: a diverged loss
            self.scaler.scale(loss).sum().backward()
        self.micro_steps += 1
        return items.detach()

    def optimizer_step(self) -> None:
        """Unscale (fp16) → clip the gradient norm at 10 → step → zero grads → EMA update, without a
        host sync and without a per-tensor loop: the norm is one foreach reduction, the update one fused
        kernel per parameter group, the EMA one foreach lerp.

        A non-finite gradient norm skips the update on the device: the fused step reads `found_inf`
        (GradScaler's for fp16, which also lowers the scale; else 1.0 when the norm is not finite) and
        then leaves parameters and optimizer state as they were. `nonfinite_run` counts consecutive
        non-finite steps on the device.
        """
        self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self._params, GRAD_CLIP_NORM, foreach=True)
        finite = torch.isfinite(norm)
        if not self.scaler.is_enabled():
            self.optimizer.found_inf = (~finite).float().reshape(1)  # read by the fused step
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=not self.keep_grads)
        if self.ema is not None:
            self.ema.update(self.model)
        self.nonfinite_run = torch.where(finite, torch.zeros_like(self.nonfinite_run), self.nonfinite_run + 1)


def use_fused_kernels(optimizer: torch.optim.Optimizer) -> None:
    """Switch every parameter group to the fused kernel (one kernel per group and device; it skips the
    update when `optimizer.found_inf` is non-zero, and GradScaler hands it found_inf without `.item()`)
    and give SGD zero momentum buffers where it has none yet.

    Also applied to an optimizer loaded from an older checkpoint (which recorded fused=None). Zero
    buffers give the same first update as the lazily created ones (buf = momentum * 0 + grad = grad) and
    keep a skipped first step from leaving uninitialised buffers behind (the fused SGD kernel allocates
    them with empty_like before it looks at found_inf).
    """
    for group in optimizer.param_groups:
        group["fused"], group["foreach"] = True, False
        if isinstance(optimizer, torch.optim.SGD) and group["momentum"] != 0:
            for p in group["params"]:
                state = optimizer.state[p]
                if state.get("momentum_buffer") is None:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


# ------------------------------------------------------------------------------------------ schedule


def lr_factor(epoch: int, epochs: int, lrf: float, cosine: bool) -> float:
    """The per-epoch learning-rate multiple: linear (1 - e/E)(1 - lrf) + lrf, or cosine from 1 to lrf."""
    if cosine:
        return ((1 - math.cos(epoch * math.pi / epochs)) / 2) * (lrf - 1) + 1
    return (1 - epoch / epochs) * (1.0 - lrf) + lrf


@dataclass(frozen=True)
class StepSettings:
    """What the optimizer uses at one iteration: lr per group name, momentum, gradient accumulation."""

    lrs: dict[str, float]
    momentum: float
    accumulate: int


def scheduled_epoch(epoch: int, *, warmup_iters: int, batches_per_epoch: int) -> int:
    """The epoch whose lr_factor sets the learning rate in `epoch` once warmup is over: the release's lag.

    The release's LambdaLR starts at last_epoch = start_epoch - 1 and steps at each epoch's end, so epoch
    e trains at lf(e - 1); only the epoch in which warmup ends keeps the lf(e) its interpolation reached
    (warmup's last iteration is iteration warmup_iters, in epoch warmup_iters // batches_per_epoch).
    """
    warmup_end_epoch = warmup_iters // max(batches_per_epoch, 1)
    return epoch if epoch <= warmup_end_epoch else epoch - 1


def accumulation(global_batch: int) -> int:
    """Micro-steps per optimizer step so that each step sees about the nominal batch of 64."""
    return max(round(NOMINAL_BATCH / global_batch), 1)


@dataclass(frozen=True)
class Schedule:
    """The run's schedule, the one object the epoch loop asks: `settings(iteration, epoch)` gives the
    learning rates, momentum and accumulation of a global iteration, a pure function of (iteration, epoch),
    so a resumed run trains with the same values as an uninterrupted one. `epochs` is the count the decay
    runs over (--epochs, or the time budget's plan: the Run builds a Schedule per epoch)."""

    hyp: Hyp
    epochs: int
    warmup_iters: int
    batches_per_epoch: int
    cosine: bool
    global_batch: int

    def settings(self, iteration: int, epoch: int) -> StepSettings:
        """After warmup a step accumulates `accumulation(global_batch)` micro-steps. During warmup
        (iteration < warmup_iters) values go linearly from (bias lr warmup_bias_lr, other lrs 0, momentum
        warmup_momentum, accumulate 1) to the epoch's scheduled values (lr0 * lr_factor(epoch), momentum,
        and the UNROUNDED 64 / global_batch: the accumulation is the interpolation rounded half to even, as
        the release's np.interp(...).round(), so with a batch that does not divide 64 it changes at the
        same iterations); afterwards they are lr0 * lr_factor(scheduled_epoch(...)): one epoch behind after
        the epoch where warmup ends, as the release's scheduler runs."""
        hyp, epochs, cosine = self.hyp, self.epochs, self.cosine
        if iteration >= self.warmup_iters:
            at = scheduled_epoch(
                epoch, warmup_iters=self.warmup_iters, batches_per_epoch=self.batches_per_epoch
            )
            lr = hyp.lr0 * lr_factor(at, epochs, hyp.lrf, cosine)
            lrs = {"bias": lr, "weight": lr, "norm": lr}
            return StepSettings(lrs, hyp.momentum, accumulation(self.global_batch))
        lr = hyp.lr0 * lr_factor(epoch, epochs, hyp.lrf, cosine)
        t = iteration / self.warmup_iters
        bias = hyp.warmup_bias_lr + t * (lr - hyp.warmup_bias_lr)
        other = t * lr
        momentum = hyp.warmup_momentum + t * (hyp.momentum - hyp.warmup_momentum)
        # np.interp's arithmetic (slope * offset + start), so that a value on a .5 rounds as the release's
        accumulate = max(
            1, round((NOMINAL_BATCH / self.global_batch - 1) / self.warmup_iters * iteration + 1)
        )
        return StepSettings({"bias": bias, "weight": other, "norm": other}, momentum, accumulate)


def apply_settings(optimizer: torch.optim.Optimizer, settings: StepSettings) -> None:
    for group in optimizer.param_groups:
        group["lr"] = settings.lrs[group["name"]]
        if "momentum" in group:
            group["momentum"] = settings.momentum
        elif "betas" in group:
            group["betas"] = (settings.momentum, group["betas"][1])


# ------------------------------------------------------------------------------------------ one epoch


@dataclass
class EpochResult:
    """Mean training losses (box, obj, cls) over the epoch, throughput, and whether it was cut short."""

    losses: list[float]
    throughput: dict[str, float]
    iterations: int
    last_optimizer_iteration: int
    stopped: bool


def train_one_epoch(
    step: TrainStep,
    loader: Iterable,
    *,
    epoch: int,
    first_iteration: int,
    last_optimizer_iteration: int,
    schedule: Schedule,
    log_every: int,
    max_nonfinite_steps: int,
    imgsz: int,
    multi_scale: bool,
    stop_requested: Callable[[], bool],
    main: bool,
    world_size: int,
) -> EpochResult:
    """Run one epoch of micro-steps; an optimizer step whenever `accumulate` micro-steps have passed.

    `first_iteration` is the global index of this epoch's first batch. The stop flag (SIGTERM) is agreed
    between ranks on logging steps; a stop ends the epoch after the current step.
    """
    step.model.train()
    loss_sum = torch.zeros(3, device=step.device)
    window = Throughput(world_size=world_size)
    epoch_meter = Throughput(world_size=world_size)
    iteration = first_iteration
    count = 0
    stopped = False
    loader_iter = iter(loader)
    pop_issue = getattr(loader, "pop_issue_seconds", None)
    while True:
        waited = time.perf_counter()
        try:
            imgs, targets, _paths, _shapes, color = next(loader_iter)
        except StopIteration:
            break
        waited = time.perf_counter() - waited
        if pop_issue is not None:  # --loader gpu: its device decode/augment is work, not a wait
            waited = max(waited - pop_issue(), 0.0)
        settings = schedule.settings(iteration, epoch)
        apply_settings(step.optimizer, settings)
        sync = iteration - last_optimizer_iteration >= settings.accumulate
        size = random.randrange(imgsz // 2, imgsz * 3 // 2 + 32, 32) if multi_scale else None
        items = step.micro_step(imgs, targets, sync=sync, size=size, color=color)
        if sync:
            step.optimizer_step()
            last_optimizer_iteration = iteration
        loss_sum += items
        count += 1
        window.add(imgs.shape[0], waited)
        epoch_meter.add(imgs.shape[0], waited)
        if count % log_every == 0 or count == 1:
            # the only host sync between epochs: losses, the non-finite counter and the stop flag
            flags = torch.stack(
                [step.nonfinite_run.float(), torch.tensor(float(stop_requested()), device=step.device)]
            )
            process_group.all_reduce_sum(flags)
            nonfinite, stop = flags.tolist()
            mean = (loss_sum / count).tolist()
            rate = window.summary()
            emit(
                metric_line(
                    epoch=epoch + 1,
                    step=count,
                    loss=sum(mean),
                    box_loss=mean[0],
                    obj_loss=mean[1],
                    cls_loss=mean[2],
                    lr=settings.lrs["weight"],
                    samples_per_sec=rate["samples_per_sec"],
                    data_wait=rate["data_wait"],
                ),
                main=main,
            )
            window.reset()
            if nonfinite >= max_nonfinite_steps * world_size:
                raise NonFiniteLossError(
                    f"the loss or its gradients were non-finite (NaN/inf) for {int(nonfinite // world_size)} "
                    f"consecutive optimizer steps (epoch {epoch + 1}, step {count}); stopping. Lower lr0 "
                    f"(--hyp-override lr0=...), check the labels, or try --amp off / bf16"
                )
            if stop:
                stopped = True
                break
        elif world_size == 1 and stop_requested():
            stopped = True
            break
        iteration += 1
    if stopped:
        iteration += 1
    final_nonfinite = int(step.nonfinite_run.item())
    if final_nonfinite >= max_nonfinite_steps:
        raise NonFiniteLossError(
            f"the loss or its gradients were non-finite (NaN/inf) for {final_nonfinite} consecutive optimizer "
            f"steps at the end of epoch {epoch + 1}; stopping. Lower lr0, check the labels, or try --amp off / bf16"
        )
    means = (loss_sum / max(count, 1)).tolist()
    return EpochResult(
        means, epoch_meter.summary(), iteration - first_iteration, last_optimizer_iteration, stopped
    )


# ------------------------------------------------------------------------------------------ evaluation


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable,
    *,
    device: torch.device,
    amp: AmpPolicy,
    conf_thres: float = 0.001,
    iou_thres: float = 0.6,
    max_det: int = 300,
    on_image: Callable[[str, torch.Tensor], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    gather: bool = False,
) -> DetectionMetrics | None:
    """Validate `model` (unwrapped; e.g. the EMA) on `loader` batches (imgs uint8, targets [n, 6], paths,
    shapes). Detections and ground truth are matched in ORIGINAL image pixels (detections clipped to the
    image, as COCO-format results are), so the numbers equal pycocotools' on the same detections.
    `on_image(path, detections [n, 6] (x1, y1, x2, y2 original pixels, score, class))` sees every image.
    Returns None when `should_stop()` turns true (SIGTERM: the checkpoint matters more than the numbers).

    Sharded (`gather=True` in a process group): EVERY rank calls this with its own shard of whole batches
    (`data.loader.build_val_loader`); the per-image match results are gathered (all_gather, in rank order)
    and rank 0 returns the metrics — identical to one process validating everything — while the other
    ranks return None. A stop on any rank returns None on all of them (after one agreed all_reduce, so
    no rank is left waiting in the gather).
    """
    model = unwrap(model)
    was_training = model.training
    model.eval()
    acc = MetricAccumulator()
    stopped = False
    for imgs, targets, paths, shapes, _color in loader:
        if should_stop is not None and should_stop():
            stopped = True
            break
        x = prepare_images(imgs, device, channels_last=None)  # the loader's layout
        with amp.autocast():
            pred, _raw = model(x)
        height, width = x.shape[-2:]
        detections = non_max_suppression(
            pred.float(), conf_thres, iou_thres, multi_label=True, max_det=max_det
        )
        targets = targets.to(device)
        scale = torch.tensor([width, height, width, height], device=device, dtype=torch.float32)
        for i, dets in enumerate(detections):
            mine = targets[targets[:, 0] == i]
            original_hw, ratio_pad = shapes[i]
            gt_boxes = scale_boxes(
                xywh_to_xyxy(mine[:, 2:6]) * scale, (height, width), original_hw, ratio_pad
            )
            dets = torch.cat(
                [scale_boxes(dets[:, :4], (height, width), original_hw, ratio_pad), dets[:, 4:]], 1
            )
            crowd = mine[:, 1] < 0  # COCO crowd regions, class -1 - cls (data.dataset)
            acc.update(dets, gt_boxes[~crowd], mine[~crowd, 1], gt_boxes[crowd], -1 - mine[crowd, 1])
            if on_image is not None:
                on_image(paths[i], dets)
    model.train(was_training)
    if gather and process_group.is_initialized():
        return _gathered_metrics(acc, stopped, device)
    return None if stopped else acc.compute()


def _gathered_metrics(acc: MetricAccumulator, stopped: bool, device: torch.device) -> DetectionMetrics | None:
    """Sharded validation's end: agree on a stop and count the images (one all_reduce), gather every
    rank's match results in rank order (all_gather), compute the metrics on rank 0."""
    totals = torch.tensor([float(stopped), float(acc.num_images)], dtype=torch.float32, device=device)
    stop_votes, num_images = process_group.all_reduce_sum(totals).tolist()
    if stop_votes > 0:
        return None
    predictions, targets = pack_state(acc.state())
    all_predictions = collectives.all_gather_rows(predictions)
    all_targets = collectives.all_gather_rows(targets)
    if not process_group.is_main():
        return None
    return metrics_from_state(unpack_states(all_predictions, all_targets), int(num_images))
