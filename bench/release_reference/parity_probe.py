"""Where could a gap between a model trained by the release and one trained by us come from? Two probes
that compare the pieces side by side (the release is the PyPI package `yolov5` 7.0.14, imported at run
time in the throwaway image of bench/release_reference/Dockerfile; nothing of it is copied here):

  steps      the release's model, loss (ComputeLoss) and optimizer (smart_optimizer) against ours
             (build_training_stack + TrainStep) from the SAME initial weights on the SAME batches with the
             same warmup settings: per-step losses and the largest weight difference; then a control, the
             release against itself with the weights perturbed by 1e-7 (relative), which shows how fast
             training amplifies any float-level difference.
  pipelines  the release's LoadImagesAndLabels against our YoloDataset on a data.yaml: labels per sample,
             box sizes and pixel statistics of mosaic samples, and the loss of fixed trained models (e.g.
             each trainer's best.pt) on batches from either pipeline: equal losses mean the labels sit on
             the pixels the same way in both.

    python3 /src/bench/release_reference/parity_probe.py steps --data /out/data/data.yaml --imgsz 224
    python3 /src/bench/release_reference/parity_probe.py pipelines --data /out/data/data.yaml --imgsz 224 \\
        --hyp /out/hyp.yaml --weights /out/runs/release-s3/weights/best.pt /out/runs/ours-s3/model/best.pt
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
import torch
import yaml


def _our_dataset(data: Path, imgsz: int, hyp: dict, tmp: Path):
    from yolov5_smddp.data.config import load_data_config
    from yolov5_smddp.data.dataset import YoloDataset
    from yolov5_smddp.data.labels import build_label_index

    cfg = load_data_config(data)
    index = build_label_index(cfg.train, nc=cfg.nc, root=cfg.root, cache_dir=tmp)
    return YoloDataset(index, imgsz, augment=True, hyp=_typed(hyp), seed=0), cfg


def _typed(hyp: dict):
    """The release's hyp YAML as our typed Hyp (its keys are ours)."""
    from yolov5_smddp.config.hyp import Hyp

    return Hyp.from_dict({k: hyp[k] for k in Hyp.keys()})


def _release_model(nc: int, hyp: dict, imgsz: int):
    import yolov5
    from yolov5.models.yolo import Model

    model = Model(str(Path(yolov5.__file__).parent / "models/yolov5n.yaml"), ch=3, nc=nc)
    scaled, nl = (
        dict(hyp),
        model.model[-1].nl,
    )  # the release's gain scaling (facts: 3 levels, 80 classes, 640)
    scaled["box"] *= 3 / nl
    scaled["cls"] *= nc / 80 * 3 / nl
    scaled["obj"] *= (imgsz / 640) ** 2 * 3 / nl
    scaled["label_smoothing"] = 0.0
    model.nc, model.hyp = nc, scaled
    return model


def _max_weight_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    pairs = zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    return max((x - y).abs().max().item() for x, y in pairs if x.is_floating_point())


def steps(args: argparse.Namespace, hyp: dict, tmp: Path) -> None:
    from yolov5.utils.loss import ComputeLoss
    from yolov5.utils.torch_utils import smart_optimizer

    from yolov5_smddp.data.loader import collate
    from yolov5_smddp.models.yolo import build_model
    from yolov5_smddp.train.engine import AmpPolicy, Schedule, TrainStep, apply_settings
    from yolov5_smddp.train.optim_recipe import build_training_stack

    torch.manual_seed(0)
    ds, cfg = _our_dataset(args.data, args.imgsz, hyp, tmp)
    b = args.batch
    batches = [collate([ds[(k * b + j) % len(ds)] for j in range(b)])[:2] for k in range(args.steps)]
    nw, epochs = 150, 30

    def release_side(model):
        accumulate = max(round(64 / b), 1)
        opt = smart_optimizer(
            model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"] * b * accumulate / 64
        )
        return model, opt, ComputeLoss(model)

    def release_settings(opt, ni: int) -> int:  # the release's warmup interpolation (facts, np.interp)
        lf0 = (1 - 0 / epochs) * (1.0 - hyp["lrf"]) + hyp["lrf"]
        for j, group in enumerate(opt.param_groups):
            group["lr"] = np.interp(ni, [0, nw], [hyp["warmup_bias_lr"] if j == 0 else 0.0, hyp["lr0"] * lf0])
            group["momentum"] = np.interp(ni, [0, nw], [hyp["warmup_momentum"], hyp["momentum"]])
        return int(max(1, np.interp(ni, [0, nw], [1, 64 / b]).round()))

    rmodel, ropt, rloss = release_side(_release_model(cfg.nc, hyp, args.imgsz))
    ours = build_model("yolov5n", nc=cfg.nc)
    ours.load_state_dict(rmodel.state_dict())
    if args.channels_last:  # as the trainer runs by default (--channels-last)
        ours.to(memory_format=torch.channels_last)
    amp = AmpPolicy("off", "cpu")
    stack = build_training_stack(ours, _typed(hyp), nc=cfg.nc, imgsz=args.imgsz, global_batch=b, amp=amp)
    schedule = Schedule(
        hyp=stack.hyp, epochs=epochs, warmup_iters=nw, batches_per_epoch=50, cosine=False, global_batch=b
    )
    step = TrainStep(
        ours,
        stack.criterion,
        stack.optimizer,
        stack.scaler,
        None,
        amp,
        torch.device("cpu"),
        channels_last=args.channels_last,
    )
    control = _release_model(cfg.nc, hyp, args.imgsz)
    control.load_state_dict(rmodel.state_dict())
    with torch.no_grad():
        for p in control.parameters():
            p.mul_(1 + 1e-7 * torch.randn_like(p))
    cmodel, copt, closs = release_side(control)
    rmodel.train(), ours.train(), cmodel.train()
    last = -1
    print("step  accumulate  loss (box, obj, cls): release | ours   max |weight diff|: ours | control")
    for ni, (imgs, targets) in enumerate(batches):
        settings = schedule.settings(ni, 0)
        apply_settings(stack.optimizer, settings)
        accumulate = release_settings(ropt, ni)
        release_settings(copt, ni)
        x = imgs.float() / 255
        loss, items = rloss(rmodel(x), targets)
        loss.backward()
        closs(cmodel(x), targets)[0].backward()
        mine = step.micro_step(imgs, targets, sync=True)
        if ni - last >= accumulate:
            for model, opt in ((rmodel, ropt), (cmodel, copt)):
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
                opt.step()
                opt.zero_grad()
            step.optimizer_step()
            last = ni
        print(
            f"{ni:4d}  {accumulate}/{settings.accumulate}  {items.numpy().round(5)} | {mine.numpy().round(5)}   "
            f"{_max_weight_diff(rmodel, ours):.2e} | {_max_weight_diff(rmodel, cmodel):.2e}",
            flush=True,
        )


def pipelines(args: argparse.Namespace, hyp: dict, tmp: Path) -> None:
    from yolov5.utils.dataloaders import LoadImagesAndLabels

    from yolov5_smddp.data.loader import collate
    from yolov5_smddp.detection.loss import LossHyp, YoloLoss, scale_loss_gains
    from yolov5_smddp.models.weights import load_weights, transfer_state
    from yolov5_smddp.models.yolo import build_model

    ours, cfg = _our_dataset(args.data, args.imgsz, hyp, tmp)
    train_dir = cfg.train[0] if isinstance(cfg.train, list | tuple) else cfg.train
    release = LoadImagesAndLabels(
        str(train_dir), img_size=args.imgsz, batch_size=args.batch, augment=True, hyp=hyp
    )
    random.seed(0)
    np.random.seed(0)
    order = np.random.default_rng(1).permutation(len(ours))

    def release_batch(k: int):
        items = [release[int(order[(k * args.batch + j) % len(order)])] for j in range(args.batch)]
        targets = []
        for j, item in enumerate(items):
            t = item[1].clone()
            t[:, 0] = j
            targets.append(t)
        return torch.stack([item[0] for item in items]), torch.cat(targets)

    def our_batch(k: int):
        return collate([ours[int(order[(k * args.batch + j) % len(order)])] for j in range(args.batch)])[:2]

    sides = {"release": release_batch, "ours": our_batch}
    for name, get in sides.items():
        labels, widths, means = [], [], []
        for k in range(args.batches):
            imgs, targets = get(k)
            labels.append(len(targets) / len(imgs))
            widths += (targets[:, 4] * args.imgsz).tolist()
            means.append(imgs.float().mean().item())
        w = np.array(widths)
        print(
            f"{name:8s} labels/sample {np.mean(labels):.3f}  box width px q10/50/90 "
            f"{np.percentile(w, [10, 50, 90]).round(2)}  pixel mean {np.mean(means):.2f}"
        )
    for path in args.weights:
        loaded = load_weights(path)
        model = build_model(loaded.cfg, nc=cfg.nc)
        transfer_state(model, loaded.state_dict, detect_rows=True)
        model.float().train()
        for m in model.modules():  # raw outputs, running BN statistics
            if isinstance(m, torch.nn.BatchNorm2d):
                m.eval()
        criterion = YoloLoss(
            model,
            LossHyp.from_mapping(
                {**scale_loss_gains(hyp, model.detect.nl, cfg.nc, args.imgsz), "label_smoothing": 0.0}
            ),
        )
        for name, get in sides.items():
            total = torch.zeros(3)
            with torch.no_grad():
                for k in range(args.batches):
                    imgs, targets = get(k)
                    total += criterion(model(imgs.float() / 255), targets)[1]
            print(
                f"{path}: loss (box, obj, cls) on the {name} pipeline {(total / args.batches).numpy().round(5)}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("probe", choices=("steps", "pipelines"))
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--imgsz", type=int, default=224)
    parser.add_argument("--hyp", type=Path, default=None, help="default: the release's scratch-low")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--weights", nargs="*", default=[])
    parser.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ours as the trainer runs it",
    )
    args = parser.parse_args()
    import tempfile

    import cv2
    import yolov5

    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    hyp_path = args.hyp or Path(yolov5.__file__).parent / "data/hyps/hyp.scratch-low.yaml"
    hyp = yaml.safe_load(Path(hyp_path).read_text())
    with tempfile.TemporaryDirectory(prefix="parity-probe-") as tmp:
        (steps if args.probe == "steps" else pipelines)(args, hyp, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
