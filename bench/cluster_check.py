"""The Python steps of bench/gpu_cluster_check.sh; each writes one JSON file.

    python -m bench.cluster_check dataset ROOT IMGSZ N_TRAIN N_VAL
    python -m bench.cluster_check ddp2 OUT.json STEPS IMGSZ BATCH      # under torchrun --nproc_per_node 2
    python -m bench.cluster_check syncs OUT.json AMPS STEPS IMGSZ BATCH
    python -m bench.cluster_check compare-val ONE.json TWO.json OUT.json
    python -m bench.cluster_check stopped LOG OUT.json LAST.pt EPOCHS COMMAND...   # SIGTERM after epoch 1
    python -m bench.cluster_check summary WORK_DIR SUMMARY.md SUMMARY.json

ddp2: two ranks on the one GPU with Gloo carrying CUDA tensors (NCCL refuses two ranks on one device), the
trainer's DDP wrapping and TrainStep on synthetic batches; then every rank's parameter checksum, gathered
with collectives.all_gather_rows (CUDA tensors through Gloo), must be equal. syncs: the engine's
TrainStep (micro-step + optimizer step) per AMP mode with torch.cuda.set_sync_debug_mode("warn"), counting
the host syncs of each step after a warm-up (the training step is meant to have none). On a CPU (SMOKE=1)
the same code runs with Gloo on the CPU, and no sync is counted ("n/a").
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from pathlib import Path

NC = 3


def _write(path: str | Path, payload: dict) -> None:
    Path(path).write_text(json.dumps(payload, indent=1), encoding="utf-8")
    print(json.dumps(payload), flush=True)


def _step_for(model, device, amp, batch: int, imgsz: int, world: int, ddp: bool):
    from yolov5_smddp.benchmarks.train import bench_training_stack
    from yolov5_smddp.config.hyp import Hyp, load_hyp
    from yolov5_smddp.train.engine import TrainStep
    from yolov5_smddp.train.optim_recipe import wrap_ddp

    stack = bench_training_stack(
        model, Hyp.from_dict(load_hyp("scratch-low")), nc=NC, imgsz=imgsz, batch=batch * world, amp=amp
    )
    wrapped = wrap_ddp(model, device) if ddp else model
    return TrainStep(
        wrapped,
        stack.criterion,
        stack.optimizer,
        stack.scaler,
        stack.ema,
        amp,
        device,
        loss_multiplier=float(world),
    )


def _batch(batch: int, imgsz: int, seed: int):
    import torch

    from yolov5_smddp.benchmarks.inputs import synthetic_targets

    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch, 3, imgsz, imgsz), dtype=torch.uint8, generator=generator)
    return images, synthetic_targets(batch, NC, generator)


def _amp(mode: str, device):
    import torch

    from yolov5_smddp.train.engine import resolve_amp

    return resolve_amp(
        mode, device.type, torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    )


def dataset(root: str, imgsz: str, n_train: str, n_val: str) -> None:
    from yolov5_smddp.data.synthetic import make_default_dataset

    print(make_default_dataset(Path(root), n_train=int(n_train), n_val=int(n_val), imgsz=int(imgsz), seed=3))


def ddp2(out: str, steps: str, imgsz: str, batch: str) -> None:
    import torch

    from yolov5_smddp.distributed import collectives, process_group
    from yolov5_smddp.models.yolo import build_model

    info = process_group.detect_dist_info(os.environ)
    cuda = torch.cuda.is_available()
    device = process_group.init(info, "gloo", "cuda" if cuda else "cpu", 300.0)
    torch.manual_seed(0)  # the same initial weights on both ranks (DDP broadcasts rank 0's anyway)
    model = build_model("yolov5n", nc=NC).to(device).train()
    step = _step_for(model, device, _amp("auto", device), int(batch), int(imgsz), info.world_size, ddp=True)
    losses = []
    for k in range(int(steps)):
        images, targets = _batch(int(batch), int(imgsz), seed=1000 * info.rank + k)
        losses.append(step.micro_step(images, targets, sync=True).sum())
        step.optimizer_step()
    flat = torch.cat([p.detach().double().flatten() for p in model.parameters()])
    checksum = torch.stack([flat.sum(), (flat * flat).sum()]).reshape(1, 2)
    sums = collectives.all_gather_rows(checksum.to(device))
    loss = float(torch.stack(losses).sum().cpu())
    if info.rank == 0:
        equal = all(torch.equal(s, sums[0]) for s in sums)
        _write(
            out,
            {
                "ranks": info.world_size,
                "backend": "gloo",
                "device": str(device),
                "amp": step.amp.mode,
                "steps": int(steps),
                "loss_finite": math.isfinite(loss),
                "params_equal_on_all_ranks": equal,
                "ok": equal and math.isfinite(loss),
            },
        )
    del step  # the DDP wrapper: garbage from here, so leaving the group ends its backend (process_group.py)
    process_group.teardown(0)


def syncs(out: str, amps: str, steps: str, imgsz: str, batch: str) -> None:
    import torch

    from yolov5_smddp.models.yolo import build_model

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    rows = []
    for mode in amps.split(","):
        torch.manual_seed(0)
        model = build_model("yolov5n", nc=NC).to(device).train()
        step = _step_for(model, device, _amp(mode, device), int(batch), int(imgsz), 1, ddp=False)
        images, targets = _batch(int(batch), int(imgsz), seed=7)
        images, targets = images.to(device), targets.to(device)
        for _ in range(2):  # warm-up: allocations, cuDNN, the optimizer's lazy state
            step.micro_step(images, targets, sync=True)
            step.optimizer_step()
        counted = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("warn")
            for _ in range(int(steps)):
                step.micro_step(images, targets, sync=True)
                step.optimizer_step()
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
                counted = sum("synchroniz" in str(w.message) for w in caught)
        where = sorted(
            {f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)}
        )
        rows.append(
            {
                "amp": step.amp.mode,
                "steps": int(steps),
                "host_syncs": counted,
                "per_step": None if counted is None else counted / int(steps),
                "where": where[:10],
            }
        )
    _write(out, {"device": str(device), "rows": rows, "ok": all(r["host_syncs"] in (None, 0) for r in rows)})


def stopped(log: str, out: str, ckpt: str, epochs: str, *cmd: str) -> None:
    """Run a training command and SIGTERM it (its process group: torchrun and its worker) at the end of
    epoch 1 of `epochs` (the metric line "epoch=1 epochs=N"); ok when its last.pt is part-way (after epoch
    1, or a later one when a busy host read the line late, but before the last): a checkpoint a resume
    continues (a finished run is refused by --resume)."""
    import signal
    import subprocess

    import torch

    marker = f"epoch=1 epochs={epochs}"
    with open(log, "w", encoding="utf-8") as sink:
        proc = subprocess.Popen(
            list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        signalled = False
        for line in proc.stdout:
            sink.write(line)
            if not signalled and line.startswith(marker):
                os.killpg(proc.pid, signal.SIGTERM)
                signalled = True
        code = proc.wait()
    epoch = None
    if Path(ckpt).is_file():
        epoch = int(torch.load(ckpt, map_location="cpu", weights_only=True)["epoch"])
    _write(
        out,
        {
            "signalled_after_epoch_1": signalled,
            "exit": code,
            "checkpoint_epoch": epoch,
            "ok": signalled and epoch is not None and 1 <= epoch < int(epochs),
        },
    )


VAL_KEYS = ("precision", "recall", "mAP50", "mAP50-95")


def compare_val(one: str, two: str, out: str) -> None:
    a, b = (json.loads(Path(p).read_text()) for p in (one, two))
    diffs = {k: abs(float(a[k]) - float(b[k])) for k in VAL_KEYS}
    same_images = a.get("images") == b.get("images")
    _write(
        out,
        {
            "one_rank": {k: a[k] for k in VAL_KEYS},
            "two_ranks": {k: b[k] for k in VAL_KEYS},
            "max_abs_diff": max(diffs.values()),
            "images": [a.get("images"), b.get("images")],
            "ok": same_images and max(diffs.values()) <= 1e-6,
        },
    )


def summary(work: str, md: str, js: str) -> None:
    """checks.tsv (name, exit code, seconds) and each check's JSON → one table (Markdown) and one JSON."""
    folder = Path(work)
    checks = []
    for line in (folder / "checks.tsv").read_text().splitlines():
        name, rc, seconds, what = line.split("\t")
        detail_path = folder / f"{name}.json"
        detail = json.loads(detail_path.read_text()) if detail_path.is_file() else {}
        ok = int(rc) == 0 and detail.get("ok", True)
        checks.append(
            {"check": name, "what": what, "exit": int(rc), "seconds": int(seconds), "ok": ok, **detail}
        )
    environment = json.loads((folder / "environment.json").read_text())
    lines = [f"# GPU cluster check: {environment['gpu']}, torch {environment['torch']}", ""]
    lines += ["| check | what | exit | s | result |", "|---|---|---|---|---|"]
    for c in checks:
        lines.append(
            f"| {c['check']} | {c['what']} | {c['exit']} | {c['seconds']} | {'ok' if c['ok'] else 'FAILED'} |"
        )
    for c in checks:
        if c["check"] == "syncs" and "rows" in c:
            lines += ["", "| amp | steps | host syncs | per step |", "|---|---|---|---|"]
            for r in c["rows"]:
                count = "n/a (CPU)" if r["host_syncs"] is None else r["host_syncs"]
                per = "n/a" if r["per_step"] is None else f"{r['per_step']:.2f}"
                lines.append(f"| {r['amp']} | {r['steps']} | {count} | {per} |")
        if c["check"] == "val" and "one_rank" in c:
            lines += [
                "",
                f"val at 1 and 2 ranks: max |diff| {c['max_abs_diff']:.2e} over {', '.join(VAL_KEYS)}",
            ]
    text = "\n".join(lines) + "\n"
    Path(md).write_text(text, encoding="utf-8")
    Path(js).write_text(
        json.dumps({"environment": environment, "checks": checks}, indent=1), encoding="utf-8"
    )
    print(text, end="")


def environment(out: str) -> None:
    import torch

    cuda = torch.cuda.is_available()
    _write(
        out,
        {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(0) if cuda else "no GPU (SMOKE)",
            "capability": list(torch.cuda.get_device_capability(0)) if cuda else None,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        },
    )


COMMANDS = {
    "dataset": dataset,
    "ddp2": ddp2,
    "syncs": syncs,
    "compare-val": compare_val,
    "stopped": stopped,
    "summary": summary,
    "environment": environment,
}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
