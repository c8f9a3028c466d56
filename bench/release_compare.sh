#!/usr/bin/env bash
# Side-by-side CPU training step (the input pipeline: bench/release_reference/release_data.py): ours (`bench train --loader device`) against the YOLOv5 release
# (the PyPI package yolov5 7.0.14, in a throwaway image; never part of our image or repository), in
# alternating rounds on the same machine, same torch, same batch, fp32.
#
#   bash bench/release_compare.sh [OUT_DIR]        # env: ROUNDS (3), ITERS (15), CFG (yolov5n), IMGSZ (320),
#                                                  #      BATCH (8), CPUS (2), BASE_IMAGE (our training image)
# Rows: ours (channels_last on = the default, off, and on with glibc's default malloc thresholds), the
# release with as many threads as ours, the same with our malloc thresholds (GLIBC_TUNABLES), and once the
# release as it configures itself (its import sets OMP_NUM_THREADS = cpus - 1).
# Needs Docker and network access to PyPI (for the release's package). Prints a table; JSON per run in OUT_DIR.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(mkdir -p "${1:-$here/runs/release_compare}" && cd "${1:-$here/runs/release_compare}" && pwd)"
ROUNDS="${ROUNDS:-3}" ITERS="${ITERS:-15}" CFG="${CFG:-yolov5n}" IMGSZ="${IMGSZ:-320}" BATCH="${BATCH:-8}"
CPUS="${CPUS:-2}"
base="${BASE_IMAGE:-$("$here/build.sh" build --base local | tail -n 1)}"
ref="yolov5-smddp-release-ref:7.0.14"
docker build -q --build-arg "BASE_IMAGE=$base" -t "$ref" "$here/bench/release_reference" >/dev/null
# the same thresholds as yolov5_smddp/hostmem.py, for a process that does not call it
tunables="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456"

run() {  # run NAME [docker -e options] -- COMMAND...: in the reference image (it has both), checkout read-only
    local name="$1" envs=()
    shift
    while [[ "$1" != "--" ]]; do envs+=(-e "$1"); shift; done
    shift
    docker run --rm --cpus "$CPUS" -e USE_LIBUV=0 -e PYTHONPATH=/src "${envs[@]}" -v "$here:/src:ro" -v "$out:/out" \
        -w /tmp --entrypoint python3 "$ref" "$@" >"$out/$name.log" 2>&1 \
        || { echo "failed: $name (see $out/$name.log)" >&2; return 1; }
}
ours() {  # ours NAME ROUND CHANNELS_LAST [ENV...]
    local name="$1" round="$2" cl="$3"
    shift 3
    run "${name}_r$round" "$@" -- -m yolov5_smddp bench train --cfg "$CFG" --imgsz "$IMGSZ" --batch-per-gpu "$BATCH" \
        --amp off --channels-last "$cl" --iters "$ITERS" --warmup 3 --device cpu --json "/out/${name}_r$round.json"
}
release() {  # release NAME ROUND THREADS [ENV...]
    local name="$1" round="$2" threads="$3"
    shift 3
    run "${name}_r$round" "$@" -- /src/bench/release_reference/release_step.py --cfg "$CFG" --imgsz "$IMGSZ" \
        --batch "$BATCH" --iters "$ITERS" --threads "$threads" --json "/out/${name}_r$round.json"
}
for r in $(seq 1 "$ROUNDS"); do
    echo "round $r/$ROUNDS" >&2
    ours "ours-channels_last-on" "$r" on
    release "release-${CPUS}-threads" "$r" "$CPUS"
    ours "ours-channels_last-off" "$r" off
    release "release-${CPUS}-threads+our-malloc-thresholds" "$r" "$CPUS" "GLIBC_TUNABLES=$tunables"
    ours "ours-channels_last-on+glibc-default-malloc" "$r" on YOLOV5_SMDDP_MALLOC=default
done
release "release-as-shipped" 1 shipped

python3 - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path
rows = {}
for f in sorted(Path(sys.argv[1]).glob("*_r*.json")):
    d = json.loads(f.read_text())
    name = f.stem.rsplit("_r", 1)[0]
    if "results" in d:  # ours
        r = d["results"][0]
        rows.setdefault(name, []).append((r["step_ms"], r["forward_backward_ms"], r["optimizer_ms"]))
    else:
        rows.setdefault(f"{name} ({d['threads']} thread(s))", []).append(
            (d["step_ms_mean"], d["forward_backward_ms_mean"], d["optimizer_ms_mean"]))
print(f"{'run (fp32, yolov5n-style step on the CPU)':<58} {'runs':>4} {'step ms median':>14} {'min..max':>15} "
      f"{'fwd+bwd':>8} {'optim':>6}")
for name, vals in rows.items():
    steps = [v[0] for v in vals]
    print(f"{name:<58} {len(vals):>4} {statistics.median(steps):>14.1f} {min(steps):>7.1f}..{max(steps):<7.1f} "
          f"{statistics.median(v[1] for v in vals):>8.1f} {statistics.median(v[2] for v in vals):>6.1f}")
PY
