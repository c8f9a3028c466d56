#!/usr/bin/env bash
# Turns a bare Debian trixie root into the current-DLC stand-in. Runs as root INSIDE that root, the same for
# both build paths (docker/standin/build.sh's debootstrap chroot, or the Dockerfile's RUN).
#
#   setup.sh DIR    DIR holds packages.txt, pip-requirements.txt and start_with_right_hostname.sh
set -euo pipefail

src="${1:?usage: setup.sh DIR (with packages.txt, pip-requirements.txt, start_with_right_hostname.sh)}"
export DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8

apt-get update -q
mapfile -t packages < <(grep -v '^\s*#' "$src/packages.txt" | sed '/^\s*$/d')
echo "[current] apt-get install ${#packages[@]} packages"
apt-get install -y -q --no-install-recommends "${packages[@]}"

# as in docker/standin/setup.sh: the build host's CA bundle (empty where it has none) for a TLS proxy
host_ca=/usr/local/share/yolov5-smddp-standin/host-ca.crt
if [[ -s $host_ca ]]; then cat "$host_ca" > /etc/ssl/certs/ca-certificates.crt; fi

echo "[current] pip install torch and the SageMaker toolkits"
PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    python3 -m pip install --break-system-packages --no-cache-dir --disable-pip-version-check -q \
    --root-user-action=ignore -r "$src/pip-requirements.txt"

# The toolkit's MPI path needs sshd and password-less root ssh between hosts (as in the stand-in).
mkdir -p /var/run/sshd /root/.ssh
chmod 700 /root/.ssh
ssh-keygen -q -t ed25519 -N "" -f /root/.ssh/id_ed25519
cp /root/.ssh/id_ed25519.pub /root/.ssh/authorized_keys
printf 'Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n' > /root/.ssh/config
mkdir -p /opt/ml/code /opt/ml/input/config /opt/ml/model /opt/ml/output
# Open MPI 5's remote daemon under Open MPI 4's name (see docker/standin/setup.sh)
ln -s /usr/bin/prted /usr/local/bin/orted
install -m 0755 "$src/start_with_right_hostname.sh" /usr/local/bin/start_with_right_hostname.sh

python3 -c 'import sys, torch, torchvision, cv2, mpi4py, onnx, onnxscript, sagemaker_training, sagemaker_pytorch_container
assert sys.version_info[:2] == (3, 13) and torch.__version__.startswith("2.10.0"), (sys.version, torch.__version__)
print("[current] python", sys.version.split()[0], "torch", torch.__version__, "torchvision",
      torchvision.__version__, "cv2", cv2.__version__, "mpi4py", mpi4py.__version__)'

apt-get clean
rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /tmp/* /root/.cache
