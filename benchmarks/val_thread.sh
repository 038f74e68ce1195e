#!/usr/bin/env bash
# Validation every epoch on one GPU (issue #23), on the parity issue's real-shaped data, each run alone, one after
# the other: the fast path validating only at its end (graphs), on a thread of rank 0's process (valthread) and
# inline (valinline). During valthread's epochs 3-5, py-spy samples which thread of the Train worker holds the GIL
# (--gil), then every thread (--idle). Results: $OUT_DIR/val.json, profiles in $OUT_DIR/profile.
#   bash benchmarks/val_thread.sh            (py-spy on PATH for the profile; skipped without it)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT_DIR:-benchmarks/runs-val}
prof=$out/profile
mkdir -p "$prof"

sample() {  # $1: run dir; waits for its third epoch, then samples
  for _ in $(seq 900); do [ "$(grep -c '' "$1/history.jsonl" 2>/dev/null || echo 0)" -ge 3 ] && break; sleep 1; done
  local pid
  pid=$(pgrep -f 'RayTrainWorker' | head -1 || true)
  echo "[bench] profiling $1: train worker pid ${pid:-none}"
  if [ -n "$pid" ] && command -v py-spy > /dev/null; then
    py-spy record -p "$pid" -d 12 -r 100 --threads --gil --format raw -o "$prof/gil.txt" > /dev/null 2>&1 || true
    py-spy record -p "$pid" -d 8 -r 100 --threads --idle --format raw -o "$prof/threads.txt" > /dev/null 2>&1 || true
  fi
}

sample "$out/valthread-e10-s0" &
python -m yolo_ray bench --parity out_dir="$out" runs="${RUNS:-graphs-e10-s0,valthread-e10-s0,valinline-e10-s0}" \
  --out "$out/val.json"
wait
