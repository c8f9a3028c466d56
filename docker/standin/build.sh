#!/usr/bin/env bash
# Builds the local stand-in for the AWS PyTorch training DLC as a Docker image: Debian packages plus the real
# sagemaker-training toolkits from PyPI, set up by setup.sh. Two paths make the same image:
#   dockerfile   `docker build` of ./Dockerfile FROM debian:<suite>-slim: needs only Docker and that base image
#                (pulled if missing), so it works on Docker Desktop (macOS, Windows) and without root.
#   debootstrap  debootstrap + chroot + `docker import`: needs root on a Debian-like Linux host, but no registry.
# STANDIN_METHOD=auto (the default) takes the dockerfile path when the base image is present or can be pulled,
# else debootstrap. The tag carries a content hash of the recipe (not of the path), so the image is built once
# per machine, rebuilt only when its recipe changes, and the same tag whichever path built it.
#
#   docker/standin/build.sh            build if missing, print the tag on the last line of stdout
#   docker/standin/build.sh --tag      print the tag only
#   docker/standin/build.sh --method   print the path a build would take (may pull the base image)
#
# environment: STANDIN_METHOD (auto|dockerfile|debootstrap), STANDIN_SUITE (trixie), STANDIN_MIRROR (the
# debootstrap mirror), STANDIN_BASE_IMAGE (debian:<suite>-slim), STANDIN_PULL_TIMEOUT (seconds, 300),
# STANDIN_IMAGE_NAME (yolov5-smddp-standin). Another image built the same way (docker/dlc-versions/build.sh)
# sets STANDIN_RECIPE_DIR (the folder of its recipe, this one's by default) and STANDIN_RECIPE (its files, the
# Dockerfile first).
set -euo pipefail

here="$(cd "${STANDIN_RECIPE_DIR:-$(dirname "${BASH_SOURCE[0]}")}" && pwd)"
suite="${STANDIN_SUITE:-trixie}"
mirror="${STANDIN_MIRROR:-http://deb.debian.org/debian}"
base_image="${STANDIN_BASE_IMAGE:-debian:${suite}-slim}"
# the Dockerfile first, then what it copies (setup.sh runs as `setup.sh DIR` with all of them in DIR)
read -r -a recipe <<< "${STANDIN_RECIPE:-Dockerfile packages.txt pip-requirements.txt setup.sh start_with_right_hostname.sh torch_without_libuv.py}"

die() { echo "error: $*" >&2; exit 1; }
ctx="" root=""  # the dockerfile path's build context, the debootstrap path's root: removed on exit
cleanup() {
    if [[ -n $ctx ]]; then rm -rf "$ctx"; fi
    if [[ -n $root ]]; then
        for m in dev/pts proc sys; do umount "$root/$m" 2>/dev/null || true; done
        rm -rf --one-file-system "$root"
    fi
}
trap cleanup EXIT
sha256() { if command -v sha256sum >/dev/null; then sha256sum; else shasum -a 256; fi; }  # macOS: shasum

# What lands in the image is the recipe and the suite; this script only chooses and drives a path, so it is
# not hashed (the same inputs give the same tag on either path).
hash="$(cd "$here" && cat "${recipe[@]}" | { cat; echo "$suite"; } | sha256 | cut -c1-12)"
tag="${STANDIN_IMAGE_NAME:-yolov5-smddp-standin}:${hash}"

pull_base() {  # a registry that cannot be reached may hang rather than fail: bound the pull where we can
    echo "[standin] docker pull $base_image" >&2
    if command -v timeout >/dev/null; then
        timeout "${STANDIN_PULL_TIMEOUT:-300}" docker pull -q "$base_image" >&2
    else
        docker pull -q "$base_image" >&2
    fi
}

choose_method() {
    case "${STANDIN_METHOD:-auto}" in
        dockerfile | debootstrap) echo "$STANDIN_METHOD"; return ;;
        auto) ;;
        *) die "STANDIN_METHOD must be auto, dockerfile or debootstrap (got '$STANDIN_METHOD')" ;;
    esac
    if docker image inspect "$base_image" >/dev/null 2>&1 || pull_base; then
        echo dockerfile
    else
        echo "[standin] $base_image cannot be pulled: building with debootstrap instead" >&2
        echo debootstrap
    fi
}

build_with_dockerfile() {
    ctx="$(mktemp -d "${TMPDIR:-/tmp}/yolov5-smddp-standin-context.XXXXXX")"
    (cd "$here" && cp "${recipe[@]}" "$ctx/")
    # Downloads in the build may go through the same TLS-intercepting proxy as the host's: trust its bundle.
    if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
        cp /etc/ssl/certs/ca-certificates.crt "$ctx/host-ca.crt"
    else
        : > "$ctx/host-ca.crt"
    fi
    docker build --build-arg "SUITE=$suite" --build-arg "BASE_IMAGE=$base_image" -t "$tag" "$ctx" >&2
}

build_with_debootstrap() {
    [[ $(id -u) -eq 0 ]] || die "building the stand-in without the base image $base_image needs root" \
        "(debootstrap, chroot); or make $base_image available (docker pull) and use STANDIN_METHOD=dockerfile"
    if ! command -v debootstrap >/dev/null; then
        command -v apt-get >/dev/null || die "debootstrap is needed (Debian-like hosts), or the base image $base_image"
        echo "installing debootstrap" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >&2
    fi
    root="$(mktemp -d /var/tmp/yolov5-smddp-standin.XXXXXX)"

    echo "[standin] debootstrap $suite minbase into $root" >&2
    debootstrap --variant=minbase "$suite" "$root" "$mirror" >&2
    mkdir -p "$root/usr/local/share/yolov5-smddp-standin" "$root/tmp/standin"
    if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then  # as in build_with_dockerfile
        cp /etc/ssl/certs/ca-certificates.crt "$root/usr/local/share/yolov5-smddp-standin/host-ca.crt"
    else
        : > "$root/usr/local/share/yolov5-smddp-standin/host-ca.crt"
    fi
    (cd "$here" && cp "${recipe[@]:1}" "$root/tmp/standin/")  # all but the Dockerfile
    mount -t proc proc "$root/proc"
    mount --bind /dev/pts "$root/dev/pts"
    mount -t sysfs sys "$root/sys"
    # A clean environment: the host's PIP_* and proxy settings must not leak in (the Dockerfile's RUN has none).
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        chroot "$root" bash /tmp/standin/setup.sh /tmp/standin >&2
    for m in dev/pts proc sys; do umount "$root/$m"; done

    # The image settings are the Dockerfile's (one instruction a line after its RUN).
    local changes=() line
    while IFS= read -r line; do changes+=(--change "$line"); done \
        < <(sed -n '/^RUN /,$p' "$here/Dockerfile" | grep -E '^(ENV|LABEL|WORKDIR|ENTRYPOINT|CMD) ')
    echo "[standin] docker import as $tag" >&2
    tar -C "$root" --numeric-owner -c . | docker import "${changes[@]}" - "$tag" >&2
}

case "${1:-}" in
    --tag) echo "$tag"; exit 0 ;;
    --method) choose_method; exit 0 ;;
    "") ;;
    *) die "unknown option $1 (--tag, --method or none)" ;;
esac
if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "stand-in base $tag already built" >&2
    echo "$tag"; exit 0
fi
start=$SECONDS
method="$(choose_method)"
echo "[standin] building $tag with the $method path" >&2
"build_with_$method"
echo "[standin] built $tag ($method) in $((SECONDS - start)) s" >&2
echo "$tag"
