#!/usr/bin/env bash
# Lint and the whole test suite (real Ray, real Ultralytics, CPU/gloo; the multi-node test needs root + iproute2).
#   scripts/test.sh [pytest args]
set -euo pipefail
source "$(dirname "$0")/setup.sh"
if [ "$(id -u)" = 0 ] && ! command -v ip >/dev/null; then
  apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null
fi
ruff check yolo_ray tests benchmarks
ruff format --check yolo_ray tests benchmarks
exec python -m pytest "$@"
