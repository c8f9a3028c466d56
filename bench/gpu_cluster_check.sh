#!/usr/bin/env bash
# The cluster path on one GPU (issue 36): 1-rank NCCL training (torchrun), 2 ranks on the one GPU (Gloo
# carrying CUDA tensors: NCCL refuses two ranks on one device), sharded `val` equal at 1 and 2 ranks,
# fp16 and bf16 training steps with torch.cuda.set_sync_debug_mode counting host syncs per step, and a
# resume under fp16 of the bf16 --epochs 3 run stopped by SIGTERM after epoch 1 (issue 52). Runs from this
# checkout (PYTHONPATH, no install, no network) in
# about 4 minutes on an H100/H200 (each step has its own time limit; at most ~8 minutes in all).
#
#   bash bench/gpu_cluster_check.sh [RESULTS_DIR]     # default: $OUT, else ./bench-results-cluster
#
# Needs: python3 with torch (CUDA), numpy, PyYAML and OpenCV (the training data pipeline). RESULTS_DIR
# gets at most 8 files: summary.md, summary.json and one log per step. The dataset and the runs' own
# outputs go to a temporary folder (removed at the end).
# SMOKE=1 runs the same script on the CPU (Gloo, 64 px, tiny sets, bf16 then off), to check the script.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
results="${1:-${OUT:-$repo/bench-results-cluster}}"
mkdir -p "$results"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
start=$SECONDS

backend=nccl imgsz=320 n_train=64 n_val=16 batch=16 steps=5 first_amp=bf16 resumed_amp=fp16 sync_amps=fp16,bf16
slow=1  # time limits: 90 + 75 + 100 + 75 + 90 s on a GPU; x4 on a (shared) CPU
if [ "${SMOKE:-0}" = 1 ]; then  # fp16 needs CUDA: the resume goes bf16 -> off on the CPU
    backend=gloo imgsz=64 n_train=8 n_val=4 batch=2 steps=1 first_amp=bf16 resumed_amp=off sync_amps=off,bf16 slow=4
elif ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_cluster_check: torch sees no CUDA device (SMOKE=1 runs it on the CPU)"
    exit 1
fi
"$python" -m bench.cluster_check environment "$work/environment.json" || exit 1
"$python" -m bench.cluster_check dataset "$work/data" "$imgsz" "$n_train" "$n_val" >/dev/null || exit 1
data="$work/data/data.yaml"

free_port() {
    "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# torch's own launcher on a free loopback port
torchrun=("$python" -m torch.distributed.run --master_addr 127.0.0.1)

check() {  # check NAME LIMIT_S WHAT COMMAND...: run it, log to $results/NAME.log, record its exit code
    local name=$1 limit=$2 what=$3
    shift 3
    local began=$SECONDS
    echo "== $name: $what (limit $((limit * slow))s, elapsed $((SECONDS - start))s)"
    timeout $((limit * slow)) "$@" >"$results/$name.log" 2>&1
    local rc=$?
    tail -n 3 "$results/$name.log"
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - began))" "$what" >>"$work/checks.tsv"
    # the summary so far: a caller's cap that ends this script early still finds what ran (bench/gpu_all.sh)
    "$python" -m bench.cluster_check summary "$work" "$results/summary.md" "$results/summary.json" >/dev/null 2>&1
}

train_args=(--cfg yolov5n --data "$data" --imgsz "$imgsz" --batch-size "$batch" --workers 2 --noplots
    --backend "$backend" --cache-dir "$work/cache" --model-dir "$work/run/model" --output-dir "$work/run/output"
    --checkpoint-dir "$work/run/ckpt")

# a --epochs 3 run stopped (SIGTERM) at the end of epoch 1 (or 2, should a busy host read the line late):
# the part-way checkpoint the resume step continues
check train1 90 "1-rank $backend training, --epochs 3 --amp $first_amp (torchrun), stopped part-way" \
    "$python" -m bench.cluster_check stopped "$work/train1.out" "$work/train1.json" "$work/run/ckpt/last.pt" 3 \
    "${torchrun[@]}" --master_port "$(free_port)" --nproc_per_node 1 -m yolov5_smddp train "${train_args[@]}" \
    --epochs 3 --amp "$first_amp"

check resume 90 "resume the stopped --amp $first_amp run (to epoch 3) under --amp $resumed_amp" \
    "${torchrun[@]}" --master_port "$(free_port)" --nproc_per_node 1 -m yolov5_smddp train "${train_args[@]}" \
    --epochs 3 --amp "$resumed_amp" \
    --resume "$work/run/ckpt/last.pt"

check ddp2 75 "2 ranks on one device: Gloo with $([ "${SMOKE:-0}" = 1 ] && echo CPU || echo CUDA) tensors, DDP steps" \
    "${torchrun[@]}" --master_port "$(free_port)" --nproc_per_node 2 -m bench.cluster_check ddp2 "$work/ddp2.json" "$steps" "$imgsz" "$batch"

val_args=(-m yolov5_smddp val --weights "$work/run/model/best.pt" --data "$data" --imgsz "$imgsz"
    --batch-size 4 --workers 0 --cache-dir "$work/cache")
# both on the same device (Gloo: the CPU), so the 1e-6 tolerance compares the sharding alone
check val 100 "sharded val: 1 rank, then 2 ranks, both Gloo on the same device, the same numbers" bash -c '
    set -e
    free() { "$0" -c "import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1])"; }
    for n in 1 2; do
        "$0" -m torch.distributed.run --nproc_per_node $n --master_addr 127.0.0.1 --master_port "$(free)" \
            "${@:2}" --backend gloo --metrics-json "$1/val$n.json"
    done
    "$0" -m bench.cluster_check compare-val "$1/val1.json" "$1/val2.json" "$1/val.json"
' "$python" "$work" "${val_args[@]}"

check syncs 75 "host syncs per training step ($sync_amps), torch.cuda.set_sync_debug_mode" \
    "$python" -m bench.cluster_check syncs "$work/syncs.json" "$sync_amps" "$steps" "$imgsz" "$batch"

echo "== summary ($((SECONDS - start))s in all; results in $results)"
"$python" -m bench.cluster_check summary "$work" "$results/summary.md" "$results/summary.json" || exit 1
"$python" -c 'import json, sys; sys.exit(0 if all(c["ok"] for c in json.load(open(sys.argv[1]))["checks"]) else 1)' \
    "$results/summary.json"
