#!/usr/bin/env bash
# Builds the current-DLC stand-in (see ./Dockerfile) with docker/standin/build.sh's two paths and its
# content-hash tag: built once per machine, rebuilt only when a file of this recipe changes.
#
#   docker/current/build.sh          build if missing, print the tag on the last line of stdout
#   docker/current/build.sh --tag    print the tag only
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STANDIN_RECIPE_DIR="$here" STANDIN_RECIPE="Dockerfile packages.txt pip-requirements.txt setup.sh start_with_right_hostname.sh" \
    STANDIN_SUITE=trixie STANDIN_BASE_IMAGE="${CURRENT_BASE_IMAGE:-debian:trixie-slim}" \
    STANDIN_IMAGE_NAME=yolov5-smddp-current-standin exec bash "$here/../standin/build.sh" "$@"
