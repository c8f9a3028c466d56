"""The fused optimizer step (issue 39) against the step it replaced, written out here: the same
parameters, momentum and EMA after several steps; a non-finite step skipped on the device; no host sync
in the fp16 path; a step whose operator count does not grow with the number of tensors."""

from __future__ import annotations

import math

import pytest
import torch

from yolov5_smddp.benchmarks.opcount import count_operators
from yolov5_smddp.config.hyp import load_hyp
from yolov5_smddp.detection.loss import LossHyp, YoloLoss, scale_loss_gains
from yolov5_smddp.models.yolo import build_model
from yolov5_smddp.train.ema import ModelEMA
from yolov5_smddp.train.engine import AmpPolicy, TrainStep
from yolov5_smddp.train.optim_recipe import build_optimizer

HYP = load_hyp("scratch-low")
STEPS = 3


def _batches():
    g = torch.Generator().manual_seed(0)
    targets = torch.tensor([[0, 0, 0.5, 0.5, 0.3, 0.3], [1, 1, 0.3, 0.6, 0.2, 0.4]])
    return [
        (torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8, generator=g), targets) for _ in range(STEPS)
    ]


def _model():
    torch.manual_seed(0)
    return build_model("yolov5n", nc=2).train()


def _step(model, scaler=None, inject=None):
    amp = AmpPolicy("off", "cpu")
    return TrainStep(
        model,
        YoloLoss(model, LossHyp.from_mapping(scale_loss_gains(HYP, 3, 2, 64))),
        build_optimizer(model, "SGD", 0.01, 0.9, 5e-4),
        scaler or amp.make_scaler(),
        ModelEMA(model),
        amp,
        torch.device("cpu"),
        inject_nonfinite_step=inject,
    )


class ReferenceStep:
    """The optimizer step before issue 39: clip over a per-tensor norm, a per-tensor non-finite guard
    (zeroed gradients), the single-tensor SGD, and an EMA that walks both state_dicts."""

    def __init__(self, model):
        self.model, self.params = model, [p for p in model.parameters() if p.requires_grad]
        self.criterion = YoloLoss(model, LossHyp.from_mapping(scale_loss_gains(HYP, 3, 2, 64)))
        self.optimizer = build_optimizer(model, "SGD", 0.01, 0.9, 5e-4)
        for group in self.optimizer.param_groups:
            group["fused"], group["foreach"] = False, False
        self.ema, self.updates = ModelEMA(model).module, 0

    def __call__(self, imgs, targets):
        loss, _ = self.criterion(self.model(imgs.float() / 255.0), targets)
        loss.sum().backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params, 10.0, foreach=False)
        keep = torch.isfinite(norm).float()
        for p in self.params:
            if p.grad is not None:
                p.grad.mul_(keep).nan_to_num_(0.0, 0.0, 0.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1
        d = 0.9999 * (1 - math.exp(-self.updates / 2000))
        source = self.model.state_dict()
        with torch.no_grad():
            for key, value in self.ema.state_dict().items():
                if value.is_floating_point():
                    value.lerp_(source[key], 1 - d)
                else:
                    value.copy_(source[key])
        return loss.detach()


def _close(got, want, what):
    for (name, g), w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6, msg=f"{what} {name}")


def test_the_fused_step_equals_the_reference_step_after_several_steps():
    ours_model, ref_model = _model(), _model()
    ours, ref = _step(ours_model), ReferenceStep(ref_model)
    for imgs, targets in _batches():
        items = ours.micro_step(imgs, targets, sync=True)
        ours.optimizer_step()
        ref_loss = ref(imgs, targets)
        torch.testing.assert_close(items.sum() * 2, ref_loss.reshape(()), rtol=1e-5, atol=0)  # loss * batch
    named = list(ours_model.named_parameters())
    _close(named, [p for p in ref_model.parameters()], "parameter")
    _close(
        [(n, ours.optimizer.state[p]["momentum_buffer"]) for n, p in named],
        [ref.optimizer.state[p]["momentum_buffer"] for p in ref_model.parameters()],
        "momentum",
    )
    _close(list(ours.ema.module.state_dict().items()), list(ref.ema.state_dict().values()), "ema")
    moved = [n for (n, p), q in zip(named, _model().parameters()) if not torch.equal(p, q)]
    assert len(moved) > 0.9 * len(named)  # the comparison is not vacuous (a few biases get no gradient)


def test_a_non_finite_step_is_skipped_on_the_device():
    """A NaN loss at the first step: parameters and momentum stay as they were (no uninitialised
    buffers from the fused kernel), the device counter says 1; the next finite step trains as a first."""
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    step = _step(model, inject=0)
    (imgs, targets), second = _batches()[:2]
    step.micro_step(imgs, targets, sync=True)
    step.optimizer_step()
    assert step.nonfinite_run.item() == 1
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert all(
        torch.equal(s["momentum_buffer"], torch.zeros_like(p)) for p, s in step.optimizer.state.items()
    )
    step.inject_nonfinite_step = None
    step.micro_step(*second, sync=True)
    step.optimizer_step()
    assert step.nonfinite_run.item() == 0
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert sum(not torch.equal(p, b) for p, b in zip(model.parameters(), before)) > 0.9 * len(before)


def test_the_fp16_path_reads_nothing_back_from_the_device(monkeypatch):
    """GradScaler hands found_inf to the fused step on the device; the unfused path would call .item()."""
    step = _step(_model(), scaler=torch.amp.GradScaler("cpu", init_scale=2.0**12))
    imgs, targets = _batches()[0]
    step.micro_step(imgs, targets, sync=True)

    def no_sync(self, *args, **kwargs):
        raise AssertionError("host sync in the optimizer step")

    monkeypatch.setattr(torch.Tensor, "item", no_sync)
    monkeypatch.setattr(torch.Tensor, "tolist", no_sync)
    monkeypatch.setattr(torch.Tensor, "__bool__", no_sync)
    step.optimizer_step()
    monkeypatch.undo()
    assert step.nonfinite_run.item() == 0 and step.scaler.get_scale() == 2.0**12


def test_the_optimizer_step_does_not_loop_over_tensors():
    """Clip, guard, update, zero_grad and EMA in a few dozen operators for yolov5n's 177+ tensors (the
    per-tensor step dispatched over 3,000)."""
    model = _model()
    step = _step(model)
    imgs, targets = _batches()[0]
    step.micro_step(imgs, targets, sync=True)
    tensors = len(list(model.parameters())) + len(list(model.buffers()))
    ops = count_operators(step.optimizer_step).total
    assert tensors > 150 and ops < 40, ops


def test_ema_pairs_once_and_follows_a_new_source():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    ema = ModelEMA(model)
    ema.update(model)
    other = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    with torch.no_grad():
        for p in other.parameters():
            p.fill_(3.0)
    other[1].num_batches_tracked.fill_(7)
    ema.update(other)  # another module: paired anew, not the first one's tensors
    d = ema.current_decay()
    assert ema.module[1].num_batches_tracked.item() == 7
    assert torch.allclose(ema.module[1].weight, torch.ones(2) * d + 3.0 * (1 - d))


def test_ema_refuses_a_model_of_another_precision():
    model = torch.nn.Linear(2, 2)
    ema = ModelEMA(model)
    with pytest.raises(ValueError, match="weight is torch.float16"):
        ema.update(torch.nn.Linear(2, 2).half())


@pytest.mark.slow
def test_the_compiled_step_equals_the_eager_step():
    """torch.compile's graph capture of forward and backward (AOTAutograd; the aot_eager backend runs
    the captured graphs without generating code, so this runs without a compiler) trains as the eager
    step: same loss, same parameters after two steps."""
    eager_model, compiled_model = _model(), _model()
    eager, compiled = _step(eager_model), _step(compiled_model)
    compiled.model = torch.compile(compiled_model, backend="aot_eager")
    for imgs, targets in _batches()[:2]:
        want = eager.micro_step(imgs, targets, sync=True)
        got = compiled.micro_step(imgs, targets, sync=True)
        eager.optimizer_step()
        compiled.optimizer_step()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    _close(list(compiled_model.named_parameters()), list(eager_model.parameters()), "parameter")
