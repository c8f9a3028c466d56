#!/usr/bin/env bash
# One-GPU performance check: `bench train` for yolov5s and yolov5x at batch 16/32/48, bf16/fp16,
# channels_last on/off with the device-staged loader, one run through the real data pipeline, and the
# scaling model fed with the measured YOLOv5x step. Runs from this checkout (PYTHONPATH, no install) with
# no network access, in under 8 minutes on an H100/H200 (each run has its own time limit).
#
#   bash bench/gpu_check.sh [RESULTS_DIR]        # default: $OUT, else ./bench-results
#
# Needs: python3 with torch (CUDA), numpy and PyYAML; the real-loader run also needs OpenCV (skipped,
# with a message, when cv2 is missing). JSON results and logs go to RESULTS_DIR.
# SMOKE=1 runs the same script on the CPU at 64 px, batch 2, one step (to check the script itself).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
results="${1:-${OUT:-$repo/bench-results}}"
mkdir -p "$results"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
start=$SECONDS

# Budget (H100, measured plan): yolov5s 12 combinations ~1 min, yolov5x 12 combinations ~3 min,
# real loader ~1 min, scaling model ~15 s. ITERS/WARMUP override the step counts.
iters="${ITERS:-10}"
warmup="${WARMUP:-3}"
# The real-loader run measures more steps than the DataLoader prefetches (2 per worker).
iters_real="${ITERS_REAL:-60}"
device=cuda imgsz=640 batches=16,32,48 amps=bf16,fp16 batch_real=32 batch_ref=32 batch_mfu=48
if [ "${SMOKE:-0}" = 1 ]; then  # fp16 autocast needs CUDA
    device=cpu imgsz=64 batches=2 amps=bf16,off batch_real=2 batch_ref=2 batch_mfu=2 iters=1 warmup=1 iters_real=2
fi

if ! "$python" - <<'EOF'
import importlib.util, os, sys
import torch
missing = [m for m in ("numpy", "yaml") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_check: missing Python modules {missing}; they are needed by the model code")
if os.environ.get("SMOKE") != "1" and not torch.cuda.is_available():
    sys.exit("gpu_check: torch sees no CUDA device")
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {gpu}")
EOF
then
    exit 1
fi
have_cv2=$("$python" -c 'import importlib.util; print(int(importlib.util.find_spec("cv2") is not None))')

status=0
bench() {  # bench NAME TIME_LIMIT_S ARGS...: one `bench train` run, its log and JSON in $results
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s, elapsed $((SECONDS - start))s)"
    timeout "$limit" "$python" -m yolov5_smddp bench train --device "$device" --iters "$iters" --warmup "$warmup" \
        --json "$results/$name.json" "$@" 2>&1 | tee "$results/$name.log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        echo "!! $name failed or ran out of time (exit $rc)"
        status=1
    fi
}

for cfg in yolov5s yolov5x; do
    limit=150  # measured on an H200 (gVisor): yolov5s's 12 combinations need ~110 s, yolov5x's ~135 s
    [ "$cfg" = yolov5x ] && limit=200
    bench "train_${cfg}_device" "$limit" --cfg "$cfg.yaml" --imgsz "$imgsz" --batch-per-gpu "$batches" \
        --amp "$amps" --channels-last on,off --loader device --data synthetic
done

if [ "$have_cv2" = 1 ]; then
    bench train_yolov5x_real 120 --cfg yolov5x.yaml --imgsz "$imgsz" --batch-per-gpu "$batch_real" --amp bf16 \
        --channels-last on --loader real --data synthetic --workers 12 --iters "$iters_real"
else
    echo "== train_yolov5x_real skipped: OpenCV (cv2) is not installed, the data pipeline needs it"
fi

# HSV + flips on the device batch (--color-aug device, the default on CUDA): its cost per batch there.
echo "== apply_color on the $device batch ($batch_real x 3 x $imgsz x $imgsz)"
timeout 60 "$python" - "$device" "$batch_real" "$imgsz" "$results/color_on_device.json" <<'EOF' 2>&1 | tee "$results/color_on_device.log" || status=1
import json, sys, time
import numpy as np, torch
from yolov5_smddp.data.augment import AugmentParams, draw_color_params
from yolov5_smddp.data.color import apply_color
device, batch, size = torch.device(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
imgs = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, device=device)
params = torch.from_numpy(np.stack([draw_color_params(AugmentParams(), rng) for _ in range(batch)])).to(device)
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
apply_color(imgs, params)
sync()
runs = 20
started = time.perf_counter()
for _ in range(runs):
    apply_color(imgs, params)
sync()
ms = 1000 * (time.perf_counter() - started) / runs
print(f"apply_color: {ms:.2f} ms per batch of {batch} at {size} px ({ms / batch:.3f} ms per image)")
json.dump({"device": str(device), "batch": batch, "imgsz": size, "ms_per_batch": ms}, open(sys.argv[4], "w"))
EOF

# The scaling model for 1/2/4/8 p4d-like nodes, from the fastest measured YOLOv5x bf16 batch-32 step.
step_ms=$("$python" - "$results/train_yolov5x_device.json" "$batch_ref" <<'EOF' 2>/dev/null
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
best = min(r["step_ms"] for r in rows if r["batch"] == int(sys.argv[2]) and r["amp"] == "bf16")
print(f"{best:.2f}")
EOF
)
if [ -n "$step_ms" ]; then
    echo "== scaling model with the measured yolov5x batch-$batch_ref bf16 step ($step_ms ms)"
    timeout 60 "$python" -m bench.scaling --cfg yolov5x.yaml --step-ms "$step_ms" \
        --batch-per-gpu "$batch_ref" --nodes 1,2,4,8 --gpus-per-node 8 --inter-node-gbps 400 --intra-node-gbps 2400 \
        --json "$results/scaling_yolov5x.json" 2>&1 | tee "$results/scaling_yolov5x.log" || status=1
fi

echo "== summary ($((SECONDS - start))s in all; results in $results)"
"$python" - "$results" "$batch_mfu" <<'EOF'
import json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
batch_mfu = int(sys.argv[2])
print(f"{'run':<24}{'batch':>6}{'amp':>6}{'ch_last':>8}{'img/s':>9}{'step ms':>9}{'busy':>7}{'mem GB':>8}{'MFU':>7}")
for path in sorted(folder.glob("train_*.json")):
    report = json.loads(path.read_text())
    for r in report["results"]:
        mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
        print(f"{path.stem:<24}{r['batch']:>6}{r['amp']:>6}{('on' if r['channels_last'] else 'off'):>8}"
              f"{r['samples_per_s_per_gpu']:>9.1f}{r['step_ms']:>9.1f}{r['device_busy']:>7.1%}"
              f"{r['peak_memory_mb'] / 1024:>8.1f}{mfu:>7}")
    for f in report.get("failures", []):
        print(f"{path.stem:<24}{f['batch']:>6}{f['amp']:>6}{('on' if f['channels_last'] else 'off'):>8}  {f['error']}")
targets = []
x = folder / "train_yolov5x_device.json"
if x.exists():
    rows = [r for r in json.loads(x.read_text())["results"] if r["batch"] == batch_mfu and r["amp"] == "bf16"]
    if rows and rows[0]["mfu"] is not None:
        best = max(r["mfu"] for r in rows)
        targets.append(f"yolov5x bf16 batch {batch_mfu} device loader: best MFU {best:.1%} (target >= 40%)")
real = folder / "train_yolov5x_real.json"
if real.exists():
    rows = json.loads(real.read_text())["results"]
    if rows:
        targets.append(f"yolov5x real loader, 12 workers: GPU busy {rows[0]['device_busy']:.1%} (target >= 90%)")
print("\n".join(targets))
EOF
exit $status
