#!/usr/bin/env bash
# Builds the DLC-versions test base (see ./Dockerfile) with docker/standin/build.sh's two paths and its
# content-hash tag: built once per machine, rebuilt only when a file of this recipe changes.
#
#   docker/dlc-versions/build.sh          build if missing, print the tag on the last line of stdout
#   docker/dlc-versions/build.sh --tag    print the tag only
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STANDIN_RECIPE_DIR="$here" STANDIN_RECIPE="Dockerfile packages.txt pip-requirements.txt setup.sh" \
    STANDIN_SUITE=bookworm STANDIN_BASE_IMAGE="${DLC_VERSIONS_BASE_IMAGE:-debian:bookworm-slim}" \
    STANDIN_IMAGE_NAME=yolov5-smddp-dlc-versions-base exec bash "$here/../standin/build.sh" "$@"
