#!/usr/bin/env bash
# Creates .venv (once) and installs yolo_ray with its dependencies into it. Sourced by train.sh and test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.yolo_ray-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # pip byte-compiles ~20k files on one core (~60 s here); compileall on every core halves that. Compiled once, not
  # on every import: this machine sets PYTHONDONTWRITEBYTECODE, so nothing compiled later is kept.
  .venv/bin/python -m pip install -q --no-compile -e ".[dev]"
  # a few packages ship files that do not compile (templates, py2 tests); pip skips them silently too
  .venv/bin/python -m compileall -q -j 0 .venv/lib >/dev/null || true
  touch "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
