#!/usr/bin/env bash
# Issue 39's side-by-side on one GPU: our training step (eager, channels_last on/off, bf16/fp16; and
# torch.compile reduce-overhead = CUDA graphs) against the YOLOv5 release v7.0's step (its model, loss,
# AMP fp16, SGD, EMA: bench/release_reference/release_step.py), same GPU, batch and image size, in one
# call. Rows: yolov5s batch 16 and 64, yolov5x batch 48, at 640 px. Prints img/s, step ms, MFU,
# operators per step, host ms per step and the ratio to the release per row.
#
#   bash bench/gpu_side_by_side.sh [RESULTS_DIR]     # default: $OUT, else ./bench-results
#
# Needs python3 with torch (CUDA), numpy and PyYAML, nothing else: the release's files come from
# bench/release_reference/release_src/ (git-ignored; bench/release_reference/fetch_release.sh fills it where
# PyPI is reachable, and the folder travels with the checkout); packages it imports but its step never uses
# get inert stand-ins. Without that folder the release rows are skipped, with a line saying so.
# At most 8 files in RESULTS_DIR: 4 JSON of ours, 2 of the release, summary.txt, side_by_side.log.
# Each run has its own time limit; the whole fits about 8 minutes on an H100/H200.
# SMOKE=1 runs it end to end on the CPU at 64 px, batch 2, one step, yolov5n/yolov5s in place of
# yolov5s/yolov5x and AMP off in place of bf16/fp16 (to check the script itself).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
results="${1:-${OUT:-$repo/bench-results}}"
mkdir -p "$results"
exec > >(tee "$results/side_by_side.log") 2>&1
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
release_src="$repo/bench/release_reference/release_src"
start=$SECONDS

device=cuda imgsz=640 iters="${ITERS:-10}" warmup="${WARMUP:-3}" amps=bf16,fp16 release_amp=fp16
s_cfg=yolov5s x_cfg=yolov5x s_batches=16,64 x_batch=48 limit_eager=100 limit_compiled=170 limit_release=75
if [ "${SMOKE:-0}" = 1 ]; then  # fp16 needs CUDA; the release runs without AMP on the CPU; smaller models
    device=cpu imgsz=64 iters=1 warmup=1 amps=off release_amp=off s_cfg=yolov5n x_cfg=yolov5s
    s_batches=2 x_batch=2 limit_eager=600 limit_compiled=900 limit_release=600
fi

if ! "$python" - <<'EOF'
import importlib.util, os, sys
import torch
missing = [m for m in ("numpy", "yaml") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"side_by_side: missing Python modules {missing}; the model code needs them")
if os.environ.get("SMOKE") != "1" and not torch.cuda.is_available():
    sys.exit("side_by_side: torch sees no CUDA device")
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {gpu}")
EOF
then
    exit 1
fi

status=0
timed() {  # timed NAME LIMIT COMMAND...: one run with its own time limit; its output goes to the log
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s, elapsed $((SECONDS - start))s)"
    timeout "$limit" "$@"
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "!! $name failed or ran out of time (exit $rc)"
        status=1
    fi
}
ours() {  # ours NAME CFG BATCHES CHANNELS_LAST LIMIT [EXTRA...]
    local name=$1 cfg=$2 batches=$3 cl=$4 limit=$5
    shift 5
    timed "$name" "$limit" "$python" -m yolov5_smddp bench train --device "$device" --cfg "$cfg.yaml" \
        --imgsz "$imgsz" --batch-per-gpu "$batches" --amp "$amps" --channels-last "$cl" --loader device \
        --data synthetic --iters "$iters" --warmup "$warmup" --json "$results/$name.json" "$@"
}

ours "ours_${s_cfg}_eager" "$s_cfg" "$s_batches" on,off "$limit_eager"
ours "ours_${x_cfg}_eager" "$x_cfg" "$x_batch" on "$limit_eager"
# compiled: the first step compiles (first_step_ms); reduce-overhead on CUDA (engine.compile_plan)
ours "ours_${s_cfg}_compiled" "$s_cfg" "$s_batches" on "$limit_compiled" --compile --amp "${amps%%,*}"
ours "ours_${x_cfg}_compiled" "$x_cfg" "$x_batch" on "$limit_compiled" --compile --amp "${amps%%,*}"

if [ -f "$release_src/yolov5/models/yolo.py" ]; then
    for spec in "$s_cfg:$s_batches" "$x_cfg:$x_batch"; do
        cfg=${spec%%:*}
        timed "release_$cfg" "$limit_release" "$python" "$repo/bench/release_reference/release_step.py" \
            --release-src "$release_src" --device "$device" --amp "$release_amp" --cfg "$cfg" --imgsz "$imgsz" \
            --batch "${spec#*:}" --iters "$iters" --warmup "$warmup" --json "$results/release_$cfg.json"
    done
else
    echo "== release rows skipped: $release_src/yolov5 is absent (bench/release_reference/fetch_release.sh" \
        "fills it where PyPI is reachable; it travels with the checkout, never committed)"
fi

echo "== summary ($((SECONDS - start))s in all; results in $results)"
"$python" - "$results" <<'EOF' | tee "$results/summary.txt"
import json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
release = {}  # (cfg, batch) → (img/s, step ms, amp)
for path in sorted(folder.glob("release_*.json")):
    report = json.loads(path.read_text())
    for row in report["rows"]:
        release[(report["cfg"], row["batch"])] = (row["img_per_s"], row["step_ms_mean"], row["amp"])
print(f"{'run':<22}{'batch':>6}{'amp':>6}{'ch_last':>8}{'img/s':>9}{'step ms':>9}{'MFU':>7}{'ops':>7}"
      f"{'host ms':>9}{'1st step s':>11}{'x release':>10}")
flops, peak = {}, None
for path in sorted(folder.glob("ours_*.json")):
    report = json.loads(path.read_text())
    cfg = report["cfg"].removesuffix(".yaml")
    flops[cfg], peak = report["train_flops_per_sample"], report["peak_tflops"] or peak
    for r in report["results"]:
        mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
        ref = release.get((cfg, r["batch"]))
        ratio = "-" if ref is None else f"{r['samples_per_s_per_gpu'] / ref[0]:.2f}"
        print(f"{path.stem:<22}{r['batch']:>6}{r['amp']:>6}{('on' if r['channels_last'] else 'off'):>8}"
              f"{r['samples_per_s_per_gpu']:>9.1f}{r['step_ms']:>9.1f}{mfu:>7}{r['ops_per_step'] or '-':>7}"
              f"{r['host_ms']:>9.1f}{r['first_step_ms'] / 1e3:>11.1f}{ratio:>10}")
    for f in report.get("failures", []):
        print(f"{path.stem:<22}{f['batch']:>6}{f['amp']:>6}  {f['error']}")
for (cfg, batch), (rate, step_ms, amp) in sorted(release.items()):
    mfu = "-" if peak is None or cfg not in flops else f"{flops[cfg] * rate / (peak * 1e12):.1%}"
    print(f"{'release_' + cfg:<22}{batch:>6}{amp:>6}{'off':>8}{rate:>9.1f}{step_ms:>9.1f}{mfu:>7}{'-':>7}"
          f"{'-':>9}{'-':>11}{'1.00':>10}")
if not release:
    print("no release rows: the ratio column is empty")
print("targets: yolov5x bf16 b48 >= 40% MFU; yolov5s b16/b64 >= 3x the issue's img/s (245 / 762 on H200); "
      ">= 1.5x the release")
EOF
exit $status
