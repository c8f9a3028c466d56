"""What a training run decides before any work, so that every problem of its options fails there:
the typed hyperparameters, the batch split, backend and device, precision, where colour augmentation
runs; a bad --cfg or --weights, or --compile without a compiler, fails here too."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from yolov5_smddp.config.batch import BatchPlan, plan_batch
from yolov5_smddp.config.hyp import Hyp, load_hyp, unused_hyp_warnings
from yolov5_smddp.config.train_config import TrainConfig
from yolov5_smddp.data.color import runs_on_device
from yolov5_smddp.distributed import process_group
from yolov5_smddp.errors import ConfigError
from yolov5_smddp.models.yolo import load_model_config
from yolov5_smddp.train.autobatch import AUTO_BATCH, CPU_REFUSAL
from yolov5_smddp.train.engine import AmpPolicy, resolve_amp

log = logging.getLogger("yolov5_smddp")


@dataclass(frozen=True)
class DeviceChoice:
    """The runtime decision `train` and `val` share: the process group's backend (None: one process of
    `val` outside any launch, no group), the device type and the precision policy for it."""

    backend: str | None
    device_type: str
    amp: AmpPolicy


def decide_device(
    backend: str, amp: str, info: process_group.DistInfo, *, device: str | None = None
) -> DeviceChoice:
    """Backend and device type (`process_group.resolve`: the launch's choice, one log line on rank 0), then
    the precision for that device (`resolve_amp`). `device`: val's --device ("" for the CUDA device when
    there is one), taken by a process outside any launch instead of the launch's choice."""
    cuda = torch.cuda.is_available()
    if device is not None and not info.distributed:
        chosen = torch.device(device or ("cuda" if cuda else "cpu"))
        backend_choice, device_type = None, chosen.type
    else:
        chosen = None
        backend_choice, device_type = process_group.resolve(backend, info, cuda)
    capability = torch.cuda.get_device_capability(chosen) if device_type == "cuda" else None
    return DeviceChoice(backend_choice, device_type, resolve_amp(amp, device_type, capability))


@dataclass(frozen=True)
class Decisions:
    """What a run decides before any work (every config problem fails while deciding)."""

    hyp: Hyp
    plan: BatchPlan
    backend: str
    device_type: str
    amp: AmpPolicy
    color_on_device: bool = False
    """HSV jitter and flips on the device batch (`--color-aug`), not in the loader workers."""


def decide(config: TrainConfig, info: process_group.DistInfo) -> Decisions:
    """Hyperparameters, batch split, backend/device and precision; a bad --cfg/--weights fails here too."""
    hyp = load_hyp(config.hyp, config.hyp_overrides)  # the YAML's key: value form, typed below
    if info.rank == 0:
        for warning in unused_hyp_warnings(hyp, load_hyp("scratch-low")):
            log.warning("%s", warning)
    auto_batch = config.batch_size == AUTO_BATCH
    if auto_batch and config.batch_per_gpu is not None:
        raise ConfigError("--batch-size -1 (AutoBatch) sizes the per-GPU batch: leave --batch-per-gpu out")
    # AutoBatch: a stand-in plan until the trainer probes the GPU (autobatch.py), after the process group
    plan = (
        BatchPlan(info.world_size, 1)
        if auto_batch
        else plan_batch(config.batch_size, config.batch_per_gpu, info.world_size)
    )
    choice = decide_device(config.backend, config.amp, info)
    backend, device_type, amp = choice.backend, choice.device_type, choice.amp
    if auto_batch and device_type != "cuda":
        raise ConfigError(CPU_REFUSAL)
    if info.rank == 0:
        log.info("amp %s: %s", amp.mode, amp.reason)
    if config.sync_bn and backend == "smddp" and info.world_size > 1:
        raise ConfigError(
            "--sync-bn with --backend smddp: SyncBatchNorm gathers its statistics with collectives SMDDP "
            "does not document (all_gather_into_tensor); train without --sync-bn (each rank's BatchNorm uses "
            "its own batch; the EMA that is validated and saved is rank 0's) or use --backend nccl"
        )
    if config.compile and device_type == "cpu" and not (shutil.which("g++") or shutil.which("c++")):
        raise ConfigError("--compile on CPU needs a C++ compiler (g++) for torch inductor; none is installed")
    if config.cfg:
        load_model_config(config.cfg)  # a bad --cfg fails now, not after the data scan
    if config.weights and not Path(config.weights).is_file():
        raise ConfigError(f"--weights {config.weights}: no such file")
    color_on_device = runs_on_device(config.color_aug, device_type)
    return Decisions(Hyp.from_dict(hyp), plan, backend, device_type, amp, color_on_device)
