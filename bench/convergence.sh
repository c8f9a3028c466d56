#!/usr/bin/env bash
# Convergence side by side: the YOLOv5 release's train.py (the PyPI package yolov5 7.0.14, in the throwaway
# image of bench/release_reference/Dockerfile; never part of our image or repository) and ours train the
# same generated shapes task (yolov5_smddp.data.synthetic.make_shapes_dataset) with the same recipe
# (scratch-low), model, image size, batch, epochs, workers and seeds, one run at a time on the CPU; then
# OUR `yolov5-smddp val` scores every run's best.pt on the same val split. Both run their AutoAnchor check
# (ours since issue 13), as a user would run them.
#
#   bash bench/convergence.sh [OUT_DIR]
#   env: SEEDS ("0 1"), VARIANTS ("release ours"; also "ours-reldata": our trainer on the release's training
#        pipeline, "release-ourdata": the release's trainer on ours, bench/release_reference/swap.py;
#        "ours-gpuloader": ours with --loader gpu, the GPU data path run on the CPU device, issue 40),
#        EPOCHS (30), IMGSZ (256), BATCH (16), WORKERS (2),
#        DATA_KIND ("shapes textured", the default set since issue 38: each kind in its own OUT_DIR/<kind>, one
#        table each; one kind: that kind only, in OUT_DIR itself as before. shapes: make_shapes_dataset, its data
#        under OUT_DIR/data; textured: bench/make_textured_dataset.py, its data under OUT_DIR/data-textured),
#        CFG (yolov5n), N_TRAIN (1000), N_VAL (200), WIDTH (320), HEIGHT (240), DATA_SEED (0), CPUS (2),
#        BASE_IMAGE (an image with python3, torch, torchvision, OpenCV, PyYAML: the stand-in base),
#        BEFORE_REF (a git revision: adds the variant "ours-before" trained by that revision's code),
#        HYP_OVERRIDE (key=value,... replacing scratch-low values for BOTH, e.g. "obj=25" at small IMGSZ),
#        OURS_ARGS (extra options for ours, e.g. "--mosaic-partners recent"), NICE (10),
#        PARALLEL (1: runs one after the other; N: up to N runs of the same seed at once),
#        THREADS (1: torch threads per run, as the release sets itself on 2 CPUs; on a loaded machine
#        more threads than free cores make every OpenMP barrier wait for a descheduled thread)
# Prints a table (per-epoch mAP50-95 curves from each trainer's own validation, final mAP50-95 / mAP50 by
# our val, wall minutes; per variant the mean and min..max over seeds; the curves side by side every third
# epoch with each variant's mean) and writes OUT_DIR/table.md.
# Needs Docker and network access to PyPI (for the release's package).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(mkdir -p "${1:-$here/runs/convergence}" && cd "${1:-$here/runs/convergence}" && pwd)"
# the default budget (issue 27): where yolov5n gets past the steep part of its curve (~30-45 min per run here)
SEEDS="${SEEDS:-0 1}" VARIANTS="${VARIANTS:-release ours}" EPOCHS="${EPOCHS:-30}" IMGSZ="${IMGSZ:-256}"
BATCH="${BATCH:-16}" WORKERS="${WORKERS:-2}" CFG="${CFG:-yolov5n}" N_TRAIN="${N_TRAIN:-1000}" N_VAL="${N_VAL:-200}"
WIDTH="${WIDTH:-320}" HEIGHT="${HEIGHT:-240}" DATA_SEED="${DATA_SEED:-0}" CPUS="${CPUS:-2}"
OURS_ARGS="${OURS_ARGS:-}" HYP_OVERRIDE="${HYP_OVERRIDE:-}" NICE="${NICE:-10}" PARALLEL="${PARALLEL:-1}" THREADS="${THREADS:-1}"
DATA_KIND="${DATA_KIND:-shapes textured}"
read -r -a kinds <<<"$DATA_KIND"
(( ${#kinds[@]} > 0 )) || { echo "DATA_KIND is empty (give shapes, textured or both)" >&2; exit 2; }
if (( ${#kinds[@]} > 1 )); then  # the default set: one kind after the other, each in its own folder and table
    for kind in "${kinds[@]}"; do
        [[ "$kind" == shapes || "$kind" == textured ]] || { echo "unknown DATA_KIND $kind (shapes, textured)" >&2; exit 2; }
    done
    for kind in "${kinds[@]}"; do
        echo "== $kind data: $out/$kind" >&2
        DATA_KIND="$kind" bash "${BASH_SOURCE[0]}" "$out/$kind" >/dev/null
    done
    for kind in "${kinds[@]}"; do echo "## $kind data"; echo; cat "$out/$kind/table.md"; echo; done
    exit 0
fi
data_dir=data  # the shapes task keeps its folder name (earlier OUT_DIRs reuse theirs)
[[ "$DATA_KIND" == shapes ]] || data_dir="data-$DATA_KIND"
# default base: the stand-in base image that ./build.sh tags by content hash
base="${BASE_IMAGE:-$(docker images --format '{{.Repository}}:{{.Tag}}' yolov5-smddp-standin | grep -m1 -E ':[0-9a-f]{12}$' || true)}"
[[ -n "$base" ]] || { echo "no BASE_IMAGE given and no stand-in base image found (docker images | grep standin)" >&2; exit 2; }
ref="yolov5-smddp-release-ref:7.0.14"
docker build -q --build-arg "BASE_IMAGE=$base" -t "$ref" "$here/bench/release_reference" >/dev/null

if [[ -n "${BEFORE_REF:-}" ]]; then  # the earlier code, for the "ours-before" rows
    rm -rf "$out/src-before" && mkdir -p "$out/src-before"
    git -C "$here" archive "$BEFORE_REF" yolov5_smddp | tar -x -C "$out/src-before"
    VARIANTS="$VARIANTS ours-before"
fi

# In the reference image (it has both), SRC read-only on PYTHONPATH, niced (a shared machine); /stubs holds a
# stand-in for the `roboflow` package, which the release's train.py imports and the benchmark never uses.
run() {  # run LOG SRC PYTHON-ARGS...
    local log="$1" src="$2"
    shift 2
    docker run --rm --cpus "$CPUS" --shm-size 2g -e USE_LIBUV=0 -e OMP_NUM_THREADS="$THREADS" -e PYTHONPATH=/src:/stubs -e PYTHONDONTWRITEBYTECODE=1 \
        -e YOLOv5_VERBOSE=False -v "$src:/src:ro" -v "$here/bench/release_reference/stubs:/stubs:ro" -v "$out:/out" \
        -w /out --entrypoint nice "$ref" -n "$NICE" python3 "$@" \
        >"$log" 2>&1 || { echo "failed: see $log" >&2; return 1; }
}

if [[ ! -f "$out/$data_dir/data.yaml" ]]; then
    run "$out/data.log" "$here" /src/bench/release_reference/convergence.py data "/out/$data_dir" --kind "$DATA_KIND" \
        --n-train "$N_TRAIN" --n-val "$N_VAL" --width "$WIDTH" --height "$HEIGHT" --seed "$DATA_SEED"
fi
one_run() {  # one_run VARIANT SEED: train, then score best.pt with our val
    local variant="$1" seed="$2" name="$1-s$2" dir="$out/runs/$1-s$2" best src started wall
    [[ -f "$dir/score.json" ]] && { echo "done already: $name" >&2; return 0; }
    rm -rf "$dir" && mkdir -p "$dir"
    echo "$(date -u +%H:%M:%S) training $name" >&2
    started=$(date +%s)
    case "$variant" in
        release | release-ourdata)
            # release-ourdata: the release's trainer fed by OUR training pipeline (swap.py, issue 27)
            train=(-m yolov5.train)
            [[ "$variant" == release-ourdata ]] && train=(/src/bench/release_reference/swap.py release-on-ours --)
            run "$dir/train.log" "$here" "${train[@]}" --data "/out/$data_dir/data.yaml" --cfg "$CFG.yaml" \
                --weights "" --hyp /out/hyp.yaml --img "$IMGSZ" --batch-size "$BATCH" --epochs "$EPOCHS" --workers "$WORKERS" \
                --seed "$seed" --device cpu --project /out/runs --name "$name" --exist-ok --noplots
            best="/out/runs/$name/weights/best.pt" ;;
        ours | ours-before | ours-reldata | ours-gpuloader)
            src="$here"
            [[ "$variant" == ours-before ]] && src="$out/src-before"
            local loader=()
            [[ "$variant" == ours-gpuloader ]] && loader=(--loader gpu)
            # ours-reldata: our trainer fed by the RELEASE's training pipeline (swap.py, issue 27)
            train=(-m yolov5_smddp train)
            [[ "$variant" == ours-reldata ]] && train=(/src/bench/release_reference/swap.py ours-on-release -- train)
            # shellcheck disable=SC2086  # OURS_ARGS: words on purpose
            run "$dir/train.log" "$src" "${train[@]}" --data "/out/$data_dir/data.yaml" --cfg "$CFG" \
                --imgsz "$IMGSZ" --batch-size "$BATCH" --epochs "$EPOCHS" --workers "$WORKERS" --seed "$seed" \
                --model-dir "/out/runs/$name/model" --output-dir "/out/runs/$name/output" \
                --checkpoint-dir "/out/runs/$name/checkpoints" --cache-dir "/out/cache/$name" "${ours_hyp[@]}" \
                "${loader[@]}" $OURS_ARGS
            best="/out/runs/$name/model/best.pt" ;;
        *) echo "unknown variant $variant" >&2; return 2 ;;
    esac
    wall=$(( $(date +%s) - started ))
    printf '{"variant": "%s", "seed": %d, "wall_s": %d, "parallel": %d}\n' "$variant" "$seed" "$wall" "$PARALLEL" \
        >"$dir/meta.json"
    run "$dir/val.log" "$here" -m yolov5_smddp val --weights "$best" --data "/out/$data_dir/data.yaml" \
        --imgsz "$IMGSZ" --batch-size 32 --workers "$WORKERS" --device cpu --cache-dir /out/cache/val \
        --output-dir "/out/runs/$name/val"
    run "$dir/score.log" "$here" /src/bench/release_reference/convergence.py score "/out/runs/$name" \
        "/out/runs/$name/val.log"
    echo "$(date -u +%H:%M:%S) done $name" >&2
}

# the same hyperparameters for both: scratch-low with HYP_OVERRIDE replaced (ours: --hyp-override)
run "$out/hyp.log" "$here" /src/bench/release_reference/convergence.py hyp /out/hyp.yaml "$HYP_OVERRIDE"
ours_hyp=()
[[ -n "$HYP_OVERRIDE" ]] && ours_hyp=(--hyp-override "$HYP_OVERRIDE")
mkdir -p "$out/runs"
for seed in $SEEDS; do  # PARALLEL > 1: up to that many runs of one seed at once (they share the CPUs)
    active=0
    for variant in $VARIANTS; do
        if (( PARALLEL > 1 )); then
            one_run "$variant" "$seed" &
            active=$((active + 1))
            (( active < PARALLEL )) || { wait -n || true; active=$((active - 1)); }
        else
            one_run "$variant" "$seed"
        fi
    done
    wait
done
run "$out/table.log" "$here" /src/bench/release_reference/convergence.py table /out
cat "$out/table.md"
