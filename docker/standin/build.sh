#!/usr/bin/env bash
# Builds the local stand-in for the AWS PyTorch training DLC as a Docker image, from Debian packages plus
# the real sagemaker-training toolkits from PyPI (no registry is needed). The tag carries a content hash
# of this folder, so the image is built once per machine and rebuilt only when its recipe changes.
#
#   docker/standin/build.sh            build if missing, print the tag on the last line of stdout
#   docker/standin/build.sh --tag      print the tag only
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
suite="${STANDIN_SUITE:-trixie}"
mirror="${STANDIN_MIRROR:-http://deb.debian.org/debian}"
hash="$(cd "$here" && cat build.sh packages.txt pip-requirements.txt start_with_right_hostname.sh \
        | { cat; echo "$suite"; } | sha256sum | cut -c1-12)"
tag="yolov5-smddp-standin:${hash}"

if [[ "${1:-}" == "--tag" ]]; then echo "$tag"; exit 0; fi
if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "stand-in base $tag already built" >&2
    echo "$tag"; exit 0
fi
if [[ $(id -u) -ne 0 ]]; then echo "error: building the stand-in needs root (debootstrap, chroot)" >&2; exit 1; fi
if ! command -v debootstrap >/dev/null; then
    echo "installing debootstrap" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >&2
fi

root="$(mktemp -d /var/tmp/yolov5-smddp-standin.XXXXXX)"
cleanup() {
    for m in dev/pts proc sys; do umount "$root/$m" 2>/dev/null || true; done
    rm -rf --one-file-system "$root"
}
trap cleanup EXIT

start=$SECONDS
echo "[standin] debootstrap $suite minbase into $root" >&2
debootstrap --variant=minbase "$suite" "$root" "$mirror" >&2

# Downloads inside the root go through the same TLS-intercepting proxy as the host's: trust its bundle.
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
    mkdir -p "$root/usr/local/share/yolov5-smddp-standin"
    cp /etc/ssl/certs/ca-certificates.crt "$root/usr/local/share/yolov5-smddp-standin/host-ca.crt"
fi
mount -t proc proc "$root/proc"; mount --bind /dev/pts "$root/dev/pts"; mount -t sysfs sys "$root/sys"

in_root() {  # a clean environment: the host's PIP_* and proxy settings must not leak in
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive \
        PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
        chroot "$root" "$@"
}
mapfile -t packages < <(grep -v '^\s*#' "$here/packages.txt" | sed '/^\s*$/d')
echo "[standin] apt-get install ${#packages[@]} packages" >&2
in_root apt-get install -y -q --no-install-recommends "${packages[@]}" >&2
if [[ -f "$root/usr/local/share/yolov5-smddp-standin/host-ca.crt" ]]; then
    cat "$root/usr/local/share/yolov5-smddp-standin/host-ca.crt" > "$root/etc/ssl/certs/ca-certificates.crt"
fi
echo "[standin] pip install the SageMaker toolkits" >&2
cp "$here/pip-requirements.txt" "$root/tmp/pip-requirements.txt"
in_root python3 -m pip install --break-system-packages --no-cache-dir -q -r /tmp/pip-requirements.txt >&2

# The toolkit's MPI path (SMDDP distribution) needs sshd and password-less root ssh between hosts.
in_root bash -c 'mkdir -p /var/run/sshd /root/.ssh && chmod 700 /root/.ssh &&
  ssh-keygen -q -t ed25519 -N "" -f /root/.ssh/id_ed25519 &&
  cp /root/.ssh/id_ed25519.pub /root/.ssh/authorized_keys &&
  printf "Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n" > /root/.ssh/config &&
  mkdir -p /opt/ml/code /opt/ml/input/config /opt/ml/model /opt/ml/output' >&2
# The toolkit on a worker host waits for the remote daemon of Open MPI 4, a process named `orted`; Open MPI 5
# names it `prted`. Launch it under the old name (PRTE_MCA_prte_launch_agent below) so workers finish.
ln -s /usr/bin/prted "$root/usr/local/bin/orted"
install -m 0755 "$here/start_with_right_hostname.sh" "$root/usr/local/bin/start_with_right_hostname.sh"
in_root bash -c 'apt-get clean && rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /tmp/*' >&2

for m in dev/pts proc sys; do umount "$root/$m"; done
echo "[standin] docker import as $tag" >&2
tar -C "$root" --numeric-owner -c . | docker import \
    --change 'ENV USE_LIBUV=0' \
    --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' \
    --change 'ENV PYTHONUNBUFFERED=1' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/opt/ml/code:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV SAGEMAKER_TRAINING_MODULE=sagemaker_pytorch_container.training:main' \
    --change 'ENV PRTE_MCA_prte_launch_agent=orted' \
    --change 'LABEL org.opencontainers.image.title=yolov5-smddp-standin' \
    --change 'LABEL org.opencontainers.image.description="Local stand-in for the AWS PyTorch training DLC"' \
    --change 'WORKDIR /' \
    --change 'ENTRYPOINT ["bash", "-m", "/usr/local/bin/start_with_right_hostname.sh"]' \
    --change 'CMD ["/bin/bash"]' \
    - "$tag" >&2
echo "[standin] built $tag in $((SECONDS - start)) s" >&2
echo "$tag"
