"""One worker of the DDP-equivalence check (tests/integration/test_ddp_equivalence.py).

Runs the engine's real `train_one_epoch` / `TrainStep` (DDP no_sync on non-final micro-steps, loss times
world size, gradient clipping, the trainer's optimizer groups) for 6 micro-steps with accumulation 2
(3 optimizer steps) on fixed batches, then rank 0 saves the parameters.

Batches: each rank gets the same 4 images per step; a single process gets those 4 images twice (8).
YOLO's box/cls losses are means over matched targets and objectness a mean over cells, so only halves
with identical matching statistics make "2 x B/2" equal "1 x B" exactly: duplicated halves do, and
batch-norm batch statistics are then identical too. (BN running_var uses the unbiased n/(n-1) factor,
which differs with n; the check compares parameters, not BN running buffers.)

usage: ddp_equivalence_worker.py OUT.pt BACKEND
"""

import os
import sys

import torch

from yolov5_smddp import distributed
from yolov5_smddp.config import load_hyp
from yolov5_smddp.engine import AmpPolicy, StepSettings, TrainStep, train_one_epoch
from yolov5_smddp.loss import YoloLoss, scale_loss_gains
from yolov5_smddp.models.yolo import build_model
from yolov5_smddp.trainer import build_optimizer, wrap_ddp

IMGSZ, PER_RANK, MICRO_STEPS, ACCUMULATE, NC = 64, 4, 6, 2, 3


def fixed_batches(copies: int) -> list[tuple]:
    g = torch.Generator().manual_seed(123)
    batches = []
    for _ in range(MICRO_STEPS):
        imgs = torch.randint(0, 256, (PER_RANK, 3, IMGSZ, IMGSZ), dtype=torch.uint8, generator=g)
        rows = []
        for i in range(PER_RANK):
            for _ in range(2):
                xy = torch.rand(2, generator=g) * 0.6 + 0.2
                wh = torch.rand(2, generator=g) * 0.3 + 0.1
                rows.append(
                    torch.cat([torch.tensor([i, int(torch.randint(0, NC, (1,), generator=g))]), xy, wh])
                )
        targets = torch.stack(rows).float()
        imgs = imgs.repeat(copies, 1, 1, 1)
        targets = torch.cat([targets + torch.tensor([k * PER_RANK, 0, 0, 0, 0, 0]) for k in range(copies)])
        batches.append((imgs, targets, (), (), None))
    return batches


def main(out: str, backend: str) -> None:
    torch.set_num_threads(1)
    info = distributed.detect_dist_info(os.environ)
    backend, device_type = distributed.resolve(
        backend, torch.cuda.is_available(), distributed.smddp_importable
    )
    device = distributed.init(info, backend, device_type, 120.0)
    torch.manual_seed(0)
    model = build_model("yolov5n", nc=NC).to(device)
    hyp = load_hyp("scratch-low")
    criterion = YoloLoss(model, scale_loss_gains(hyp, 3, NC, IMGSZ))
    optimizer = build_optimizer(model, "SGD", 0.01, 0.937, 5e-4)
    net = wrap_ddp(model, torch.device("cpu")) if info.distributed else model
    amp = AmpPolicy("off", device.type)
    step = TrainStep(
        net,
        criterion,
        optimizer,
        amp.make_scaler(),
        None,
        amp,
        device,
        loss_multiplier=float(info.world_size),
    )
    settings = StepSettings({"bias": 0.02, "weight": 0.01, "norm": 0.01}, 0.9, ACCUMULATE)
    result = train_one_epoch(
        step,
        fixed_batches(copies=2 if info.world_size == 1 else 1),
        epoch=0,
        first_iteration=0,
        last_optimizer_iteration=-1,
        settings_for=lambda _it: settings,
        log_every=1000,
        max_nonfinite_steps=5,
        imgsz=IMGSZ,
        multi_scale=False,
        stop_requested=lambda: False,
        main=info.rank == 0,
        world_size=info.world_size,
    )
    assert result.last_optimizer_iteration == MICRO_STEPS - 1
    if info.rank == 0:
        torch.save({k: v.detach().cpu() for k, v in model.named_parameters()}, out)
    distributed.destroy()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
