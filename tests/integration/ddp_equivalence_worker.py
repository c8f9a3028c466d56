"""One process of the DDP-equivalence check (tests/integration/test_ddp_equivalence.py).

Runs the engine's real `train_one_epoch` / `TrainStep` (DDP no_sync on the non-final micro-steps, the loss
times `loss_multiplier`, gradient clipping, the trainer's optimizer groups) for OPTIMIZER_STEPS optimizer
steps on fixed batches. The data are SHARDS shards of MICRO_STEPS batches of PER_RANK images each, every
batch different (its own random images and labels).

- `ddp` (WORLD_SIZE ranks = SHARDS): rank r trains on shard r, accumulation ACCUMULATE, the loss times the
  trainer's `loss_multiplier` (the world size). DDP averages the gradients over the ranks, so each
  optimizer step applies the sum over both shards' ACCUMULATE batches of each batch's own gradient.
- `reference` (1 process): every shard's batches, interleaved (batch m of shard 0, batch m of shard 1, then
  m + 1 ...), each as its own micro-step, accumulation ACCUMULATE x SHARDS, the loss times the trainer's
  `loss_multiplier` (1 for one process): the same batches in each optimizer step, so the same gradient
  sum; and each micro-step sees the same PER_RANK images as one rank's micro-step did, so batch-norm batch
  statistics match too. Only the order of the floating-point additions differs.
- `alone` (1 process): shard 0 alone, accumulation ACCUMULATE, the loss times SHARDS: what rank 0 computes
  when its DDP never all-reduces; the result a broken all-reduce gives.

Each process saves OUT_DIR/rank{R}.pt: its parameters, and the SHA-1 of every batch it trained on in the
order it trained on them. (BN running_var uses the unbiased n/(n-1) factor and the reference runs more
forwards than a rank, so BN running buffers are not compared; parameters are.)

usage: ddp_equivalence_worker.py OUT_DIR BACKEND WORLD_SIZE {ddp,reference,alone}
"""

import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import torch

from yolov5_smddp.config.hyp import load_hyp
from yolov5_smddp.detection.loss import LossHyp, YoloLoss, scale_loss_gains
from yolov5_smddp.distributed import process_group
from yolov5_smddp.models.yolo import build_model
from yolov5_smddp.train.engine import AmpPolicy, StepSettings, TrainStep, train_one_epoch
from yolov5_smddp.train.optim_recipe import build_optimizer, loss_multiplier, wrap_ddp

IMGSZ, PER_RANK, NC = 64, 4, 3
SHARDS, ACCUMULATE, OPTIMIZER_STEPS = 2, 2, 3
MICRO_STEPS = ACCUMULATE * OPTIMIZER_STEPS  # per shard


def make_batch(shard: int, index: int) -> tuple:
    """Batch `index` of `shard`: PER_RANK random uint8 images, 2 random boxes on each."""
    g = torch.Generator().manual_seed(1000 * shard + index)
    imgs = torch.randint(0, 256, (PER_RANK, 3, IMGSZ, IMGSZ), dtype=torch.uint8, generator=g)
    rows = []
    for i in range(PER_RANK):
        for _ in range(2):
            cls = int(torch.randint(0, NC, (1,), generator=g))
            xy = torch.rand(2, generator=g) * 0.6 + 0.2
            wh = torch.rand(2, generator=g) * 0.3 + 0.1
            rows.append(torch.cat([torch.tensor([float(i), float(cls)]), xy, wh]))
    return imgs, torch.stack(rows).float(), (), (), None


def batch_digest(batch: tuple) -> str:
    imgs, targets = batch[0], batch[1]
    return hashlib.sha1(imgs.numpy().tobytes() + targets.numpy().tobytes()).hexdigest()


def recorded(batches: list[tuple], seen: list[str]) -> Iterator[tuple]:
    """The batches as train_one_epoch takes them, each one's digest noted as it is taken."""
    for batch in batches:
        seen.append(batch_digest(batch))
        yield batch


def plan(mode: str, info: process_group.DistInfo) -> tuple[list[tuple], int, float]:
    """(batches, accumulation, loss multiplier) of this process; ddp and reference take the trainer's
    loss multiplier for their world size."""
    if mode == "ddp":
        return [make_batch(info.rank, m) for m in range(MICRO_STEPS)], ACCUMULATE, loss_multiplier(info)
    if mode == "reference":
        batches = [make_batch(s, m) for m in range(MICRO_STEPS) for s in range(SHARDS)]
        return batches, ACCUMULATE * SHARDS, loss_multiplier(info)
    if mode == "alone":
        return [make_batch(0, m) for m in range(MICRO_STEPS)], ACCUMULATE, float(SHARDS)
    raise SystemExit(f"mode {mode!r} must be ddp, reference or alone")


def main(out_dir: str, backend: str, expected_world_size: int, mode: str) -> None:
    torch.set_num_threads(1)
    info = process_group.detect_dist_info(os.environ)
    wanted = SHARDS if mode == "ddp" else 1
    if expected_world_size != wanted or info.world_size != expected_world_size:
        raise SystemExit(
            f"mode {mode} needs world size {wanted}; the command line says {expected_world_size}, "
            f"the launcher started {info.world_size}"
        )
    backend, device_type = process_group.resolve(backend, info, torch.cuda.is_available())
    device = process_group.init(info, backend, device_type, 120.0)
    train_and_save(info, device, out_dir, mode)
    # the DDP wrapper is garbage now: leaving the group ends its backend (yolov5_smddp.distributed.process_group)
    process_group.teardown(0)


def train_and_save(info: process_group.DistInfo, device: torch.device, out_dir: str, mode: str) -> None:
    """One epoch of `mode`'s batches on this rank; the parameters and the batches seen to out_dir."""
    torch.manual_seed(0)
    model = build_model("yolov5n", nc=NC).to(device)
    hyp = load_hyp("scratch-low")
    criterion = YoloLoss(model, LossHyp.from_mapping(scale_loss_gains(hyp, 3, NC, IMGSZ)))
    optimizer = build_optimizer(model, "SGD", 0.01, 0.937, 5e-4)
    net = wrap_ddp(model, torch.device("cpu")) if info.distributed else model
    amp = AmpPolicy("off", device.type)
    batches, accumulate, multiplier = plan(mode, info)
    step = TrainStep(
        net, criterion, optimizer, amp.make_scaler(), None, amp, device, loss_multiplier=multiplier
    )
    settings = StepSettings({"bias": 0.02, "weight": 0.01, "norm": 0.01}, 0.9, accumulate)
    seen: list[str] = []
    result = train_one_epoch(
        step,
        recorded(batches, seen),
        epoch=0,
        first_iteration=0,
        last_optimizer_iteration=-1,
        schedule=SimpleNamespace(settings=lambda _it, _epoch: settings),
        log_every=1000,
        max_nonfinite_steps=5,
        imgsz=IMGSZ,
        multi_scale=False,
        stop_requested=lambda: False,
        main=info.rank == 0,
        world_size=info.world_size,
    )
    # OPTIMIZER_STEPS optimizer steps, the last one on the last batch
    assert result.last_optimizer_iteration == len(batches) - 1 == OPTIMIZER_STEPS * accumulate - 1
    params = {k: v.detach().cpu().clone() for k, v in model.named_parameters()}
    torch.save({"params": params, "batches": seen}, Path(out_dir) / f"rank{info.rank}.pt")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__.rsplit("usage: ", 1)[1])
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
