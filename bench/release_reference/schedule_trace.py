"""Trace a trainer's optimisation schedule, one line per optimizer step (issue 27): run a training command
in this process with hooks that record, at every optimizer step, each parameter group's lr, momentum,
weight decay and size, the micro-steps (backward calls) since the previous step, and after every EMA
update its update count and decay. The same hooks serve both trainers (the release's `yolov5.train` in
the throwaway image, ours `yolov5_smddp train`), so any difference in the traces is a difference in the
trainers, not in the tracing.

  schedule_trace.py run OUT.jsonl -- -m MODULE ARGS...     train with the hooks, write the trace
  schedule_trace.py compare A.jsonl B.jsonl [--batches N]  the first differences, and per-epoch summaries

Groups are named by what they hold, as both trainers build them: "bias" (1-d biases), "norm" (BatchNorm
weights, no weight decay) and "weight" (the rest), told apart by their weight decay and by the shapes of
their tensors, not by their order.
"""

from __future__ import annotations

import argparse
import json
import math
import runpy
import sys
from pathlib import Path


def _group_name(group: dict) -> str:
    params = group["params"]
    if group.get("weight_decay", 0.0) > 0:
        return "weight"
    # no decay: BatchNorm weights or biases; both are 1-d, so tell them apart by identity with the modules
    return _KIND.get(id(params[0]), "nodecay") if params else "empty"


_KIND: dict[int, str] = {}


def _learn_kinds() -> None:
    """Map parameter ids to "bias"/"norm" by walking every live nn.Module's direct parameters."""
    import gc

    from torch import nn

    for obj in gc.get_objects():
        if isinstance(obj, nn.Module):
            for name, p in obj.named_parameters(recurse=False):
                if name == "bias":
                    _KIND.setdefault(id(p), "bias")
                elif name == "weight" and isinstance(obj, nn.modules.batchnorm._BatchNorm):
                    _KIND[id(p)] = "norm"


def _install(out_path: Path) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    out = out_path.open("w")
    state = {"backward": 0, "backward_at_last_step": 0, "steps": 0}

    original_backward = torch.autograd.backward

    def counting_backward(*args, **kwargs):
        state["backward"] += 1
        return original_backward(*args, **kwargs)

    torch.autograd.backward = counting_backward

    def before_step(optimizer, args, kwargs) -> None:
        if not _KIND:
            _learn_kinds()
        groups = {}
        for group in optimizer.param_groups:
            name = _group_name(group)
            momentum = group.get("momentum", group.get("betas", (None,))[0])
            groups[name] = {
                "lr": group["lr"],
                "momentum": momentum,
                "weight_decay": group.get("weight_decay", 0.0),
                "nesterov": group.get("nesterov"),
                "tensors": len(group["params"]),
                "elements": sum(p.numel() for p in group["params"]),
            }
        state["steps"] += 1
        record = {
            "event": "step",
            "step": state["steps"],
            "microstep": state["backward"],
            "accumulated": state["backward"] - state["backward_at_last_step"],
            "optimizer": type(optimizer).__name__,
            "groups": groups,
        }
        state["backward_at_last_step"] = state["backward"]
        out.write(json.dumps(record) + "\n")

    register_optimizer_step_pre_hook(before_step)

    def wrap_ema(cls, decay_of) -> None:
        original = cls.update

        def update(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            out.write(
                json.dumps(
                    {
                        "event": "ema",
                        "step": state["steps"],
                        "updates": int(self.updates),
                        "decay": decay_of(self),
                    }
                )
                + "\n"
            )
            return result

        cls.update = update

    try:  # the release (only in the throwaway image)
        from yolov5.utils.torch_utils import ModelEMA as ReleaseEMA

        wrap_ema(ReleaseEMA, lambda ema: float(ema.decay(ema.updates)))
    except ImportError:
        pass
    try:
        from yolov5_smddp.train.ema import ModelEMA as OurEMA

        wrap_ema(OurEMA, lambda ema: float(ema.current_decay()))
    except ImportError:
        pass

    import atexit

    atexit.register(out.close)


def _run(args: argparse.Namespace) -> int:
    command = args.command
    if command[:1] == ["--"]:
        command = command[1:]
    if len(command) < 2 or command[0] != "-m":
        print("usage: schedule_trace.py run OUT.jsonl -- -m MODULE ARGS...", file=sys.stderr)
        return 2
    _install(Path(args.out))
    sys.argv = [command[1], *command[2:]]
    try:
        runpy.run_module(command[1], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        return int(stop.code or 0) if not isinstance(stop.code, str) else 1
    return 0


def _load(path: str) -> tuple[list[dict], list[dict]]:
    steps, emas = [], []
    for line in Path(path).read_text().splitlines():
        record = json.loads(line)
        (steps if record["event"] == "step" else emas).append(record)
    return steps, emas


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def _compare(args: argparse.Namespace) -> int:
    (steps_a, ema_a), (steps_b, ema_b) = _load(args.a), _load(args.b)
    print(f"optimizer steps: A {len(steps_a)}, B {len(steps_b)}; EMA updates: A {len(ema_a)}, B {len(ema_b)}")
    shown = 0
    for a, b in zip(steps_a, steps_b):
        diffs = []
        if a["microstep"] != b["microstep"] or a["accumulated"] != b["accumulated"]:
            diffs.append(
                f"microstep {a['microstep']}/{b['microstep']} accumulated {a['accumulated']}/{b['accumulated']}"
            )
        for name in sorted(set(a["groups"]) | set(b["groups"])):
            ga, gb = a["groups"].get(name), b["groups"].get(name)
            if ga is None or gb is None:
                diffs.append(f"group {name} only in {'B' if ga is None else 'A'}")
                continue
            for key in ("lr", "momentum", "weight_decay", "tensors", "elements", "nesterov"):
                if not _close(ga[key], gb[key]) if isinstance(ga[key], float) else ga[key] != gb[key]:
                    diffs.append(f"{name}.{key} {ga[key]!r}/{gb[key]!r}")
        if diffs:
            print(f"step {a['step']}: " + "; ".join(diffs))
            shown += 1
            if shown >= args.show:
                print("...")
                break
    for a, b in zip(ema_a, ema_b):
        if a["updates"] != b["updates"] or not _close(a["decay"], b["decay"]):
            print(
                f"first EMA difference at update {a['updates']}/{b['updates']}: decay {a['decay']}/{b['decay']}"
            )
            break
    if args.batches:
        print(
            f"per epoch ({args.batches} micro-steps each): steps A/B, last lr weight A/B, last EMA decay A/B"
        )
        epochs = max(s["microstep"] for s in steps_a + steps_b) // args.batches + 1
        for epoch in range(epochs):
            row = []
            for steps, emas in ((steps_a, ema_a), (steps_b, ema_b)):
                mine = [s for s in steps if (s["microstep"] - 1) // args.batches == epoch]
                last = mine[-1]["groups"].get("weight", {}).get("lr") if mine else None
                step_ids = {s["step"] for s in mine}
                decay = [e["decay"] for e in emas if e["step"] in step_ids]
                row.append((len(mine), last, decay[-1] if decay else None))
            (na, la, da), (nb, lb, db) = row
            print(f"  epoch {epoch + 1:>3}: {na:>4}/{nb:<4} {la!s:>12}/{lb!s:<12} {da!s:>10}/{db!s:<10}")
    print("no differences" if shown == 0 else f"{shown} steps differ")
    return 0 if shown == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run")
    run.add_argument("out")
    run.add_argument("command", nargs=argparse.REMAINDER)
    compare = sub.add_parser("compare")
    compare.add_argument("a")
    compare.add_argument("b")
    compare.add_argument("--batches", type=int, default=0, help="micro-steps per epoch, for the epoch table")
    compare.add_argument("--show", type=int, default=20)
    args = parser.parse_args()
    return _run(args) if args.what == "run" else _compare(args)


if __name__ == "__main__":
    sys.exit(main())
