#!/usr/bin/env bash
# Build, test, run and push the yolov5-smddp training image. Run `./build.sh help` for the commands.
set -euo pipefail
# a failing command inside $(...) stops that substitution too (bash >= 4.4; macOS's bash 3.2 lacks it,
# so every docker build below also says what failed itself)
shopt -s inherit_errexit 2>/dev/null || true

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

usage() {
    cat <<'EOF'
usage: ./build.sh COMMAND [options]

commands:
  build [--dlc current|smddp] [--base local|dlc|IMAGE] [--region R]
        Build the training image and print its tag (last line of stdout): yolov5-smddp:<version>-<git sha>,
        with -smddp appended for the SMDDP flavour and -standin on the local base. --dlc picks the AWS PyTorch
        training DLC (yolov5_smddp/dlc.py): current (default: the newest DLC AWS still patches, PyTorch 2.10,
        NCCL) or smddp (the 2.5.1 DLC, the last with SMDDP; no longer patched). The image's label
        io.github.yolov5-smddp.dlc records which. --base dlc (default) builds FROM that DLC (needs the aws
        CLI and credentials); --base local FROM its stand-in (no AWS needed): docker/current/ (Debian trixie,
        PyPI torch 2.10) for current, docker/standin/ (Debian's torch, the SageMaker toolkit's MPI path) for
        smddp; any other value is used as the base image.
  push [--registry HOST | --account ID] [--region R] [--repo NAME] [--image TAG] [--dlc current|smddp]
        Tag and push an image (default: the latest `build` of this checkout on the --dlc DLC). For an ECR
        registry (the default: <account>.dkr.ecr.<region>.amazonaws.com) it logs in with the aws CLI and
        creates the repository if missing; for any other registry (e.g. 127.0.0.1:5000) it only tags and
        pushes. Prints the pushed reference on the last line.
  local-base
        Build the local stand-in of the $DLC flavour (cached by content hash) and print its tag: FROM
        debian:trixie-slim when that image is present or can be pulled, else with debootstrap (root,
        Debian-like Linux; no registry). STANDIN_METHOD=dockerfile|debootstrap forces one
        (docker/standin/build.sh drives both stand-ins).
  test  Run the unit and integration tests on both DLCs' versions at the same time, each inside a test
        image: the current DLC's (Python 3.13, torch 2.10 from PyPI: docker/current/, with ruff) and the
        SMDDP DLC's (Python 3.11, torch 2.5.1 from PyPI: docker/dlc-versions/; TEST_DLC_VERSIONS=0 leaves
        it out), YOLOV5_SMDDP_SUITE=current|dlc-versions naming the suite; then the container tests
        (pytest -m docker) from this host in a virtualenv on the SMDDP stand-in's image. Needs
        only Docker and python3. A skip not allow-listed in tests/skip_policy.py fails it (so does a missing
        engine or image for the container tests); the summary lists every skip with its reason.
  run [train options]
        Build on the local base and run the main job: `docker run IMAGE train [options]` with the outputs in
        ./runs/container/ (model/, output/, checkpoints/). Uses --gpus all when nvidia-smi works.
  help  This text.

environment: IMAGE_NAME (yolov5-smddp), AWS_REGION / REGION, AWS_ACCOUNT_ID, ECR_REPOSITORY, REGISTRY,
             BASE (for build/run/test: local|dlc|IMAGE), DLC (for build/run/push: current|smddp),
             DOCKER_BUILD_ARGS (extra `docker build` words).
EOF
}

die() { echo "error: $*" >&2; exit 1; }
need_docker() {
    command -v docker >/dev/null || die "docker is not installed (https://docs.docker.com/engine/install/)"
    docker info >/dev/null 2>&1 || die "the Docker engine is not running or not reachable (try: sudo systemctl start docker)"
}
need_aws() { command -v aws >/dev/null || die "the aws CLI is needed for $1 (pip install awscli, then aws configure)"; }

IMAGE_NAME="${IMAGE_NAME:-yolov5-smddp}"
REGION="${AWS_REGION:-${REGION:-us-west-2}}"
DLC_ACCOUNT="$(sed -n 's/^ARG DLC_ACCOUNT=//p' Dockerfile)"  # yolov5_smddp/dlc.py owns the DLC; the Dockerfile repeats it
dlc_tag() {  # dlc_tag current|smddp: the Dockerfile's ARG CURRENT_DLC_TAG / SMDDP_DLC_TAG
    case "$1" in
        current) sed -n 's/^ARG CURRENT_DLC_TAG=//p' Dockerfile ;;
        smddp) sed -n 's/^ARG SMDDP_DLC_TAG=//p' Dockerfile ;;
        *) die "--dlc must be current or smddp (got '$1')" ;;
    esac
}
DLC="${DLC:-current}"  # the default flavour: the DLC that AWS still patches (yolov5_smddp/dlc.py DEFAULT_DLC)

version() { sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1; }
git_sha() { git rev-parse --short=12 HEAD 2>/dev/null || echo nogit; }
is_ecr() { [[ "$1" =~ ^[0-9]{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$ ]]; }
registry_of() { local ref="$1"; [[ "$ref" == */* ]] && echo "${ref%%/*}" || echo ""; }

ecr_login() {  # ecr_login REGISTRY REGION
    need_aws "logging in to $1"
    echo "logging in to $1" >&2
    aws ecr get-login-password --region "$2" | docker login --username AWS --password-stdin "$1" >&2
}

image_tag() {  # image_tag BASE_KIND [DLC]
    local suffix=""
    [[ "${2:-$DLC}" == smddp ]] && suffix="-smddp"
    [[ "$1" == local ]] && suffix="${suffix}-standin"
    echo "${IMAGE_NAME}:$(version)-$(git_sha)${suffix}"
}

cmd_local_base() {  # the stand-in of the DLC flavour $DLC
    need_docker
    case "$DLC" in
        current) bash "$here/docker/current/build.sh" | tail -n 1 ;;
        *) bash "$here/docker/standin/build.sh" | tail -n 1 ;;
    esac
}

cmd_build() {
    local base="${BASE:-dlc}"
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --base) base="${2:?--base needs a value}"; shift 2 ;;
            --dlc) DLC="${2:?--dlc needs a value}"; shift 2 ;;
            --region) REGION="${2:?--region needs a value}"; shift 2 ;;
            *) die "build: unknown option $1 (see ./build.sh help)" ;;
        esac
    done
    local dlc_tag_value; dlc_tag_value="$(dlc_tag "$DLC")"
    need_docker
    local base_image kind
    case "$base" in
        local) base_image="$(cmd_local_base)"; kind=local ;;
        dlc) base_image="${DLC_ACCOUNT}.dkr.ecr.${REGION}.amazonaws.com/pytorch-training:${dlc_tag_value}"; kind=dlc ;;
        *) base_image="$base"; kind=custom ;;
    esac
    local base_registry; base_registry="$(registry_of "$base_image")"
    if is_ecr "$base_registry" && ! docker image inspect "$base_image" >/dev/null 2>&1; then
        ecr_login "$base_registry" "$REGION"
    fi
    local tag latest="${IMAGE_NAME}:latest-${kind}"; tag="$(image_tag "$kind")"
    [[ $DLC == current ]] || latest="${latest}-${DLC}"
    echo "building $tag on $base_image (DLC flavour $DLC)" >&2
    # shellcheck disable=SC2086 # DOCKER_BUILD_ARGS is a list of words on purpose
    docker build ${DOCKER_BUILD_ARGS:-} \
        --build-arg "BASE_IMAGE=$base_image" --build-arg "REGION=$REGION" --build-arg "DLC=$DLC" \
        --build-arg "VERSION=$(version)" --build-arg "GIT_REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
        -t "$tag" -t "$latest" -f Dockerfile . >&2 || die "docker build of $tag on $base_image failed (its output above)"
    echo "$tag"
}

cmd_push() {
    local registry="${REGISTRY:-}" account="${AWS_ACCOUNT_ID:-}" repo="${ECR_REPOSITORY:-$IMAGE_NAME}" image=""
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --registry) registry="${2:?--registry needs a value}"; shift 2 ;;
            --account) account="${2:?--account needs a value}"; shift 2 ;;
            --region) REGION="${2:?--region needs a value}"; shift 2 ;;
            --repo) repo="${2:?--repo needs a value}"; shift 2 ;;
            --image) image="${2:?--image needs a value}"; shift 2 ;;
            --dlc) DLC="${2:?--dlc needs a value}"; shift 2 ;;
            *) die "push: unknown option $1 (see ./build.sh help)" ;;
        esac
    done
    need_docker
    if [[ -z "$registry" ]]; then
        if [[ -z "$account" ]]; then
            need_aws "finding the AWS account (or pass --account / --registry)"
            account="$(aws sts get-caller-identity --query Account --output text)"
        fi
        registry="${account}.dkr.ecr.${REGION}.amazonaws.com"
    fi
    image="${image:-$(image_tag dlc)}"
    docker image inspect "$image" >/dev/null 2>&1 || die "image $image not found: run ./build.sh build first (or pass --image)"
    local base_label
    base_label="$(docker image inspect -f '{{ index .Config.Labels "org.opencontainers.image.base.name" }}' "$image")"
    if [[ "$base_label" == yolov5-smddp-standin:* ]]; then
        echo "warning: $image is built on the local stand-in ($base_label): no CUDA, no SMDDP. For SageMaker build with --base dlc." >&2
    fi
    if is_ecr "$registry"; then
        ecr_login "$DLC_ACCOUNT.dkr.ecr.${REGION}.amazonaws.com" "$REGION"
        ecr_login "$registry" "$REGION"
        if ! aws ecr describe-repositories --region "$REGION" --repository-names "$repo" >/dev/null 2>&1; then
            echo "creating ECR repository $repo" >&2
            aws ecr create-repository --region "$REGION" --repository-name "$repo" \
                --image-scanning-configuration scanOnPush=true >/dev/null
        fi
    fi
    local target="${registry}/${repo}:${image##*:}"
    docker tag "$image" "$target"
    echo "pushing $target" >&2
    docker push "$target" >&2
    echo "$target"
}

cmd_run() {
    local tag out gpus=()
    tag="$(BASE="${BASE:-local}" cmd_build)"
    out="$here/runs/container"
    mkdir -p "$out/model" "$out/output" "$out/checkpoints"
    if command -v nvidia-smi >/dev/null && nvidia-smi >/dev/null 2>&1; then gpus=(--gpus all); fi
    echo "running $tag train $*; outputs in $out" >&2
    # the job runs as root: the entrypoint hands the outputs back to the caller at the end
    # (YOLOV5_SMDDP_OWNER); not under rootless Docker, whose root already is the caller on the host
    local owner=()
    if [[ "$(id -u)" != 0 ]] && ! docker info -f '{{.SecurityOptions}}' 2>/dev/null | grep -q rootless; then
        owner=(-e "YOLOV5_SMDDP_OWNER=$(id -u):$(id -g)")
    fi
    # ${a[@]+...}: an empty array under set -u, which bash 3.2 (macOS) calls unbound
    docker run --rm ${gpus[@]+"${gpus[@]}"} ${owner[@]+"${owner[@]}"} --shm-size 2g \
        -v "$out/model:/opt/ml/model" -v "$out/output:/opt/ml/output" -v "$out/checkpoints:/opt/ml/checkpoints" \
        "$tag" train "$@"
}

run_pytest() {  # run_pytest WHAT COMMAND...: pytest's exit 5 (no tests collected) is a failure too
    local what="$1"; shift
    local rc=0
    "$@" || rc=$?
    if [[ $rc -eq 5 ]]; then die "$what: pytest collected no tests"; fi
    [[ $rc -eq 0 ]] || die "$what failed (exit $rc)"
}

test_chain() {  # test_chain NAME BASE_SCRIPT: a suite's base, the project image on it ($DLC flavour), the
    # test image on that; prints the test image's tag on the last line of stdout, fails at the first failure
    local name=$1 base project test_image
    base="$(bash "$here/$2" | tail -n 1)"
    [[ -n $base ]] || die "$2 printed no base image"
    project="$(IMAGE_NAME="${IMAGE_NAME}-$name" cmd_build --base "$base")"
    test_image="${IMAGE_NAME}-$name-test:$(version)-$(git_sha)"
    echo "== test image $test_image" >&2
    docker build --build-arg "BASE_IMAGE=$project" -t "$test_image" -f docker/test.Dockerfile docker >&2 ||
        die "docker build of the test image $test_image on $project failed (its output above)"
    echo "$test_image"
}

cmd_test() {
    need_docker
    command -v python3 >/dev/null || die "python3 is needed for the container tests"
    local start=$SECONDS standin image logs
    logs="$(mktemp -d "${TMPDIR:-/tmp}/yolov5-smddp-test-logs.XXXXXX")"
    # Two unit/integration suites, one per DLC flavour's versions: the current DLC's (docker/current: Python
    # 3.13, torch 2.10 from PyPI) and the SMDDP DLC's (docker/dlc-versions: Python 3.11, torch 2.5.1 from
    # PyPI; TEST_DLC_VERSIONS=0 leaves it out). Each suite's chain (its base, mostly downloads, then the
    # project image on it, then the test image) builds in the background while the SMDDP stand-in and its
    # image, which the container tests use, build in the foreground: three chains at once, as a build step
    # waits on the disk and the network more than on the cores.
    local dlc=${TEST_DLC_VERSIONS:-1} current_pid dlc_pid=""
    DLC=current test_chain current docker/current/build.sh >"$logs/current.out" 2>"$logs/current.log" &
    current_pid=$!
    if [[ $dlc == 1 ]]; then
        DLC=smddp test_chain dlc-versions docker/dlc-versions/build.sh >"$logs/dlc.out" 2>"$logs/dlc.log" &
        dlc_pid=$!
    fi
    # a step that dies before the suites start (a failed build, ruff) takes the background chains along
    # shellcheck disable=SC2064  # the pids now: they are local to this function
    trap "for p in $current_pid $dlc_pid; do pkill -P \$p 2>/dev/null; kill \$p 2>/dev/null || true; done" EXIT
    standin="$(DLC=smddp cmd_local_base)"
    image="$(DLC=smddp cmd_build --base local)"
    echo "== the SMDDP stand-in's image $image built after $((SECONDS - start)) s" >&2

    # The unit and integration tests on both DLCs' versions, at the same time: the torch internals we rely
    # on differ between releases. Two containers, each its own network and /tmp; each suite's output goes to
    # its log, printed when it ends. YOLOV5_SMDDP_SUITE names the suite (current | dlc-versions), so that an
    # expensive test can run in one of them only. YOLOV5_SMDDP_STRICT_SKIPS=1: a skip that is not on
    # tests/skip_policy.py's allow-list fails the run, and the container tests fail without the engine or
    # the image; -rs lists every skip with its reason. OMP_NUM_THREADS=1: two suites share the host (and CI
    # hosts are busy): an OpenMP pool wider than the cores it gets spins and slows everything several-fold.
    local suite_start=$SECONDS names=() pids=() i rc failed=()
    start_suite() {  # start_suite NAME IMAGE SUITE: in the background, output in $logs/suite<N>.log
        local n=${#pids[@]}
        echo "== $1 (started after $((SECONDS - start)) s)" >&2
        # YOLOV5_SMDDP_SUITE (current | dlc-versions): tests that need to run in one suite only read it
        docker run --rm -v "$here:/src" -w /src -e PYTHONDONTWRITEBYTECODE=1 -e YOLOV5_SMDDP_STRICT_SKIPS=1 \
            -e "YOLOV5_SMDDP_SUITE=$3" -e OMP_NUM_THREADS=1 "$2" \
            python3 -m pytest -p no:cacheprovider -q -rs -m "not docker" tests >"$logs/suite$n.log" 2>&1 &
        pids+=($!)
        names+=("$1")
    }
    chain_image() {  # chain_image NAME EXIT: the test image its chain built (stdout), or "" with its log's end
        # (the caller waits for the chain: `wait` inside $(...) cannot wait for the parent shell's children)
        if [[ $2 -ne 0 ]]; then
            echo "== the $1 test image did not build (exit $2); the end of its log:" >&2
            tail -n 40 "$logs/$1.log" >&2
            return 0
        fi
        grep -E '^(==|\[[a-z-]+\] (built|python)|stand-in base)' "$logs/$1.log" >&2 || true
        echo "== the $1 test image ready after $((SECONDS - start)) s" >&2
        tail -n 1 "$logs/$1.out"
    }
    local current_test_image dlc_test_image chain_rc=0
    wait "$current_pid" || chain_rc=$?
    current_test_image="$(chain_image current "$chain_rc")"
    if [[ -z $current_test_image ]]; then
        failed+=("the current-DLC test image did not build (its log's end above)")
    else
        echo "== ruff inside $current_test_image" >&2
        docker run --rm -v "$here:/src" -w /src -e PYTHONDONTWRITEBYTECODE=1 "$current_test_image" \
            ruff check --no-cache . || die "ruff check failed"
        docker run --rm -v "$here:/src" -w /src -e PYTHONDONTWRITEBYTECODE=1 "$current_test_image" \
            ruff format --no-cache --check . || die "ruff format --check failed (run: ruff format .)"
        start_suite "unit/integration tests on the current DLC's versions ($current_test_image)" \
            "$current_test_image" current
    fi
    if [[ -n $dlc_pid ]]; then
        chain_rc=0
        wait "$dlc_pid" || chain_rc=$?
        dlc_test_image="$(chain_image dlc "$chain_rc")"
        if [[ -z $dlc_test_image ]]; then
            failed+=("the DLC-versions test image did not build (its log's end above)")
        else
            start_suite "unit/integration tests on the SMDDP DLC's versions ($dlc_test_image)" \
                "$dlc_test_image" dlc-versions
        fi
    fi
    trap - EXIT
    for i in "${!pids[@]}"; do
        rc=0
        wait "${pids[$i]}" || rc=$?
        echo "== ${names[$i]}: exit $rc, $((SECONDS - suite_start)) s after the first suite started" >&2
        cat "$logs/suite$i.log"
        if [[ $rc -eq 5 ]]; then failed+=("${names[$i]}: pytest collected no tests")
        elif [[ $rc -ne 0 ]]; then failed+=("${names[$i]} failed (exit $rc)"); fi
    done
    [[ ${#failed[@]} -eq 0 ]] || die "$(printf '%s; ' "${failed[@]}")"

    echo "== container tests (pytest -m docker) from the host" >&2
    local venv="${TEST_VENV:-$here/.venv}"
    if [[ ! -x "$venv/bin/python" ]]; then
        python3 -m venv "$venv" || die "python3 -m venv failed (Debian/Ubuntu: apt-get install python3-venv)"
    fi
    # docker: the Docker SDK for Python (7.1 is the first to work with requests >= 2.32; it negotiates the
    # engine's API version, so Docker Engine 20.10 to 28 all do). sagemaker: the SageMaker Python SDK v2 whose
    # local mode tests/docker/test_sdk_local.py drives (it needs `docker compose` or `docker-compose`).
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "pytest>=7" "pyyaml>=6" "docker>=7.1,<8" \
        "sagemaker~=2.257.0" || die "pip install pytest pyyaml docker sagemaker failed"
    run_pytest "container tests" env YOLOV5_SMDDP_IMAGE="$image" YOLOV5_SMDDP_STANDIN="$standin" \
        YOLOV5_SMDDP_STRICT_SKIPS=1 "$venv/bin/python" -m pytest -p no:cacheprovider -q -rs -m docker tests/docker
    rm -rf "$logs"
    local also=""
    [[ -z $dlc_pid ]] || also=" (the SMDDP DLC-versions suite included)"
    echo "== all tests passed in $((SECONDS - start)) s$also" >&2
}

main() {
    local command="${1:-help}"
    [[ $# -gt 0 ]] && shift
    case "$command" in
        build) cmd_build "$@" ;;
        push) cmd_push "$@" ;;
        local-base) cmd_local_base ;;
        test) cmd_test "$@" ;;
        run) cmd_run "$@" ;;
        help|-h|--help) usage ;;
        *) usage >&2; die "unknown command $command" ;;
    esac
}

main "$@"
