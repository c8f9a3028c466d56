#!/usr/bin/env bash
# Developer check, not part of CI (it builds the stand-in twice, ~30 min on 2 cores): build.sh's dockerfile and
# debootstrap paths give the same tag and the same stand-in. Needs root and Debian's package mirror.
#
#   docker/standin/check_paths.sh
#
# Where debian:<suite>-slim cannot be pulled (no registry), a test-only equivalent is made first: debootstrap
# minbase + `docker import` as yolov5-smddp-standin-testbase:<suite>-slim. The dockerfile path is built FROM it
# under the image name yolov5-smddp-standin-dockerfile (same hash), the debootstrap path as usual; then both are
# probed (Python, torch and its backends, torchvision, OpenCV, numpy, mpi4py, the toolkits and their pip
# dependencies, every package of packages.txt, Open MPI, the ssh/MPI setup, the image settings) and compared.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
suite="${STANDIN_SUITE:-trixie}"
[[ $(id -u) -eq 0 ]] || { echo "error: needs root (debootstrap for the test base)" >&2; exit 1; }

base="debian:${suite}-slim"
if ! docker image inspect "$base" >/dev/null 2>&1 && ! docker pull -q "$base" >/dev/null 2>&1; then
    base="yolov5-smddp-standin-testbase:${suite}-slim"
    if ! docker image inspect "$base" >/dev/null 2>&1; then
        root="$(mktemp -d /var/tmp/yolov5-smddp-testbase.XXXXXX)"
        trap 'rm -rf --one-file-system "$root"' EXIT
        echo "== test base $base: debootstrap minbase $suite" >&2
        debootstrap --variant=minbase "$suite" "$root" "${STANDIN_MIRROR:-http://deb.debian.org/debian}" >&2
        tar -C "$root" --numeric-owner -c . | docker import --change 'CMD ["bash"]' - "$base" >&2
    fi
fi

start=$SECONDS
echo "== debootstrap path" >&2
by_debootstrap="$(STANDIN_METHOD=debootstrap bash "$here/build.sh" | tail -n 1)"
echo "== dockerfile path on $base" >&2
by_dockerfile="$(STANDIN_METHOD=dockerfile STANDIN_BASE_IMAGE="$base" \
    STANDIN_IMAGE_NAME=yolov5-smddp-standin-dockerfile bash "$here/build.sh" | tail -n 1)"
echo "== built in $((SECONDS - start)) s: $by_debootstrap and $by_dockerfile" >&2
[[ "${by_debootstrap#*:}" == "${by_dockerfile#*:}" ]] || { echo "FAIL: the tags differ" >&2; exit 1; }

packages="$(grep -v '^\s*#' "$here/packages.txt" | sed '/^\s*$/d' | tr '\n' ' ')"
probe() {  # probe IMAGE: one line per fact, sorted (Env's order differs between the paths: not a difference)
    {
    docker image inspect -f '{{range .Config.Env}}env {{.}}{{"\n"}}{{end}}' "$1"
    docker image inspect -f \
        'config Entrypoint={{json .Config.Entrypoint}} Cmd={{json .Config.Cmd}} WorkingDir={{.Config.WorkingDir}} Labels={{json .Config.Labels}}' \
        "$1"
    docker run --rm --entrypoint bash "$1" -c "
python3 -c '
import sys, importlib.metadata as md
import torch, torchvision, cv2, numpy, yaml, mpi4py, torch.distributed as dist
print(\"python\", sys.version.split()[0])
print(\"torch\", torch.__version__, \"gloo\", dist.is_gloo_available(), \"mpi\", dist.is_mpi_available())
print(\"torchvision\", torchvision.__version__, \"cv2\", cv2.__version__, \"numpy\", numpy.__version__)
print(\"yaml\", yaml.__version__, \"mpi4py\", mpi4py.__version__)
for name in (\"sagemaker-training\", \"sagemaker-pytorch-training\"):
    print(\"toolkit\", name, md.version(name))
'
python3 -m pip list --format=freeze --path /usr/local/lib/python3*/dist-packages 2>/dev/null | sed 's/^/pip /'
dpkg-query -W -f '\${Package} \${Version} \${db:Status-Status}\n' $packages | sed 's/^/deb /'
echo \"mpirun \$(mpirun --version | head -1)\"
echo \"orted -> \$(readlink /usr/local/bin/orted)\"
echo \"entry \$(sha256sum < /usr/local/bin/start_with_right_hostname.sh | cut -c1-16)\"
echo \"ssh config \$(sha256sum < /root/.ssh/config | cut -c1-16) keys \$(test -s /root/.ssh/authorized_keys && echo yes)\"
echo \"dirs \$(ls -d /var/run/sshd /opt/ml/* | tr '\n' ' ')\"
echo \"host-ca \$(test -s /usr/local/share/yolov5-smddp-standin/host-ca.crt && echo present)\"
"
    } | sed '/^$/d' | sort
}

probe "$by_debootstrap" > /tmp/standin-probe-debootstrap.txt
probe "$by_dockerfile" > /tmp/standin-probe-dockerfile.txt
echo "== $(wc -l < /tmp/standin-probe-debootstrap.txt) facts compared" >&2
if diff -u /tmp/standin-probe-debootstrap.txt /tmp/standin-probe-dockerfile.txt; then
    echo "SAME: $by_debootstrap and $by_dockerfile" >&2
else
    echo "FAIL: the two paths differ (above)" >&2
    exit 1
fi
