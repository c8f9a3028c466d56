#!/usr/bin/env bash
# Every GPU check in ONE call (issue 52): fits one 9-minute command on one H100/H200, each phase under its
# own cap, the cheapest and most important first (caps in seconds, 525 in all):
#   1. mfu         75  yolov5x bf16 batch 48, channels-last, device-staged batches: MFU (target >= 40%)
#   2. release    110  yolov5s batch 16/64 ours (fp16, bf16) vs the release v7.0's fp16 step, same GPU
#                      (target >= 1.5x); skipped, with a line, when the release's source is absent
#   3. real        80  the real CPU loader at yolov5x batch 32: busy = share of the step not waiting on the
#                      host (target >= 95%)
#   4. gpu_loader  80  `--loader gpu` with a training step beside it, JPEGs of mixed sizes and qualities:
#                      mosaics/s (target >= 2,000), busy, device decode/augment ms (CUDA events), whether
#                      nvJPEG was used, and decodes issued behind a queued step compared with the CPU's
#                      (0 corrupted) (bench/gpu_loader_check.py)
#   5. cluster    120  bench/gpu_cluster_check.sh: 1-rank NCCL run stopped after epoch 1 of 2, resumed
#                      under another AMP mode; 2 ranks (DDP); val at 1 and 2 ranks; host syncs per step
#   6. compile     60  compiled (reduce-overhead, CUDA graphs) vs eager: gradients after 4 accumulated
#                      micro-steps equal, and the step time (bench/compile_check.py)
#
#   OUT=DIR bash bench/gpu_all.sh          # or: bash bench/gpu_all.sh DIR
#
# MUST TRAVEL with the checkout (device run: `carry: ["bench/release_reference/release_src"]`): the
# release's source, git-ignored, filled by bench/release_reference/fetch_release.sh where PyPI is reachable.
# Needs python3 with torch (CUDA), torchvision, numpy, PyYAML and OpenCV; nothing installed, no network.
# Writes 3 files under OUT: summary.md (the table: MFU, the release's step, busy, mosaics/s, the resume
# check, ...), results.json (every phase's numbers) and gpu_all.log (everything printed).
# SMOKE=1 runs every phase end to end on the CPU (tiny sizes, AMP off or bf16, aot_eager/eager compile) to
# check the script itself; tests/integration/test_gpu_all_smoke.py runs it.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-${OUT:-$repo/bench-results}}"
mkdir -p "$out"
exec > >(tee "$out/gpu_all.log") 2>&1
work="$(mktemp -d /tmp/gpu-all.XXXXXX)"
trap 'rm -rf "$work"' EXIT
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
release_src="$repo/bench/release_reference/release_src"
start=$SECONDS

device=cuda imgsz=640 iters=10 warmup=3
mfu_cfg=yolov5x mfu_batch=48 mfu_amp=bf16
rel_cfg=yolov5s rel_batches=16,64 rel_amps=fp16,bf16 rel_release_amp=fp16
real_cfg=yolov5x real_batch=32 real_amp=bf16 real_workers=$(( $(nproc) > 2 ? $(nproc) - 2 : 1 )) real_iters=40
gl_imgsz=640 gl_batch=64 gl_workers=$(( $(nproc) > 4 ? 4 : $(nproc) )) gl_images=256 gl_iters=20 gl_cfg=yolov5s
cc_cfg=yolov5n cc_imgsz=320 cc_batch=16 cc_iters=5 cc_backend=aot_eager
cap_mfu=75 cap_ours=60 cap_release=50 cap_real=80 cap_gl=80 cap_cluster=120 cap_compile=60
if [ "${SMOKE:-0}" = 1 ]; then  # the CPU: fp16 needs CUDA (AMP off in its place), tiny everything
    device=cpu imgsz=64 iters=1 warmup=1
    mfu_cfg=yolov5n mfu_batch=2 mfu_amp=bf16
    rel_cfg=yolov5n rel_batches=2 rel_amps=off rel_release_amp=off
    real_cfg=yolov5n real_batch=2 real_amp=off real_workers=1 real_iters=2
    gl_imgsz=64 gl_batch=2 gl_workers=1 gl_images=8 gl_iters=2 gl_cfg=yolov5n
    cc_cfg=yolov5n cc_imgsz=64 cc_batch=1 cc_iters=1 cc_backend=eager
    cap_mfu=120 cap_ours=120 cap_release=120 cap_real=120 cap_gl=120 cap_cluster=420 cap_compile=120
fi

"$python" - "$work/environment.json" "$device" "$(git -C "$repo" rev-parse --short=12 HEAD 2>/dev/null || echo nogit)" <<'EOF' || exit 1
import json, os, sys
import torch
if sys.argv[2] == "cuda" and not torch.cuda.is_available():
    sys.exit("gpu_all: torch sees no CUDA device (SMOKE=1 runs it on the CPU)")
cuda = torch.cuda.is_available() and sys.argv[2] == "cuda"
env = {"torch": torch.__version__, "cuda": torch.version.cuda, "commit": sys.argv[3], "cpus": os.cpu_count(),
       "gpu": torch.cuda.get_device_name(0) if cuda else "no GPU (SMOKE, CPU)"}
print(json.dumps(env))
json.dump(env, open(sys.argv[1], "w"))
EOF

phase() {  # phase NAME CAP COMMAND...: one phase under its own cap; name, exit code, seconds → phases.tsv
    local name=$1 cap=$2
    shift 2
    local began=$SECONDS
    echo "== $name (cap ${cap}s, elapsed $((SECONDS - start))s)"
    timeout "$cap" "$@"
    local rc=$?
    [ "$rc" -eq 0 ] || echo "!! $name failed or ran past its cap (exit $rc)"
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - began))" "" >>"$work/phases.tsv"
}
skip() {  # skip NAME WHY
    echo "== $1 skipped: $2"
    printf '%s\tskip\t0\t%s\n' "$1" "$2" >>"$work/phases.tsv"
}
# `bench train` as each phase runs it (then --json FILE and the phase's own options)
bench_train=("$python" -m yolov5_smddp bench train --device "$device" --imgsz "$imgsz" --iters "$iters" --warmup "$warmup")

phase mfu "$cap_mfu" "${bench_train[@]}" --json "$work/mfu.json" --cfg "$mfu_cfg.yaml" --batch-per-gpu "$mfu_batch" \
    --amp "$mfu_amp" --channels-last on --loader device --data synthetic

phase release "$cap_ours" "${bench_train[@]}" --json "$work/ours_release_cfg.json" --cfg "$rel_cfg.yaml" \
    --batch-per-gpu "$rel_batches" --amp "$rel_amps" --channels-last on --loader device --data synthetic
if [ -f "$release_src/yolov5/models/yolo.py" ]; then
    phase release_src "$cap_release" "$python" "$repo/bench/release_reference/release_step.py" \
        --release-src "$release_src" --device "$device" --amp "$rel_release_amp" --cfg "$rel_cfg" \
        --imgsz "$imgsz" --batch "$rel_batches" --iters "$iters" --warmup "$warmup" --json "$work/release.json"
else
    skip release_src "the release's source ($release_src) is absent: it must travel with the run (carry it)"
fi

if "$python" -c 'import cv2' 2>/dev/null; then
    phase real "$cap_real" "${bench_train[@]}" --json "$work/real.json" --cfg "$real_cfg.yaml" --batch-per-gpu "$real_batch" \
        --amp "$real_amp" --channels-last on --loader real --data synthetic --workers "$real_workers" \
        --iters "$real_iters"
    phase gpu_loader "$cap_gl" "$python" -m bench.gpu_loader_check "$work/gpu_loader.json" "$device" \
        "$gl_imgsz" "$gl_batch" "$gl_workers" "$gl_images" "$gl_iters" "$gl_cfg"
else
    skip real "OpenCV (cv2) is not installed: the data pipeline needs it"
    skip gpu_loader "OpenCV (cv2) is not installed: the data pipeline needs it"
fi

mkdir -p "$work/cluster"
phase cluster "$cap_cluster" env PYTHON="$python" bash "$repo/bench/gpu_cluster_check.sh" "$work/cluster"

phase compile "$cap_compile" "$python" -m bench.compile_check "$work/compile.json" "$device" "$cc_cfg" \
    "$cc_imgsz" "$cc_batch" "$cc_iters" "$cc_backend"

echo "== summary ($((SECONDS - start))s in all; results in $out)"
"$python" -m bench.gpu_all_summary "$work" "$out/summary.md" "$out/results.json" || exit 1
failed=$(awk -F'\t' '$2 != "0" && $2 != "skip"' "$work/phases.tsv" | cut -f1 | tr '\n' ' ')
[ -z "$failed" ] || { echo "failed phases: $failed"; exit 1; }
