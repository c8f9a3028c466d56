"""Mutation table: break one core mechanism at a time and check that the tests guarding it go red.

Run by hand (not in CI; minutes per row on a 2-core machine):

    python3 bench/mutation_table.py                      # every row, one at a time
    python3 bench/mutation_table.py --only ema-never-updated nms-class-agnostic
    python3 bench/mutation_table.py --list

Each row is a one-line mutation: an exact string in one file and its replacement. For each row the working
tree (tracked and untracked, not ignored files) is copied to a scratch folder, the string is replaced (the
script stops with an error when it is not found exactly once: a stale row must not pass as "killed"), and
the row's tests run inside the test image (`docker run ... yolov5-smddp-test:dev python3 -m pytest -x ...`).
pytest's exit 1 (a test failed) is "killed", exit 0 "SURVIVED"; anything else (a collection error, no test
collected, a timeout) is "ERROR", never "killed". With --baseline the same tests first run unmutated: they
must pass, or the row is "ERROR" too. Needs only python3 and Docker on the host.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str  # the mechanism it breaks
    path: str  # file, relative to the repository
    old: str  # exact text, found exactly once
    new: str
    tests: tuple[str, ...]  # pytest arguments (paths, -k ...)


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "grads-never-all-reduced",
        "every micro-step inside DDP's no_sync(): ranks never average their gradients",
        "yolov5_smddp/train/engine.py",
        "context = no_sync() if (no_sync is not None and not sync) else contextlib.nullcontext()",
        "context = no_sync() if no_sync is not None else contextlib.nullcontext()",
        ("tests/integration/test_ddp_equivalence.py", "-k", "torchrun and gloo"),
    ),
    Mutation(
        "loss-not-scaled-by-world-size",
        "the loss is not multiplied by the world size (DDP's averaging then shrinks every update)",
        "yolov5_smddp/train/engine.py",
        "loss = loss.float() * self.loss_multiplier",
        "loss = loss.float()",
        ("tests/integration/test_ddp_equivalence.py", "-k", "torchrun and gloo"),
    ),
    Mutation(
        "trainer-passes-no-world-size",
        "the trainer builds its step with loss multiplier 1 under DDP",
        "yolov5_smddp/train/optim_recipe.py",
        "    return float(info.world_size) if info.distributed else 1.0",
        "    return 1.0",
        (
            "tests/unit/test_trainer.py",
            "tests/integration/test_ddp_equivalence.py",
            "-k",
            "world_size or torchrun and gloo",
        ),
    ),
    Mutation(
        "ema-never-updated",
        "the optimizer step no longer updates the EMA",
        "yolov5_smddp/train/engine.py",
        "            self.ema.update(self.model)",
        "            pass",
        ("tests/unit/test_trainer.py",),
    ),
    Mutation(
        "lr-one-epoch-off",
        "after warmup the learning rate follows this epoch's factor instead of the previous one's",
        "yolov5_smddp/train/engine.py",
        "return epoch if epoch <= warmup_end_epoch else epoch - 1",
        "return epoch if epoch <= warmup_end_epoch else epoch",
        ("tests/unit/test_trainer.py",),
    ),
    Mutation(
        "map-iou-thresholds-shifted",
        "mAP50-95's IoU thresholds 0.55:1.0 instead of 0.5:0.95",
        "yolov5_smddp/detection/metrics.py",
        "IOU_THRESHOLDS = torch.linspace(0.5, 0.95, 10)",
        "IOU_THRESHOLDS = torch.linspace(0.55, 1.0, 10)",
        ("tests/unit/test_metrics.py",),
    ),
    Mutation(
        "nms-class-agnostic",
        "NMS suppresses across classes",
        "yolov5_smddp/detection/postprocess.py",
        "keep = batched_nms(det[:, :4], det[:, 4], det[:, 5].long(), iou_thres)",
        "keep = nms(det[:, :4], det[:, 4], iou_thres)",
        ("tests/unit/test_postprocess.py",),
    ),
    Mutation(
        "letterbox-padding-value",
        "letterbox pads with 0 instead of 114",
        "yolov5_smddp/data/letterbox.py",
        "PAD_VALUE = 114",
        "PAD_VALUE = 0",
        ("tests/unit/test_data_augment.py",),
    ),
    Mutation(
        "stale-label-cache-accepted",
        "a label cache whose label files were edited is still taken as valid",
        "yolov5_smddp/data/cache.py",
        "for i, (a, b) in enumerate(zip(cached.label_hashes, label_hashes)) if a != b]",
        "for i, (a, b) in enumerate(zip(cached.label_hashes, label_hashes)) if False]",
        ("tests/unit/test_data_cache.py",),
    ),
    Mutation(
        "sharded-val-drops-last-rank",
        "sharded validation leaves the last rank's match results out of the metrics",
        "yolov5_smddp/train/engine.py",
        "return metrics_from_state(unpack_states(all_predictions, all_targets), int(num_images))",
        "return metrics_from_state(unpack_states(all_predictions[:-1], all_targets[:-1]), int(num_images))",
        ("tests/unit/test_val_shard.py", "-k", "gloo"),
    ),
    Mutation(
        "sigterm-ignored",
        "the trainer ignores SIGTERM (spot interruption, StopTrainingJob): no checkpoint, no exit 143",
        "yolov5_smddp/train/stop_signal.py",
        "self._previous = signal.signal(signal.SIGTERM, self._handle)",
        "self._previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)",
        ("tests/integration/test_train_end_to_end.py", "-k", "sigterm_after_epoch_1"),
    ),
    Mutation(
        "anchors-not-transferred",
        "fine-tuning from a checkpoint keeps the config's anchors instead of the checkpoint's fitted ones",
        "yolov5_smddp/models/initial.py",
        "report = transfer_state(model, loaded.state_dict, detect_rows=True)",
        'report = transfer_state(model, loaded.state_dict, exclude=("anchors",), detect_rows=True)',
        ("tests/unit/test_initial.py",),
    ),
    Mutation(
        "amp-loss-scaler-skipped",
        "backward on the unscaled loss: the GradScaler then unscales gradients that were never scaled",
        "yolov5_smddp/train/engine.py",
        "self.scaler.scale(loss).sum().backward()",
        "loss.sum().backward()",
        ("tests/unit/test_trainer.py",),
    ),
    # the weak asserts issue 22 strengthened: each of these passed the old assert
    Mutation(
        "optimizer-step-skipped",
        "the optimizer never steps (only BatchNorm's running statistics change)",
        "yolov5_smddp/train/engine.py",
        "        self.scaler.step(self.optimizer)",
        "        pass",
        ("tests/unit/test_trainer.py",),
    ),
    Mutation(
        "optimizer-step-skipped-e2e",
        "the same, seen by the end-to-end run's learning check (mAP and train loss of the last epochs)",
        "yolov5_smddp/train/engine.py",
        "        self.scaler.step(self.optimizer)",
        "        pass",
        ("tests/integration/test_train_end_to_end.py", "-k", "embedded_run_writes"),
    ),
    Mutation(
        "objectness-gate-removed",
        "NMS scores every row instead of those whose objectness passes the threshold",
        "yolov5_smddp/detection/postprocess.py",
        "x = image_pred[image_pred[:, 4] > conf_thres]",
        "x = image_pred",
        ("tests/unit/test_postprocess.py",),
    ),
    Mutation(
        "throughput-total-per-rank",
        "the job's samples/s is one rank's",
        "yolov5_smddp/telemetry.py",
        '"samples_per_sec": per_gpu * self.world_size,',
        '"samples_per_sec": per_gpu,',
        ("tests/unit/test_telemetry.py",),
    ),
    Mutation(
        "phase-clock-optimizer-from-start",
        "the optimizer phase is timed from the step's start (it swallows forward/backward)",
        "yolov5_smddp/benchmarks/timing.py",
        "optimizer_s=sum(seconds(b, o) for _, b, o in self.marks),",
        "optimizer_s=sum(seconds(s, o) for s, _, o in self.marks),",
        ("tests/unit/test_bench_train.py", "-k", "phase_clock"),
    ),
    Mutation(
        "smddp-probe-wrong-module",
        "the SMDDP probe imports the package, not the torch module that registers the backend",
        "yolov5_smddp/distributed/process_group.py",
        "importlib.import_module(SMDDP_MODULE)",
        'importlib.import_module("smdistributed")',
        ("tests/unit/test_distributed.py", "-k", "smddp_importable"),
    ),
    Mutation(
        "omp-num-threads-overridden",
        "the per-rank thread cap overrides an OMP_NUM_THREADS the user (or torchrun) set",
        "yolov5_smddp/train/runtime.py",
        "    asked = threads_asked(omp_num_threads)",
        "    asked = None",
        ("tests/unit/test_runtime.py", "-k", "omp_num_threads"),
    ),
    Mutation(
        "serving-jit-optimized",
        "the endpoint lets TorchScript optimize after the first request (later answers differ in the last bits)",
        "yolov5_smddp/serving/inference.py",
        "    with torch.jit.optimized_execution(False):",
        "    with torch.jit.optimized_execution(True):",
        ("tests/unit/test_serving.py", "-k", "same_bits"),
    ),
    Mutation(
        "predict-torchscript-optimized",
        "predict's TorchScript backend lets the executor switch to its optimized graph after the first call",
        "yolov5_smddp/inference/exported_models.py",
        "        with torch.no_grad(), torch.jit.optimized_execution(False):",
        "        with torch.no_grad(), torch.jit.optimized_execution(True):",
        ("tests/unit/test_export.py", "-k", "as_exported"),
    ),
)


def copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked + untracked, not ignored), without .git."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        rel = raw.decode()
        source = REPO / rel
        if not source.is_file():  # deleted in the working tree
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def apply(tree: Path, mutation: Mutation) -> None:
    path = tree / mutation.path
    text = path.read_text()
    count = text.count(mutation.old)
    if count != 1:
        raise SystemExit(
            f"mutation {mutation.name}: {mutation.path} holds {count} copies of {mutation.old!r} (exactly 1 "
            f"expected): the row is stale, fix it"
        )
    path.write_text(text.replace(mutation.old, mutation.new))


def run_tests(tree: Path, image: str, tests: tuple[str, ...], timeout_s: int) -> tuple[int | None, str]:
    cmd = ["docker", "run", "--rm", "--shm-size", "1g", "-v", f"{tree}:/src", "-w", "/src"]
    cmd += ["-e", "PYTHONDONTWRITEBYTECODE=1", image]
    cmd += ["python3", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", *tests]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return None, out + f"\n(timed out after {timeout_s} s)"
    return proc.returncode, proc.stdout + proc.stderr


def _remove(tree: Path, image: str) -> None:
    """Files the container wrote belong to root: remove them from inside a container when we cannot."""
    shutil.rmtree(tree, ignore_errors=True)
    if tree.exists():
        subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "-v",
                f"{tree.parent}:/scratch",
                image,
                "rm",
                "-rf",
                f"/scratch/{tree.name}",
            ],
            capture_output=True,
        )


def verdict(code: int | None) -> str:
    return {0: "SURVIVED", 1: "killed"}.get(code, "ERROR")  # type: ignore[arg-type]


def run_row(mutation: Mutation, args: argparse.Namespace, scratch: Path) -> tuple[str, str, float]:
    started = time.monotonic()
    tree = Path(tempfile.mkdtemp(prefix=f"{mutation.name}-", dir=scratch))
    try:
        copy_tree(tree)
        if args.baseline:
            code, out = run_tests(tree, args.image, mutation.tests, args.timeout)
            if code != 0:
                return "ERROR", f"baseline (unmutated) did not pass (exit {code}):\n{out[-3000:]}", 0.0
        apply(tree, mutation)
        code, out = run_tests(tree, args.image, mutation.tests, args.timeout)
        result = verdict(code)
        detail = out[-3000:] if result != "killed" else _first_failure(out)
        return result, detail, time.monotonic() - started
    finally:
        _remove(tree, args.image)


def _first_failure(out: str) -> str:
    """The first failed test and the first line of what failed in it."""
    lines = out.splitlines()
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    errors = [line for line in lines if line.startswith("E ")]
    head = failed[0].split(" - ")[0] if failed else (lines[-1] if lines else "")
    return head + (f"\n    {errors[0][1:].strip()[:200]}" if errors else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--image", default=os.environ.get("YOLOV5_SMDDP_TEST_IMAGE", "yolov5-smddp-test:dev"))
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these rows only")
    parser.add_argument(
        "--jobs", type=int, default=1, help="rows at a time (default 1: the tests are CPU-bound)"
    )
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per pytest run")
    parser.add_argument("--baseline", action="store_true", help="first check the tests pass unmutated")
    parser.add_argument("--list", action="store_true", help="print the rows and exit")
    args = parser.parse_args(argv)

    names = {m.name for m in MUTATIONS}
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        parser.error(f"unknown row(s) {', '.join(unknown)}; --list shows them")
    rows = [m for m in MUTATIONS if not args.only or m.name in args.only]
    for m in rows:  # a stale row fails before anything runs
        count = (REPO / m.path).read_text().count(m.old)
        if count != 1:
            raise SystemExit(f"mutation {m.name}: {m.path} holds {count} copies of {m.old!r} (1 expected)")
    if args.list:
        for m in rows:
            print(f"{m.name:32} {m.path}: {m.what}\n{'':32} tests: {' '.join(m.tests)}")
        return 0

    scratch = Path(tempfile.mkdtemp(prefix="mutation-table-"))
    results: dict[str, tuple[str, str, float]] = {}
    try:
        with ThreadPoolExecutor(max(args.jobs, 1)) as pool:
            futures = {m.name: pool.submit(run_row, m, args, scratch) for m in rows}
            for m in rows:
                results[m.name] = futures[m.name].result()
                verdict_, detail, seconds = results[m.name]
                first, _, rest = detail.partition("\n")
                print(f"{m.name:32} {verdict_:8} {seconds:6.0f} s  {first}", flush=True)
                if verdict_ == "killed" and rest:
                    print(f"{'':50}{rest.strip()}", flush=True)
                elif verdict_ != "killed":
                    print(detail, file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print("\n| mutation | file | tests | result |\n|---|---|---|---|")
    for m in rows:
        print(f"| {m.name} | {m.path} | {' '.join(m.tests)} | {results[m.name][0]} |")
    survived = [n for n, (v, _, _) in results.items() if v != "killed"]
    print(
        f"\n{len(rows) - len(survived)} of {len(rows)} killed"
        + (f"; not killed: {', '.join(survived)}" if survived else "")
    )
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
