#!/usr/bin/env bash
# Stand-in for the DLC's ENTRYPOINT script of the same name. The real one LD_PRELOADs a shim that makes
# gethostname() return the SageMaker host name before `train`; the stand-in's containers are started with
# --hostname algo-N instead, so it only hands over to the command.
set -e
exec "$@"
