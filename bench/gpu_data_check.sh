#!/usr/bin/env bash
# Issue 40 on one GPU: is the input pipeline ever the bottleneck? One call, < ~8 minutes on an H100/H200,
# nothing installed (the machine's torch + torchvision, OpenCV, numpy, PyYAML), from this checkout.
#
#   bash bench/gpu_data_check.sh [RESULTS_DIR]        # default: $OUT, else ./bench-results
#
# 1. loader.json: the loader alone at 640 px, <= 4 CPU workers, batch 64 — `train --loader gpu`'s path
#    (yolov5_smddp.benchmarks.data.gpu_path_rows: mosaics/s, device ms per stage, worker CPU ms, buffer
#    sizes; target >= 2,000 mosaics/s) beside the CPU path with the same workers, and nvJPEG's decode
#    against OpenCV's (mean/max absolute pixel difference: the device's "decode" stage bound).
# 2. train_{cpu,gpu}.log + train_summary.json: real `train` of yolov5s, batch 64, 640 px, 4 workers, for
#    each loader: samples/s and the fraction of each step the GPU was busy (1 - the trainer's data_wait,
#    the time blocked on the loader; target >= 0.95), and nvidia-smi's utilisation sampled every 200 ms
#    (informational: the middle 60% of the whole run, start-up, final validation and export included).
# Budget (planned, not yet run on a GPU): data ~30 s, loader ~90 s, each train run <= 170 s (1,280 images,
# one epoch: 20 steps, the CPU loader at ~60 mosaics/s with 4 workers is the slow one).
# SMOKE=1: the same script on the CPU at 64 px, tiny data (to check the script itself).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
results="${1:-${OUT:-$repo/bench-results}}"
mkdir -p "$results"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
work="$(mktemp -d /tmp/gpu-data-check.XXXXXX)"
trap 'rm -rf "$work"' EXIT
start=$SECONDS
status=0

device=cuda imgsz=640 batch=64 workers=4 n_unique=200 n_train=1280 n_val=64 loader_iters=1280 epochs=1
if [ "${SMOKE:-0}" = 1 ]; then
    device=cpu imgsz=64 batch=4 workers=1 n_unique=12 n_train=16 n_val=4 loader_iters=8 epochs=1
fi
export GDC_DEVICE=$device GDC_IMGSZ=$imgsz GDC_BATCH=$batch GDC_WORKERS=$workers GDC_ITERS=$loader_iters

echo "== data: $n_train training images ($n_unique unique JPEGs at $imgsz px), $n_val val"
if ! timeout 120 "$python" - "$work" "$n_unique" "$n_train" "$n_val" "$imgsz" <<'EOF'
import os, shutil, sys
from pathlib import Path
import torch
from yolov5_smddp.data.synthetic import make_default_dataset
if os.environ["GDC_DEVICE"] == "cuda" and not torch.cuda.is_available():
    sys.exit("gpu_data_check: torch sees no CUDA device")
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {gpu}, {os.cpu_count()} CPUs")
work, unique, total, val, imgsz = Path(sys.argv[1]), *map(int, sys.argv[2:])
root = work / "data"
make_default_dataset(root, n_train=unique, n_val=val, imgsz=imgsz, seed=0)
for i in range(unique, total):
    for kind, ext in (("images", "jpg"), ("labels", "txt")):
        shutil.copyfile(root / kind / "train" / f"{i % unique:05d}.{ext}", root / kind / "train" / f"{i:05d}.{ext}")
EOF
then
    exit 1
fi

echo "== loader alone: GPU path vs CPU path, $workers workers, batch $batch (elapsed $((SECONDS - start))s)"
timeout 180 "$python" - "$work" "$results/loader.json" <<'EOF' 2>&1 | tee "$results/loader.log"
import json, os, sys
from pathlib import Path
import cv2, numpy as np, torch
from torchvision.io import ImageReadMode, decode_jpeg
from yolov5_smddp.benchmarks.data import gpu_path_rows, loader_rate
from yolov5_smddp.data.dataset import YoloDataset
from yolov5_smddp.data.labels import build_label_index
env = os.environ
device, imgsz, batch = env["GDC_DEVICE"], int(env["GDC_IMGSZ"]), int(env["GDC_BATCH"])
workers, iters = int(env["GDC_WORKERS"]), int(env["GDC_ITERS"])
work, out = Path(sys.argv[1]), Path(sys.argv[2])
root = work / "data"
index = build_label_index([root / "images" / "train"], nc=3, root=root, cache_dir=work / "cache")
rows = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "imgsz": imgsz, "batch": batch}
rows.update(gpu_path_rows(index, imgsz, workers=workers, batch_size=batch, iters=iters, device=device))
rows[f"cpu_path_samples_per_s_{workers}workers"] = loader_rate(
    YoloDataset(index, imgsz, augment=True, hyp={}, color_on_device=device == "cuda"),
    workers=workers, batch_size=batch, iters=max(iters // 2, batch),
)
diffs = []  # the device decoder against OpenCV, 32 files
for path in index.images[:32]:
    data = path.read_bytes()
    ref = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    got = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB, device=device)
    diffs.append(np.abs(got.flip(0).permute(1, 2, 0).cpu().numpy().astype(int) - ref.astype(int)))
rows["decode_vs_opencv_mean_abs"] = float(np.mean([d.mean() for d in diffs]))
rows["decode_vs_opencv_max_abs"] = int(max(d.max() for d in diffs))
rate = rows[f"gpu_path_{device}_samples_per_s_{workers}workers"]
rows["target_2000_mosaics_per_s_met"] = bool(rate >= 2000)
for key, value in rows.items():
    print(f"{key:<52}{value:>14.2f}" if isinstance(value, float) else f"{key:<52}{value!s:>14}")
out.write_text(json.dumps(rows, indent=2) + "\n")
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "!! loader measurement failed or ran out of time"; status=1; }

train() {  # train LOADER: one real training run, its log in $results, nvidia-smi sampled beside it
    local loader=$1 sampler=""
    echo "== train yolov5s --loader $loader (elapsed $((SECONDS - start))s)"
    if [ "$device" = cuda ] && command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 >"$results/util_$loader.txt" &
        sampler=$!
    fi
    timeout 170 "$python" -m yolov5_smddp train --data "$work/data/data.yaml" --cfg yolov5s --imgsz "$imgsz" \
        --batch-size "$batch" --epochs "$epochs" --workers "$workers" --loader "$loader" --noval --noplots \
        --log-every 5 --cache-dir "$work/cache-$loader" --model-dir "$work/model-$loader" \
        --output-dir "$work/out-$loader" --checkpoint-dir "$work/ckpt-$loader" >"$results/train_$loader.log" 2>&1
    local rc=$?
    [ -n "$sampler" ] && kill "$sampler" 2>/dev/null
    tail -3 "$results/train_$loader.log"
    [ "$rc" -eq 0 ] || { echo "!! train --loader $loader failed or ran out of time (exit $rc)"; status=1; }
}
train cpu
train gpu

"$python" - "$results" <<'EOF' || status=1
import json, re, sys
from pathlib import Path
results = Path(sys.argv[1])
summary = {}
for loader in ("cpu", "gpu"):
    log = results / f"train_{loader}.log"
    steps = [dict(re.findall(r"(\w+)=([-\d.e]+)", line)) for line in log.read_text().splitlines()
             if re.match(r"epoch=\d+ step=\d+ ", line)] if log.exists() else []
    steady = steps[1:] or steps  # the first window holds worker start-up
    row = {"windows": len(steady)}
    if steady:
        row["samples_per_s"] = sum(float(s["samples_per_sec"]) for s in steady) / len(steady)
        row["data_wait"] = sum(float(s["data_wait"]) for s in steady) / len(steady)
        row["gpu_busy_fraction"] = 1 - row["data_wait"]
        row["target_busy_0.95_met"] = row["gpu_busy_fraction"] >= 0.95
    util = results / f"util_{loader}.txt"
    if util.exists():
        values = [float(v) for v in util.read_text().split() if v.replace(".", "").isdigit()]
        middle = values[len(values) // 5 : len(values) * 4 // 5] or values
        row["nvidia_smi_util_mean_middle"] = sum(middle) / max(len(middle), 1)
    summary[loader] = row
print(json.dumps(summary, indent=2))
(results / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
EOF
echo "== done in $((SECONDS - start))s, results in $results (exit $status)"
exit $status
