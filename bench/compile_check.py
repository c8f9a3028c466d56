"""The compiled-vs-eager phase of bench/gpu_all.sh (issue 52, item 2).

    python -m bench.compile_check OUT.json DEVICE CFG IMGSZ BATCH ITERS [CPU_BACKEND]

The engine's TrainStep twice from the same weights: eager, and compiled as `train --compile` compiles it
(CUDA: mode reduce-overhead, CUDA graphs, with compile_settings' kept gradients and step marks; CPU: backend
aot_eager, which needs no C++ compiler). Both take the same 4 batches as 4 accumulated micro-steps; the
gradients must then agree (fp32, largest relative difference of a parameter's gradient <= 1e-3; the
CUDA-graph overwrite bug shows as 0.75: a quarter of the gradient). Then ITERS optimizer steps of 4
micro-steps each are timed for both (the first compiled step, compiling, apart). Capturing the whole step
(optimizer and EMA too) is not tried here: it pays only once this forward/backward capture is measured.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

NC = 3
MICRO_STEPS = 4
GRAD_RTOL = 1e-3


def run(
    out: str, device: str, cfg: str, imgsz: str, batch: str, iters: str, cpu_backend: str = "aot_eager"
) -> None:
    import torch

    from bench.cluster_check import _batch
    from yolov5_smddp.benchmarks.train import bench_training_stack
    from yolov5_smddp.config.hyp import Hyp, load_hyp
    from yolov5_smddp.models.yolo import build_model
    from yolov5_smddp.train.compile_settings import compile_settings
    from yolov5_smddp.train.engine import TrainStep, compile_plan, resolve_amp

    dev = torch.device(device)
    imgsz_i, batch_i, iters_i = int(imgsz), int(batch), int(iters)
    plan = compile_plan(dev.type, rect=False, multi_scale=False)
    settings = compile_settings(
        compile=True, mode=plan.mode, rect=False, multi_scale=False, accumulate=MICRO_STEPS
    )
    amp = resolve_amp("off", dev.type, None)
    torch.manual_seed(0)
    eager_model = build_model(f"{cfg}.yaml", nc=NC).to(dev).train()
    compiled_model = copy.deepcopy(eager_model)

    def step_for(model, net, keep: bool) -> TrainStep:
        stack = bench_training_stack(
            model,
            Hyp.from_dict(load_hyp("scratch-low")),
            nc=NC,
            imgsz=imgsz_i,
            batch=batch_i * MICRO_STEPS,
            amp=amp,
        )
        return TrainStep(
            net,
            stack.criterion,
            stack.optimizer,
            stack.scaler,
            stack.ema,
            amp,
            dev,
            keep_grads=keep and settings.keep_grads,
            mark_steps=keep and settings.mark_steps,
        )

    if dev.type == "cuda":
        net = torch.compile(compiled_model, mode=plan.mode)
        how = f"mode {plan.mode}"
    else:
        net = torch.compile(compiled_model, backend=cpu_backend)  # SMOKE: "eager" (Dynamo only, quicker)
        how = f"backend {cpu_backend} (CPU)"
    eager = step_for(eager_model, eager_model, keep=False)
    compiled = step_for(compiled_model, net, keep=True)
    batches = [tuple(t.to(dev) for t in _batch(batch_i, imgsz_i, seed=k)) for k in range(MICRO_STEPS)]

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    started = time.perf_counter()
    for imgs, targets in batches:  # compiles on the first, replays on the other three
        compiled.micro_step(imgs, targets, sync=False)
    sync()
    first_s = time.perf_counter() - started
    for imgs, targets in batches:
        eager.micro_step(imgs, targets, sync=False)
    worst = 0.0
    for a, b in zip(eager_model.parameters(), compiled_model.parameters()):
        if a.grad is None:
            continue
        ref = float(a.grad.float().norm())
        worst = max(worst, float((b.grad.float() - a.grad.float()).norm()) / max(ref, 1e-12))
    eager.optimizer_step()
    compiled.optimizer_step()

    def timed(step: TrainStep) -> float:
        sync()
        began = time.perf_counter()
        for _ in range(iters_i):
            for imgs, targets in batches:
                step.micro_step(imgs, targets, sync=False)
            step.optimizer_step()
        sync()
        return 1e3 * (time.perf_counter() - began) / max(iters_i * MICRO_STEPS, 1)

    eager_ms, compiled_ms = timed(eager), timed(compiled)
    rows = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "compiled": how,
        "settings": settings.reason,
        "cfg": cfg,
        "imgsz": imgsz_i,
        "batch": batch_i,
        "micro_steps": MICRO_STEPS,
        "grad_max_rel_diff": worst,
        "grads_equal": worst <= GRAD_RTOL,
        "first_compiled_s": first_s,
        "eager_ms_per_micro_step": eager_ms,
        "compiled_ms_per_micro_step": compiled_ms,
        "speedup": eager_ms / compiled_ms if compiled_ms else None,
        "ok": worst <= GRAD_RTOL,
    }
    for key, value in rows.items():
        print(f"{key:<28}{value:>14.4g}" if isinstance(value, float) else f"{key:<28}{value!s:>14}")
    Path(out).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    run(*sys.argv[1:])
