"""The training run, top to bottom: resumable checkpoint → decide (decisions.py: hyperparameters, batch
split, backend, precision) → data (data_wiring.py; scanned on every rank before the process group
exists, so no rank waits in a collective while another scans) → process group → the Run (model, the
optimiser recipe of optim_recipe.py, SyncBatchNorm, loaders) → resume (resumption.py) → epochs (train,
validate the EMA — every rank its shard, metrics on rank 0 — checkpoint, early stop agreed by
broadcast) → best.pt re-validated (its numbers are `final`) → the model folder on rank 0 (reporting.py,
which lists the outputs). Checkpoints: `checkpoint_dir/{last,best}.pt` (see checkpoint.py).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import os
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from yolov5_smddp import plots
from yolov5_smddp.config.batch import BatchPlan
from yolov5_smddp.config.train_config import TrainConfig
from yolov5_smddp.detection.metrics import DetectionMetrics
from yolov5_smddp.distributed import collectives, process_group
from yolov5_smddp.errors import EXIT_INTERRUPTED
from yolov5_smddp.files import claimed_dir
from yolov5_smddp.files.atomic import atomic_copy
from yolov5_smddp.models.autoanchor import AnchorCheck, autoanchor
from yolov5_smddp.models.initial import initial_model
from yolov5_smddp.models.wrappers import unwrap
from yolov5_smddp.telemetry import emit, metric_line
from yolov5_smddp.train import checkpoint, data_wiring, mlflow_log, out_of_memory, reporting
from yolov5_smddp.train.autobatch import AUTO_BATCH, agree_smallest, size_batch
from yolov5_smddp.train.budget import TimeBudget, counting_clock
from yolov5_smddp.train.compile_settings import compile_settings
from yolov5_smddp.train.data_wiring import DataBundle
from yolov5_smddp.train.engine import (
    AmpPolicy,
    EpochResult,
    TrainStep,
    accumulation,
    compile_plan,
    evaluate,
    train_one_epoch,
)
from yolov5_smddp.train.optim_recipe import (
    build_training_stack,
    check_freeze,
    freeze_layers,
    loss_multiplier,
    wrap_ddp,
)
from yolov5_smddp.train.resolve import ResolvedRun
from yolov5_smddp.train.resumption import resume
from yolov5_smddp.train.run_state import MIN_WARMUP_ITERS, EpochsOutcome, PlannedEpochs, Run
from yolov5_smddp.train.runtime import RuntimeSettings, apply_runtime, decide_runtime
from yolov5_smddp.train.stop_signal import StopOnSigterm

log = logging.getLogger("yolov5_smddp")


# ------------------------------------------------------------------------------------------ the run


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_detection_model(
    config: TrainConfig,
    bundle: DataBundle,
    device: torch.device,
    *,
    anchor_t: float,
    resume_cfg: dict | None = None,
) -> nn.Module:
    """The model for the dataset's classes: a resumed checkpoint's `resume_cfg`, else --cfg and --weights
    (`initial_model`); on a fresh run AutoAnchor checks/fits the anchors (rank 0 computes, every rank gets
    them) before the EMA copies them; frozen layers, on `device`."""
    main = process_group.is_main()
    initial = initial_model(
        config.cfg,
        config.weights,
        bundle.nc,
        bundle.names,
        allow_partial=config.allow_partial_transfer,
        resume_cfg=resume_cfg,
    )
    model = initial.model
    if main:
        log.info(initial.line)
    if resume_cfg is None and not config.noautoanchor:
        autoanchor(
            model,
            bundle.train_index.shapes,
            bundle.train_index.labels,
            imgsz=config.imgsz,
            anchor_t=anchor_t,
            seed=config.seed,
            main=main,
            share=functools.partial(share_anchor_check, anchors=model.detect.anchors.numel() // 2),
        )
    check_freeze(config.freeze, len(model.model), str(model.cfg.get("name", config.cfg)))
    freeze_layers(model, config.freeze)
    model.to(device)
    if config.channels_last:
        model.to(memory_format=torch.channels_last)
    return model


def with_sync_batchnorm(
    model: nn.Module, config: TrainConfig, info: process_group.DistInfo, device: torch.device
) -> nn.Module:
    """--sync-bn on several CUDA ranks: the model with SyncBatchNorm layers (sharing the parameters and
    running statistics of `model`, so its EMA and optimizer, built before, still hold them); else `model`."""
    if config.sync_bn and info.world_size > 1 and device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


def build_step(run: Run) -> TrainStep:
    """DDP and torch.compile around the model, and the engine's step."""
    config, info = run.config, run.info
    net: nn.Module = run.model
    if info.distributed:
        net = wrap_ddp(run.model, run.device)
    settings = compile_settings(compile=False, mode="", rect=False, multi_scale=False, accumulate=1)
    if config.compile:
        plan = compile_plan(run.device.type, rect=config.rect, multi_scale=config.multi_scale)
        settings = compile_settings(
            compile=True,
            mode=plan.mode,
            rect=config.rect,
            multi_scale=config.multi_scale,
            accumulate=run.stack.accumulate,
        )
        if run.main:
            log.info(
                "%s; %s; compiling during the first steps (minutes for yolov5x; each shape once)",
                plan.reason,
                settings.reason,
            )
        net = torch.compile(net, mode=plan.mode)
    return TrainStep(
        net,
        run.stack.criterion,
        run.stack.optimizer,
        run.stack.scaler,
        run.stack.ema,
        run.amp,
        run.device,
        loss_multiplier=loss_multiplier(info),
        channels_last=config.channels_last,
        inject_nonfinite_step=config.inject_nonfinite_step,
        keep_grads=settings.keep_grads,
        mark_steps=settings.mark_steps,
    )


def end_epoch(
    run: Run,
    state: checkpoint.RunState,
    result: EpochResult,
    metrics: DetectionMetrics | None,
    seconds: float,
    board,
    recorder: plots.ValidationPlots | None = None,
    tracking: mlflow_log.MlflowRun | None = None,
) -> None:
    """Rank 0 after epoch `state.epoch` (1-based: the epoch just finished): fitness and early-stop count,
    the results row, the metric line, the checkpoint (best too when it improved), then the epoch's
    reports (results.csv, plots, TensorBoard, MLflow: reporting.write_epoch_outputs)."""
    improved = metrics is not None and metrics.fitness > state.best_fitness
    if improved:
        state.best_fitness, state.stale_epochs = metrics.fitness, 0
    elif metrics is not None:
        state.stale_epochs += 1
    lrs = {g["name"]: g["lr"] for g in run.stack.optimizer.param_groups}
    row = reporting.epoch_row(state.epoch, result, metrics, lrs, seconds)
    state.history.append(row)
    reporting.emit_epoch_line(row, result, epochs=run.epochs, device=run.device)
    last = run.save(state, best=improved)
    if run.config.save_period > 0 and state.epoch % run.config.save_period == 0:
        atomic_copy(last, run.dirs.checkpoint_dir / f"epoch{state.epoch}.pt")
    reporting.write_epoch_outputs(
        run.dirs.output_dir,
        state.history,
        list(unwrap(run.model).names),
        noplots=run.config.noplots,
        recorder=recorder if metrics is not None else None,
        board=board,
        tracking=tracking,
    )


def run_epochs(
    run: Run,
    state: checkpoint.RunState,
    step: TrainStep,
    train_loader,
    val_loader,
    bundle: DataBundle,
    stop: StopOnSigterm,
    tracking: mlflow_log.MlflowRun | None = None,
) -> EpochsOutcome:
    """The epochs from `state.epoch`: train, (with --time) plan the epochs that fit, validate with the EMA
    (every rank its shard), end the epoch on rank 0, stop early or on SIGTERM (rank 0 decides for every
    rank); then best.pt re-validated. `bundle` gives the plots the class names and the val labels. `stop`:
    the job's SIGTERM flag; after the last epoch it cuts the final validation of best.pt short (the last
    epoch's metrics stand), so the final outputs are written in time."""
    outcome = EpochsOutcome()
    board = reporting.open_tensorboard(run.dirs.tensorboard_dir) if run.main else None
    budget = start_budget(run.config, state)
    for epoch in itertools.count(state.epoch):
        if epoch >= run.epochs:  # with --time the count changes as the epochs go
            break
        epoch_started = time.perf_counter()
        # -- train; a SIGTERM inside the epoch saves it to be restarted on resume
        result = train_epoch(run, state, step, train_loader, bundle, stop, epoch)
        if result.stopped:
            outcome.interrupted, outcome.stopped = True, f"in epoch {epoch + 1}"
            break
        outcome.throughputs.append(result.throughput)
        if budget is not None:
            plan_epochs(run, state, budget, epochs_done=epoch + 1)
        # -- validate with the EMA weights, every rank its shard; rank 0 gets the metrics
        metrics, recorder = validate_epoch(run, val_loader, bundle, stop, last_epoch=epoch + 1 >= run.epochs)
        state.epoch = epoch + 1
        # -- rank 0: results row, checkpoint, reports
        if run.main:
            seconds = time.perf_counter() - epoch_started
            end_epoch(run, state, result, metrics, seconds, board, recorder, tracking)
            outcome.final_metrics = metrics if metrics is not None else outcome.final_metrics
        # -- rank 0 decides for everyone: early stop, or SIGTERM seen during validation
        if stop_after_epoch(run, state, stop, outcome, epoch):
            break
    if board is not None:
        board.close()
    if not outcome.interrupted and val_loader is not None:
        final_validation(run, val_loader, bundle, state, stop, outcome, tracking)
    return outcome


def start_budget(config: TrainConfig, state: checkpoint.RunState) -> TimeBudget | None:
    """With --time: the budget's clock started, counting the seconds a resumed run used before; else None."""
    if not config.time:
        return None
    clock = (
        time.monotonic if config.inject_epoch_seconds is None else counting_clock(config.inject_epoch_seconds)
    )
    budget = TimeBudget(config.time, used_before=state.time_used, clock=clock)
    budget.start()
    return budget


def train_epoch(
    run: Run,
    state: checkpoint.RunState,
    step: TrainStep,
    train_loader,
    bundle: DataBundle,
    stop: StopOnSigterm,
    epoch: int,
) -> EpochResult:
    """`engine.train_one_epoch` of `epoch` with the run's schedule, `state`'s iterations moved on. Stopped
    by a SIGTERM: rank 0 checkpoints the state from the epoch's start (a resume restarts the epoch with
    the learning rates of an uninterrupted run) and says so."""
    config, main = run.config, run.main
    train_loader.sampler.set_epoch(epoch)
    first_iteration = state.iteration
    batches_in = train_loader
    if main and epoch == 0 and not config.noplots:  # train_batch0..2.jpg: the first augmented batches
        batches_in = plots.recording_batches(train_loader, run.dirs.output_dir, bundle.names)
    result = train_one_epoch(
        step,
        batches_in,
        epoch=epoch,
        first_iteration=state.iteration,
        last_optimizer_iteration=state.last_optimizer_iteration,
        schedule=run.schedule,
        log_every=config.log_every,
        max_nonfinite_steps=config.max_nonfinite_steps,
        imgsz=config.imgsz,
        multi_scale=config.multi_scale,
        stop_requested=lambda: stop.requested,
        main=main,
        world_size=run.info.world_size,
    )
    state.iteration += result.iterations
    state.last_optimizer_iteration = result.last_optimizer_iteration
    if result.stopped and main:
        run.save(dataclasses.replace(state, iteration=first_iteration))
        print(checkpoint.interrupted_message(f"in epoch {epoch + 1}", run.dirs.checkpoint_dir), flush=True)
    return result


def validate_epoch(
    run: Run, val_loader, bundle: DataBundle, stop: StopOnSigterm, *, last_epoch: bool
) -> tuple[DetectionMetrics | None, plots.ValidationPlots | None]:
    """The EMA validated after an epoch (every epoch, or with --noval the last only), every rank its shard
    of rank 0's EMA: (metrics on rank 0, else None; None too when a SIGTERM cut it short) and the
    validation plots' recorder (gathered to rank 0; None with --noplots or without validation)."""
    config = run.config
    if val_loader is None or (config.noval and not last_epoch):
        return None, None
    recorder = None
    if not config.noplots:  # every rank records its shard; gathered to rank 0 below
        index = bundle.val_index
        recorder = plots.ValidationPlots(
            index.images, index.shapes, index.labels, bundle.nc, keep_first=run.main
        )
    collectives.broadcast_module(run.stack.ema.module)  # one model: rank 0's EMA, buffers too
    metrics = validate(
        run,
        run.stack.ema.module,
        val_loader,
        should_stop=lambda: stop.requested,
        on_image=recorder.on_image if recorder is not None else None,
    )
    if recorder is not None:
        recorder.gather()  # every rank: rank 0's confusion matrix and curves cover every image
    return metrics, recorder


def stop_after_epoch(
    run: Run, state: checkpoint.RunState, stop: StopOnSigterm, outcome: EpochsOutcome, epoch: int
) -> bool:
    """Whether the epochs end after `epoch` (0-based), as rank 0 decides for every rank (one broadcast):
    early stop (--patience epochs without a better fitness), or a SIGTERM seen during validation before
    the last epoch (then `outcome` records the interruption)."""
    main, patience = run.main, run.config.patience
    stop_early = main and patience > 0 and state.stale_epochs >= patience
    stop_early, sigterm = map(bool, collectives.broadcast_ints((stop_early, main and stop.requested)))
    if sigterm and epoch + 1 < run.epochs:
        if main:
            where = checkpoint.interrupted_message(f"after epoch {epoch + 1}", run.dirs.checkpoint_dir)
            print(where, flush=True)
        outcome.interrupted, outcome.stopped = True, f"after epoch {epoch + 1}"
        return True
    if stop_early and main:
        log.info("early stop: no fitness improvement for %d epochs", patience)
    return stop_early


def final_validation(
    run: Run,
    val_loader,
    bundle: DataBundle,
    state: checkpoint.RunState,
    stop: StopOnSigterm,
    outcome: EpochsOutcome,
    tracking: mlflow_log.MlflowRun | None,
) -> None:
    """After the epochs: best.pt validated (every rank, sharded); its numbers become `outcome`'s final
    metrics (the last epoch's stand when a SIGTERM cut it short) and rank 0 reports them."""
    main = run.main
    best_metrics = validate_best(run, val_loader, should_stop=lambda: stop.requested)
    outcome.final_metrics = best_metrics if best_metrics is not None else outcome.final_metrics
    if stop.requested:
        outcome.stopped = "in the final validation"
    if main and stop.requested:
        log.warning(
            "SIGTERM after the last epoch: %s; writing the final outputs now",
            "the final validation of best.pt was cut short, metrics.json keeps the last epoch's"
            if best_metrics is None
            else "the final validation of best.pt had finished",
        )
    if main and best_metrics is not None:
        emit(metric_line(final=1, **best_metrics.to_dict()), main=True)
    if main and outcome.final_metrics is not None:
        reporting.report_per_class(outcome.final_metrics, bundle.names, state.epoch, tracking)


def share_anchor_check(check: AnchorCheck | None, *, anchors: int) -> AnchorCheck:
    """AutoAnchor's `share`: rank 0's check (None elsewhere) on every rank, one float broadcast of
    `AnchorCheck.to_vector()` (`anchors`: the model's anchor count, nl * na)."""
    vector = check.to_vector() if check is not None else np.zeros(4 + 2 * anchors)
    return AnchorCheck.from_vector(collectives.broadcast_tensor(torch.from_numpy(vector)).numpy())


def plan_epochs(run: Run, state: checkpoint.RunState, budget: TimeBudget, *, epochs_done: int) -> None:
    """--time, after an epoch's training: rank 0 plans the run's epochs from the measured epoch times
    (budget.py), every rank takes its count (the schedule follows it); the state records the seconds used
    and the plan for the checkpoint."""
    (planned,) = collectives.broadcast_ints((budget.plan(epochs_done) if run.main else 0,))
    if run.main and planned != run.epochs:
        log.info(
            "time budget: %.3g of %.3g h used, the last epoch %.1f s: %d epochs in all (was %d)",
            budget.used / 3600,
            budget.hours,
            budget.epoch_seconds[-1],
            planned,
            run.epochs,
        )
    run.planned.count = state.planned_epochs = int(planned)
    state.time_used = budget.used


def train(resolved: ResolvedRun, stop: StopOnSigterm, started: float) -> int:
    """Run (or resume) the training job `resolved` describes on this rank; returns 0, or EXIT_INTERRUPTED
    after SIGTERM. `stop`: the job's SIGTERM flag, caught from the start (commands/train.py, before the run
    is resolved) to the end: one that comes while the job is being set up stops it at its first step,
    with a checkpoint and a model folder like any other. `started`: the job's perf_counter start."""
    info, dirs = resolved.info, resolved.dirs
    # rank 0 owns the checkpoint, model and output folders: one run at a time, temporaries staged outside
    # them (SageMaker uploads what appears there), a killed run's temporaries removed (claimed_dir.py)
    owned = [
        (dirs.checkpoint_dir, "checkpoint folder"),
        (dirs.model_dir, "model folder"),
        (dirs.output_dir, "output folder"),
    ]
    facts = out_of_memory.MemoryFacts(rank=info.rank, imgsz=resolved.config.imgsz)
    with (
        claimed_dir.claim_folders(owned if info.rank == 0 else []),
        out_of_memory.named(facts),  # CUDA OOM / MemoryError: one line naming the GPU, batch, image size
    ):
        return _train(resolved, stop, started, facts)


def _train(
    resolved: ResolvedRun, stop: StopOnSigterm, started: float, facts: out_of_memory.MemoryFacts
) -> int:
    config, info, dirs, decided = resolved.config, resolved.info, resolved.dirs, resolved.decided

    # -- data: scanned on every rank BEFORE the process group exists
    bundle = data_wiring.scan_data(config, dirs.cache_dir)

    # -- process group and device
    device = process_group.init(info, decided.backend, decided.device_type, config.dist_timeout)
    seed_everything(config.seed + info.rank)
    facts.device = device
    if config.batch_size == AUTO_BATCH:  # --batch-size -1: every rank probes its GPU, all take the smallest
        plan = auto_batch_plan(config, info, bundle, device, resolved.saved, decided.amp)
        decided = dataclasses.replace(decided, plan=plan)
        resolved = dataclasses.replace(resolved, decided=decided)
    facts.per_rank, facts.global_batch = decided.plan.per_rank, decided.plan.global_batch
    if info.rank == 0:
        log.info(
            "backend=%s world_size=%d global_batch=%d per_rank=%d accumulate=%d amp=%s device=%s",
            decided.backend,
            info.world_size,
            decided.plan.global_batch,
            decided.plan.per_rank,
            accumulation(decided.plan.global_batch),
            decided.amp.mode,
            device,
        )

    # -- the run (model, loss, EMA, optimizer, loaders), its resumed state, the step
    run, train_loader, val_loader = build_run(resolved, bundle, device)
    state = resume(run, resolved.resume_from, resolved.saved)
    step = build_step(run)

    # -- the epochs, then the final outputs on rank 0
    tracking = (
        mlflow_log.start({**config.to_dict(), "hyp": run.hyp.to_dict()}, run_name=config.run_name)
        if run.main
        else None
    )
    # after a SIGTERM too, rank 0 writes the model folder (best so far) within the 120 s before SIGKILL,
    # while the other ranks wait in the barrier
    outcome = run_epochs(run, state, step, train_loader, val_loader, bundle, stop, tracking)
    if run.main:
        reporting.write_final_outputs(run, state, outcome, started, time_left=stop.time_left)
    if tracking is not None:  # after best.pt is written: it is one of the artefacts
        tracking.finish(dirs.output_dir, dirs.model_dir, interrupted=outcome.interrupted)
    process_group.barrier()
    return EXIT_INTERRUPTED if outcome.interrupted else 0


def auto_batch_plan(
    config: TrainConfig,
    info: process_group.DistInfo,
    bundle: DataBundle,
    device: torch.device,
    saved: dict[str, Any] | None,
    amp: AmpPolicy,
) -> BatchPlan:
    """--batch-size -1: the per-GPU batch the smallest GPU of the job fits (autobatch.py), probed with the
    run's architecture (a fresh copy: the run's own model is built after)."""
    probe = initial_model(
        config.cfg,
        config.weights,
        bundle.nc,
        bundle.names,
        allow_partial=config.allow_partial_transfer,
        resume_cfg=saved.get("model_cfg") if saved is not None else None,
    ).model
    mine = size_batch(probe, config.imgsz, device, amp_dtype=amp.dtype, rank=info.rank)
    del probe
    torch.cuda.empty_cache()
    agreed = agree_smallest(mine)
    if agreed < 1:
        raise out_of_memory.OutOfMemory(
            "--batch-size -1 (AutoBatch): "
            + out_of_memory.gpu_message(
                out_of_memory.MemoryFacts(rank=info.rank, imgsz=config.imgsz, device=device)
            )
        )
    if info.rank == 0:
        log.info(
            "autobatch: %d image(s) per GPU (the smallest of %d rank(s)), global batch %d",
            agreed,
            info.world_size,
            agreed * info.world_size,
        )
    return BatchPlan(agreed * info.world_size, agreed)


def build_run(resolved: ResolvedRun, bundle: DataBundle, device: torch.device) -> tuple[Run, Any, Any]:
    """The Run of this rank and its train and val loaders: the model (from the resumed checkpoint's
    model_cfg, else --cfg/--weights), the training stack built from it, SyncBatchNorm, the loaders (the
    warmup and the schedule need their length), the loader workers' thread settings."""
    config, info, dirs, decided = resolved.config, resolved.info, resolved.dirs, resolved.decided
    model = build_detection_model(
        config,
        bundle,
        device,
        anchor_t=decided.hyp.anchor_t,
        resume_cfg=resolved.resume_cfg,
    )
    stack = build_training_stack(
        model,
        decided.hyp,
        nc=bundle.nc,
        imgsz=config.imgsz,
        global_batch=decided.plan.global_batch,
        amp=decided.amp,
        optimizer=config.optimizer,
        label_smoothing=config.label_smoothing,
    )
    model = with_sync_batchnorm(model, config, info, device)
    train_loader, val_loader, workers = data_wiring.build_loaders(
        config,
        bundle,
        stack.hyp,
        decided.plan.per_rank,
        info,
        int(model.stride.max()),
        decided.color_on_device,
        dirs.cache_dir,
    )
    settings = runtime_for_loaders(config, info, device, workers)
    run = Run(
        config,
        info,
        dirs,
        decided.plan,
        decided.amp,
        device,
        model,
        stack,
        warmup_iters=max(round(stack.hyp.warmup_epochs * len(train_loader)), MIN_WARMUP_ITERS),
        batches_per_epoch=len(train_loader),
        planned=PlannedEpochs(resolved.planned_epochs),  # a restart keeps the time budget's plan
    )
    if run.main:
        log.info("%s", settings.log_line())
        log_data_plan(run, bundle, train_loader, workers, decided.color_on_device or config.loader == "gpu")
    return run, train_loader, val_loader


def runtime_for_loaders(
    config: TrainConfig, info: process_group.DistInfo, device: torch.device, workers: int
) -> RuntimeSettings:
    """This process's CPU threads and cudnn.benchmark beside `workers` loader workers (runtime.py), applied."""
    settings = decide_runtime(
        cpu_count=os.cpu_count() or 1,
        local_ranks=info.local_world_size,
        loader_workers=workers,
        device_type=device.type,
        rect=config.rect,
        multi_scale=config.multi_scale,
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
    )
    apply_runtime(settings)
    return settings


def log_data_plan(run: Run, bundle: DataBundle, train_loader, workers: int, color_on_device: bool) -> None:
    """Rank 0: one line on the data (images, batches, workers, warmup, where colour runs) and, unless
    --noplots, the labels plot."""
    log.info(
        "%d train images, %d batches/epoch per rank, %d val images, %d loader workers/rank, warmup %d "
        "iterations, HSV and flips %s",
        len(bundle.train_index.images),
        len(train_loader),
        len(bundle.val_index.images),
        workers,
        run.warmup_iters,
        "on the device batch" if color_on_device else "in the loader workers",
    )
    if not run.config.noplots:
        plots.write_labels_plot(run.dirs.output_dir, bundle.train_index.labels, bundle.names)


def validate_best(
    run: Run, val_loader, should_stop: Callable[[], bool] | None = None
) -> DetectionMetrics | None:
    """Validate the weights model_dir/best.pt receives — the best checkpoint's EMA, rounded to float16 as
    it is stored — on every rank, sharded. Rank 0 reads best.pt and broadcasts the weights (checkpoint
    folders are per node); rank 0 gets the metrics, the others None; None everywhere without a best.pt,
    and when `should_stop()` turns true (SIGTERM) on any rank."""
    ema = run.stack.ema
    best_path = run.dirs.checkpoint_dir / checkpoint.BEST
    if not collectives.broadcast_ints((run.main and best_path.is_file(),))[0]:
        return None
    if run.main:
        ema.load_state_dict(checkpoint.load_checkpoint(best_path)["ema"])
    collectives.broadcast_module(ema.module)
    with torch.no_grad():
        for tensor in ema.module.state_dict().values():
            if tensor.is_floating_point():
                tensor.copy_(tensor.half().float())
    return validate(run, ema.module, val_loader, should_stop=should_stop)


def validate(
    run: Run, module: nn.Module, val_loader, *, should_stop: Callable[[], bool] | None, on_image=None
) -> DetectionMetrics | None:
    """`engine.evaluate` of `module` with the run's validation settings (conf, IoU, max detections),
    sharded over the ranks: the metrics on rank 0, None elsewhere and when `should_stop()` turned true."""
    config = run.config
    return evaluate(
        module,
        val_loader,
        device=run.device,
        amp=run.amp,
        conf_thres=config.val_conf,
        iou_thres=config.val_iou,
        max_det=config.max_det,
        should_stop=should_stop,
        on_image=on_image,
        gather=True,
    )
