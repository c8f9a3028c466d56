import math

import numpy as np
import pytest
import torch

from yolov5_smddp.config.hyp import Hyp, load_hyp
from yolov5_smddp.detection.loss import LossHyp, YoloLoss, scale_loss_gains
from yolov5_smddp.errors import ConfigError
from yolov5_smddp.models.yolo import build_model
from yolov5_smddp.train.ema import ModelEMA
from yolov5_smddp.train.engine import (
    AmpPolicy,
    NonFiniteLossError,
    Schedule,
    StepSettings,
    TrainStep,
    accumulation,
    apply_settings,
    lr_factor,
    resolve_amp,
    train_one_epoch,
)
from yolov5_smddp.train.optim_recipe import build_optimizer, freeze_layers

HYP = load_hyp("scratch-low")
TYPED_HYP = Hyp.from_dict(HYP)


def test_lr_factor_linear_and_cosine():
    assert lr_factor(0, 10, 0.01, False) == 1.0
    assert lr_factor(5, 10, 0.01, False) == pytest.approx(0.505)
    assert lr_factor(10, 10, 0.01, False) == pytest.approx(0.01)
    assert lr_factor(0, 10, 0.1, True) == pytest.approx(1.0)
    assert lr_factor(5, 10, 0.1, True) == pytest.approx(0.55)
    assert lr_factor(10, 10, 0.1, True) == pytest.approx(0.1)


def test_warmup_interpolation_exact_values():
    kw = {
        "epochs": 10,
        "warmup_iters": 100,
        "batches_per_epoch": 40,
        "hyp": TYPED_HYP,
        "cosine": False,
        "global_batch": 16,
    }
    schedule = Schedule(**kw)
    s0 = schedule.settings(0, 0)
    assert s0.lrs == {"bias": 0.1, "weight": 0.0, "norm": 0.0} and s0.momentum == 0.8 and s0.accumulate == 1
    s50 = schedule.settings(50, 0)
    assert s50.lrs["bias"] == pytest.approx(0.1 + 0.5 * (0.01 - 0.1))
    assert s50.lrs["weight"] == pytest.approx(0.005)
    assert s50.momentum == pytest.approx(0.8 + 0.5 * 0.137) and s50.accumulate == 2  # round(2.5) = 2
    end = schedule.settings(100, 2)  # warmup's last iteration (in epoch 2): the epoch's own factor
    assert end.lrs["weight"] == pytest.approx(0.01 * ((1 - 0.2) * 0.99 + 0.01))
    after = schedule.settings(130, 3)  # one epoch behind afterwards, as the release's LambdaLR
    assert after.lrs["weight"] == pytest.approx(0.01 * ((1 - 0.2) * 0.99 + 0.01))
    assert after.lrs["bias"] == after.lrs["weight"] and after.momentum == 0.937 and after.accumulate == 4


def _release_schedule_trace(epochs, nb, nw, batch, cosine):
    """(lrs of the bias, weight, norm groups, momentum, accumulate) per iteration, produced the way the
    release drives torch's LambdaLR: created at lr0, last_epoch set to start_epoch - 1, warmup by
    np.interp towards initial_lr * lf(epoch) for iterations <= nw, scheduler.step() at each epoch end."""
    lrf = HYP["lrf"]
    if cosine:
        lf = lambda x: ((1 - math.cos(x * math.pi / epochs)) / 2) * (lrf - 1) + 1  # noqa: E731
    else:
        lf = lambda x: (1 - x / epochs) * (1.0 - lrf) + lrf  # noqa: E731
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(3)]
    opt = torch.optim.SGD(
        [{"params": [p]} for p in params], lr=HYP["lr0"], momentum=HYP["momentum"], nesterov=True
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=lf)
    scheduler.last_epoch = 0 - 1
    accumulate = max(round(64 / batch), 1)
    trace = []
    for epoch in range(epochs):
        for i in range(nb):
            ni = i + nb * epoch
            if ni <= nw:
                xi = [0, nw]
                accumulate = max(1, np.interp(ni, xi, [1, 64 / batch]).round())
                for j, group in enumerate(opt.param_groups):
                    start = HYP["warmup_bias_lr"] if j == 0 else 0.0
                    group["lr"] = np.interp(ni, xi, [start, group["initial_lr"] * lf(epoch)])
                    group["momentum"] = np.interp(ni, xi, [HYP["warmup_momentum"], HYP["momentum"]])
            trace.append(([g["lr"] for g in opt.param_groups], opt.param_groups[0]["momentum"], accumulate))
        opt.step()
        scheduler.step()
    return trace


@pytest.mark.parametrize(
    ("epochs", "nb", "nw", "batch", "cosine"),
    [
        (12, 40, 100, 16, False),  # warmup ends inside epoch 2
        (12, 50, 100, 16, False),  # warmup's last iteration is epoch 2's first
        (8, 25, 100, 32, False),  # ... epoch 4's first
        (10, 7, 100, 16, True),  # warmup longer than most of the run, cosine
        (6, 30, 100, 64, True),
        # batches that do not divide the nominal 64: warmup's rounded accumulation (numpy rounds half
        # to even: 64/24 -> 2.67 -> 3; the interpolation passes 1.5 and 2.5) and the final one
        (10, 30, 100, 24, False),
        (8, 20, 90, 48, False),
        (6, 20, 60, 40, True),
        (6, 20, 60, 128, False),  # 64/128 rounds to 0: accumulate stays 1
    ],
)
def test_schedule_equals_the_releases_lambdalr_trace(epochs, nb, nw, batch, cosine):
    trace = _release_schedule_trace(epochs, nb, nw, batch, cosine)
    for ni, (lrs, momentum, accumulate) in enumerate(trace):
        ours = Schedule(
            hyp=TYPED_HYP,
            epochs=epochs,
            warmup_iters=nw,
            batches_per_epoch=nb,
            cosine=cosine,
            global_batch=batch,
        ).settings(ni, ni // nb)
        assert [ours.lrs["bias"], ours.lrs["weight"], ours.lrs["norm"]] == pytest.approx(
            lrs, rel=1e-12, abs=1e-15
        ), ni
        assert ours.momentum == pytest.approx(momentum, rel=1e-12) and ours.accumulate == accumulate, ni


def test_nominal_batch_accumulation():
    assert [accumulation(b) for b in (16, 32, 64, 128, 24)] == [4, 2, 1, 1, 3]


def test_optimizer_groups_and_freeze():
    model = build_model("yolov5n", nc=2)
    assert freeze_layers(model, [0]) == 3  # conv weight, bn weight, bn bias of layer 0
    opt = build_optimizer(model, "SGD", 0.01, 0.937, 5e-4)
    groups = {g["name"]: g for g in opt.param_groups}
    assert groups["weight"]["weight_decay"] == 5e-4 and groups["bias"]["weight_decay"] == 0.0
    assert groups["norm"]["weight_decay"] == 0.0 and opt.defaults["nesterov"] is True
    n_bn = sum(1 for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)) - 1  # layer 0 frozen
    assert len(groups["norm"]["params"]) == n_bn
    assert all(p.ndim == 4 for p in groups["weight"]["params"])
    assert all(p.ndim == 1 for p in groups["bias"]["params"])
    trainable = sum(1 for p in model.parameters() if p.requires_grad)
    assert sum(len(g["params"]) for g in opt.param_groups) == trainable
    apply_settings(opt, StepSettings({"bias": 0.1, "weight": 0.02, "norm": 0.03}, 0.85, 1))
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.02, 0.03] and opt.param_groups[0][
        "momentum"
    ] == 0.85
    adam = build_optimizer(model, "AdamW", 0.001, 0.937, 5e-4)
    apply_settings(adam, StepSettings({"bias": 0.1, "weight": 0.02, "norm": 0.03}, 0.85, 1))
    assert adam.param_groups[1]["betas"] == (0.85, 0.999)


def test_amp_resolution():
    assert resolve_amp("bf16", "cpu", None).dtype == torch.bfloat16
    assert resolve_amp("fp16", "cuda", (8, 0)).dtype == torch.float16
    assert not resolve_amp("bf16", "cuda", (8, 0)).make_scaler().is_enabled()
    assert not resolve_amp("off", "cpu", None).make_scaler().is_enabled()
    with pytest.raises(ConfigError, match="--amp fp16"):
        resolve_amp("fp16", "cpu", None)


def test_ema_decay_and_float_buffers():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    ema = ModelEMA(model)
    assert ema.current_decay() == 0.0
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
        model[1].running_mean.fill_(4.0)
    ema.update(model)
    d = 0.9999 * (1 - math.exp(-1 / 2000))
    assert ema.updates == 1
    assert torch.allclose(ema.module[1].running_mean, torch.full((2,), 4.0 * (1 - d)))
    assert torch.allclose(ema.module[0].bias, d * (model[0].bias - 1) + (1 - d) * model[0].bias)
    assert ema.module[1].num_batches_tracked == model[1].num_batches_tracked


def _tiny_step(inject=None):
    torch.manual_seed(0)
    model = build_model("yolov5n", nc=2)
    criterion = YoloLoss(model, LossHyp.from_mapping(scale_loss_gains(HYP, 3, 2, 64)))
    opt = build_optimizer(model, "SGD", 0.01, 0.9, 0.0)
    amp = AmpPolicy("off", "cpu")
    return model, TrainStep(
        model,
        criterion,
        opt,
        amp.make_scaler(),
        ModelEMA(model),
        amp,
        torch.device("cpu"),
        inject_nonfinite_step=inject,
    )


def _batches(n):
    g = torch.Generator().manual_seed(0)
    targets = torch.tensor([[0, 0, 0.5, 0.5, 0.3, 0.3], [1, 1, 0.3, 0.6, 0.2, 0.4]])
    return [
        (torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8, generator=g), targets, (), (), None)
        for _ in range(n)
    ]


class FixedSchedule:
    """A schedule whose every iteration has the same settings."""

    def __init__(self, settings: StepSettings) -> None:
        self.fixed = settings

    def settings(self, iteration: int, epoch: int) -> StepSettings:
        return self.fixed


def _epoch(step, n, max_nonfinite=2, log_every=1):
    return train_one_epoch(
        step,
        _batches(n),
        epoch=0,
        first_iteration=0,
        last_optimizer_iteration=-1,
        schedule=FixedSchedule(StepSettings({"bias": 0.01, "weight": 0.01, "norm": 0.01}, 0.9, 2)),
        log_every=log_every,
        max_nonfinite_steps=max_nonfinite,
        imgsz=64,
        multi_scale=False,
        stop_requested=lambda: False,
        main=False,
        world_size=1,
    )


def test_epoch_accumulates_and_updates_ema():
    model, step = _tiny_step()
    before = {k: v.clone() for k, v in model.named_parameters()}
    ema_before = {k: v.clone() for k, v in step.ema.module.named_parameters()}
    result = _epoch(step, 4)
    assert result.iterations == 4 and result.last_optimizer_iteration == 3 and step.ema.updates == 2
    assert all(math.isfinite(v) and v > 0 for v in result.losses)
    # the optimizer moved every convolution's weights (parameters: BatchNorm's running statistics, buffers
    # that the forward pass alone updates, are not looked at), and the EMA followed them part of the way
    convs = [f"{k}.weight" for k, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)]
    params, ema = dict(model.named_parameters()), dict(step.ema.module.named_parameters())
    assert len(convs) > 50
    assert [k for k in convs if torch.equal(before[k], params[k])] == []
    assert [k for k in convs if torch.equal(ema_before[k], ema[k]) or torch.equal(ema[k], params[k])] == []


def _one_update(scaler: torch.amp.GradScaler) -> dict[str, torch.Tensor]:
    model, step = _tiny_step()
    step.scaler = scaler
    imgs, targets, *_ = _batches(1)[0]
    step.micro_step(imgs, targets, sync=True)
    step.optimizer_step()
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_a_loss_scaler_changes_nothing_but_the_scale():
    # fp16's GradScaler (here enabled on the CPU, in float32): backward on the scaled loss, the step on the
    # unscaled gradients, so the update is the unscaled one; skipping the scaling would divide it by 2**12
    plain = _one_update(torch.amp.GradScaler("cpu", enabled=False))
    scaled = _one_update(torch.amp.GradScaler("cpu", init_scale=2.0**12))
    for name, value in plain.items():
        torch.testing.assert_close(scaled[name], value, rtol=1e-4, atol=1e-6, msg=name)


def test_the_trainer_scales_the_loss_by_the_world_size_under_ddp(monkeypatch):
    from types import SimpleNamespace

    from yolov5_smddp.distributed.process_group import DistInfo
    from yolov5_smddp.train import trainer

    monkeypatch.setattr(trainer, "wrap_ddp", lambda model, device: model)  # no process group here
    model, step = _tiny_step()
    config = SimpleNamespace(sync_bn=False, compile=False, channels_last=False, inject_nonfinite_step=None)
    stack = SimpleNamespace(
        criterion=step.criterion, optimizer=step.optimizer, scaler=step.scaler, ema=step.ema
    )
    for world, expected in ((4, 4.0), (1, 1.0)):
        info = DistInfo(0, 0, world, world, 0, "127.0.0.1", 7777, "torchrun" if world > 1 else "none")
        run = SimpleNamespace(
            config=config, info=info, model=model, device=torch.device("cpu"), stack=stack, amp=step.amp
        )
        assert trainer.build_step(run).loss_multiplier == expected, world


def test_non_finite_loss_stops_the_run_with_a_clear_message():
    model, step = _tiny_step(inject=0)
    with pytest.raises(NonFiniteLossError, match="non-finite"):
        _epoch(step, 6)
    assert all(torch.isfinite(p).all() for p in model.parameters())  # no NaN reached the weights


def test_default_dataset_is_generated_once_into_place(tmp_path):
    from yolov5_smddp.train.data_wiring import default_dataset

    first = default_dataset(tmp_path)
    assert first == tmp_path / "default-dataset-v1" / "data.yaml" and first.is_file()
    stamp = first.stat().st_mtime_ns
    assert default_dataset(tmp_path) == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == ["default-dataset-v1"]  # no temporary folder left


def test_compile_plan_uses_cuda_graphs_only_for_one_batch_shape():
    from yolov5_smddp.train.engine import compile_plan

    assert compile_plan("cuda", rect=False, multi_scale=False).mode == "reduce-overhead"
    changing = compile_plan("cuda", rect=True, multi_scale=True)
    assert changing.mode == "default" and "--rect and --multi-scale change the batch shape" in changing.reason
    assert compile_plan("cuda", rect=False, multi_scale=True).reason.endswith(
        "--multi-scale changes the batch shape"
    )
    assert compile_plan("cpu", rect=False, multi_scale=False).mode == "default"
