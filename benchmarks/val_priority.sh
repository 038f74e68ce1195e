#!/usr/bin/env bash
# Validation on a thread beside training (issue #23), on one GPU, the parity issue's real-shaped data, 10 epochs,
# seed 0, each run alone: does the validation thread leave the training thread's epoch alone (the issue's bar: <= 5%)
# once its forward is replayed as CUDA graphs (few launches, little GIL) and, in the third run, training's kernels go
# on a CUDA stream of a higher priority than validation's (trial knob YOLO_RAY_TRAIN_STREAM_PRIORITY, worker/loop.py)?
#   graphs             the fast path validating only at its end: the reference epoch
#   valthread.graphs   train.val_async on rank 0's thread, train.val_cuda_graphs
#   valthread.first    the same, training's stream at priority -5 (validation's stays at 0)
# ORDER=reverse runs them the other way round (a shared host drifts within a call). One JSON a run, then the three
# in one table (merge): $OUT_DIR/val-priority.json.
#   bash benchmarks/val_priority.sh; ORDER=reverse bash benchmarks/val_priority.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT_DIR:-benchmarks/runs-val-priority}
mkdir -p "$out"
bench() { python -m yolo_ray bench --parity out_dir="$out/runs" "$@"; }
graphs() { bench runs=graphs-e10-s0 --out "$out/graphs.json"; }
thread() { bench runs=valthread-e10-s0 overrides=train.val_cuda_graphs=true label=graphs --out "$out/thread.json"; }
first() {
  YOLO_RAY_TRAIN_STREAM_PRIORITY=-5 bench runs=valthread-e10-s0 overrides=train.val_cuda_graphs=true label=first \
    --out "$out/first.json"
}
if [ "${ORDER:-}" = reverse ]; then first; thread; graphs; else graphs; thread; first; fi
bench runs=none merge="$out/graphs.json,$out/thread.json,$out/first.json" --out "$out/val-priority.json"
