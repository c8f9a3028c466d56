#!/usr/bin/env bash
# Unpacks the YOLOv5 release v7.0 (PyPI `yolov5` 7.0.14, GPL-3.0) into bench/release_reference/release_src/
# (git-ignored: never committed, never in our image) so that bench/gpu_all.sh can time its training step
# side by side on a machine without network access. Run it here, where PyPI is reachable; then carry the
# folder to the GPU machine with the checkout (e.g. the device tool's `carry`).
#
#   bash bench/release_reference/fetch_release.sh        # needs python3 with pip and network access
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="$here/release_src"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"${PYTHON:-python3}" -m pip download -q --no-deps --disable-pip-version-check -d "$tmp" yolov5==7.0.14
rm -rf "$dest" && mkdir -p "$dest"
"${PYTHON:-python3}" -m zipfile -e "$tmp"/yolov5-7.0.14-*.whl "$tmp/unpacked"
mv "$tmp/unpacked/yolov5" "$dest/yolov5"
echo "release v7.0.14 in $dest/yolov5 ($(find "$dest" -name '*.py' | wc -l) Python files)"
