"""--compile under gradient accumulation and fixed shapes (issue 52, item 2).

On the CPU torch.compile runs with backend aot_eager (no C++ compiler, no CUDA graphs): the engine's
TrainStep gives the eager gradients after 4 accumulated micro-steps, keeps its gradients allocated (zeroed
in place) when CUDA graphs are on, and a fixed-shape run compiles once over two epochs because the partial
last batch is dropped. The CUDA-graph overwrite itself needs a GPU: bench/gpu_all.sh compares compiled
(reduce-overhead) and eager gradients there."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from yolov5_smddp.train.compile_settings import compile_settings, fixed_shape_compile
from yolov5_smddp.train.engine import AmpPolicy, TrainStep


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.SiLU(), nn.Conv2d(4, 2, 1))


def _criterion(preds, targets):
    loss = preds.float().square().mean() + targets.sum() * 0
    return loss, torch.stack([loss.detach()] * 3)


def _step(net: nn.Module, model: nn.Module, *, keep_grads: bool) -> TrainStep:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    amp = AmpPolicy("off", "cpu")
    return TrainStep(
        net, _criterion, optimizer, amp.make_scaler(), None, amp, torch.device("cpu"), keep_grads=keep_grads
    )


def _batches(n: int, size: int = 2):
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (size, 3, 8, 8), dtype=torch.uint8, generator=gen) for _ in range(n)]


def test_settings_for_cuda_graphs_and_fixed_shapes():
    on = compile_settings(compile=True, mode="reduce-overhead", rect=False, multi_scale=False, accumulate=4)
    assert (on.cudagraphs, on.keep_grads, on.mark_steps, on.drop_last) == (True, True, True, True)
    assert "4 micro-steps" in on.reason and "drops" in on.reason
    rect = compile_settings(compile=True, mode="default", rect=True, multi_scale=False, accumulate=1)
    assert (rect.keep_grads, rect.drop_last) == (False, False)
    off = compile_settings(compile=False, mode="", rect=False, multi_scale=False, accumulate=4)
    assert not (off.keep_grads or off.drop_last or off.mark_steps)
    assert fixed_shape_compile(True, False, False) and not fixed_shape_compile(False, False, False)


@pytest.mark.filterwarnings("ignore")
def test_compiled_gradients_equal_eager_after_four_accumulated_micro_steps():
    eager_model = _model()
    compiled_model = copy.deepcopy(eager_model)
    eager = _step(eager_model, eager_model, keep_grads=False)
    compiled = _step(torch.compile(compiled_model, backend="aot_eager"), compiled_model, keep_grads=True)
    targets = torch.zeros((0, 6))
    for imgs in _batches(4):
        eager.micro_step(imgs, targets, sync=True)
        compiled.micro_step(imgs, targets, sync=True)
    for a, b in zip(eager_model.parameters(), compiled_model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)


def test_kept_gradients_stay_allocated_and_are_zeroed_in_place():
    model = _model()
    step = _step(model, model, keep_grads=True)
    before = [p.grad.data_ptr() for p in model.parameters()]  # allocated before the first micro-step
    step.micro_step(_batches(1)[0], torch.zeros((0, 6)), sync=True)
    step.optimizer_step()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)  # never set to None: no backward takes a graph's buffer
    assert [g.data_ptr() for g in grads] == before
    assert all(bool((g == 0).all()) for g in grads)


@pytest.mark.filterwarnings("ignore")
def test_a_fixed_shape_run_compiles_once_over_two_epochs():
    compiles = []

    def counting(gm, example_inputs):
        compiles.append(tuple(example_inputs[0].shape) if example_inputs else ())
        return gm.forward

    torch._dynamo.reset()
    model = _model()
    step = _step(torch.compile(model, backend=counting), model, keep_grads=False)
    data = torch.utils.data.TensorDataset(torch.cat(_batches(5)))  # 10 images, batch 4: 4, 4, (2)
    settings = compile_settings(compile=True, mode="default", rect=False, multi_scale=False, accumulate=1)
    loader = torch.utils.data.DataLoader(data, batch_size=4, drop_last=settings.drop_last)
    for _epoch in range(2):
        for (imgs,) in loader:
            step.micro_step(imgs, torch.zeros((0, 6)), sync=True)
    assert len(compiles) == 1, compiles
    torch._dynamo.reset()
