#!/usr/bin/env bash
# Turns a bare Debian root into the local DLC stand-in. Runs as root INSIDE that root, the same for both
# build paths of build.sh: in the debootstrap chroot and as the Dockerfile's RUN on debian:<suite>-slim.
#
#   setup.sh DIR    DIR holds packages.txt, pip-requirements.txt and start_with_right_hostname.sh
set -euo pipefail

src="${1:?usage: setup.sh DIR (with packages.txt, pip-requirements.txt, start_with_right_hostname.sh)}"
export DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8

# debian:*-slim ships without package lists; debootstrap's are fresh anyway.
apt-get update -q
mapfile -t packages < <(grep -v '^\s*#' "$src/packages.txt" | sed '/^\s*$/d')
echo "[standin] apt-get install ${#packages[@]} packages"
apt-get install -y -q --no-install-recommends "${packages[@]}"

# Downloads may go through a TLS-intercepting proxy whose CA only the build host trusts: build.sh puts the
# host's bundle here (empty where the host has none) and it replaces Debian's store.
host_ca=/usr/local/share/yolov5-smddp-standin/host-ca.crt
if [[ -s $host_ca ]]; then cat "$host_ca" > /etc/ssl/certs/ca-certificates.crt; fi

echo "[standin] pip install the SageMaker toolkits"
PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    python3 -m pip install --break-system-packages --no-cache-dir --disable-pip-version-check -q \
    -r "$src/pip-requirements.txt"

# The toolkit's MPI path (SMDDP distribution) needs sshd and password-less root ssh between hosts.
mkdir -p /var/run/sshd /root/.ssh
chmod 700 /root/.ssh
ssh-keygen -q -t ed25519 -N "" -f /root/.ssh/id_ed25519
cp /root/.ssh/id_ed25519.pub /root/.ssh/authorized_keys
printf 'Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n' > /root/.ssh/config
mkdir -p /opt/ml/code /opt/ml/input/config /opt/ml/model /opt/ml/output

# The toolkit on a worker host waits for the remote daemon of Open MPI 4, a process named `orted`; Open MPI 5
# names it `prted`. Launch it under the old name (PRTE_MCA_prte_launch_agent in the image) so workers finish.
ln -s /usr/bin/prted /usr/local/bin/orted
install -m 0755 "$src/start_with_right_hostname.sh" /usr/local/bin/start_with_right_hostname.sh

apt-get clean
rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /tmp/*
