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

# Debian's torch has no libuv, the DLC's has. The image's ENV USE_LIBUV=0 does not reach the ranks that the
# toolkit's mpirun starts over ssh, and the toolkit's torchrun ignores it: a module that every Python process
# imports (through a .pth file) makes each TCPStore without libuv. Checked here with a store that asks for it.
site_dir="$(python3 -c 'import site; print(site.getsitepackages()[0])')"
install -D -m 0644 "$src/torch_without_libuv.py" "$site_dir/yolov5_smddp_standin_nolibuv.py"
echo "import yolov5_smddp_standin_nolibuv" > "$site_dir/yolov5_smddp_standin_nolibuv.pth"
env -u USE_LIBUV python3 -c 'import datetime, os, torch.distributed as d
s = d.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=30), use_libuv=True)
s.set("k", "v")
assert s.get("k") == b"v" and not s.libuvBackend and os.environ["USE_LIBUV"] == "0"
print("[standin] TCPStore without libuv: ok")'

apt-get clean
rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /tmp/*
