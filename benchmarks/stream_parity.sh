#!/usr/bin/env bash
# The stream loader on the parity issue's real-shaped data (issue #24), one GPU:
#   1. timed, alone, side by side: streamcpu-e10-s0 (OpenCV in Ray Data tasks) then graphs-e10-s0 (in memory);
#      during the stream run's epochs 3-5: py-spy (every thread of the Train worker), GPU utilisation, top;
#   2. accuracy runs up to PARALLEL at once (contended clocks): RUNS (default the other seeds and 30 epochs).
#   bash benchmarks/stream_parity.sh          (needs py-spy on PATH for the profile; skipped without it)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT_DIR:-benchmarks/runs-parity}
prof=$out/profile
mkdir -p "$prof"
timed=${TIMED:-streamcpu-e10-s0,graphs-e10-s0}
rest=${RUNS:-streamcpu-e30-s0,streamcpu-e30-s1,streamcpu-e30-s2,streamcpu-e10-s1,streamcpu-e10-s2}

sample() {  # $1: run name; waits for its third epoch, then samples for 20 s
  local hist=$out/$1/history.jsonl
  for _ in $(seq 600); do [ "$(grep -c '' "$hist" 2>/dev/null || echo 0)" -ge 3 ] && break; sleep 1; done
  local pid
  pid=$(pgrep -f 'RayTrainWorker' | head -1 || true)
  echo "[bench] profiling $1: train worker pid ${pid:-none}"
  nvidia-smi dmon -s u -c 20 > "$prof/$1.gpu.txt" 2>&1 &
  top -b -c -d 5 -n 4 -w 250 > "$prof/$1.top.txt" 2>&1 &
  if [ -n "$pid" ] && command -v py-spy > /dev/null; then
    py-spy record -p "$pid" -d 20 -r 50 --threads --idle --format raw -o "$prof/$1.pyspy.txt" > /dev/null 2>&1 || true
  fi
  wait
}

first=${timed%%,*}
sample "$first" &
python -m yolo_ray bench --parity out_dir="$out" runs="$timed" --out "$out/timed.json"
wait
python -m yolo_ray bench --parity out_dir="$out" parallel="${PARALLEL:-5}" merge="$out/timed.json,${EARLIER:-benchmarks/results/2026-12-02-h200-parity-real-yolo11n-e10-e30.json}" runs="$rest" \
  --out "$out/stream-parity.json"
