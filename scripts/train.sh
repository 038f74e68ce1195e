#!/usr/bin/env bash
# The main job on the embedded default: local Ray, generated data, 2 CPU workers (or all local GPUs).
#   scripts/train.sh [CONFIG.yaml] [key=value ...]
set -euo pipefail
source "$(dirname "$0")/setup.sh"
exec yolo-ray train "$@"
