#!/usr/bin/env bash
# The stream loader at two dataset sizes against the in-memory fast path (issue #24), on one GPU:
#   generate N real-shaped images at 640 px; a COPIES x N split of hard links to them (benchmarks/link_dataset.py);
#   train on N: graphs (device cache + CUDA graphs), stream (stream_decode auto: worker on one GPU host, OpenCV in the
#   Train worker's own processes) and streamcpu (OpenCV in Ray Data tasks), 3 epochs;
#   train on COPIES x N: stream, 2 epochs. Each run's per-epoch images/s and peak GPU memory -> benchmarks/runs-scale/epochs.json
#   IMAGES=10000 COPIES=5 bash benchmarks/stream_scale.sh
set -euo pipefail
cd "$(dirname "$0")/.."
#   COPIES=0: the first size only; SMALL_RUNS=... / LARGE_RUNS=...: other runs at the first / the second size
#   (SMALL_RUNS= empty: none at the first size, e.g. a second call on the same warm machine); PROBE=0: no decode probe
n=${IMAGES:-10000} copies=${COPIES:-5} out=${OUT_DIR:-benchmarks/runs-scale}
mkdir -p "$out"
[ -f "datasets/scale$n/data.yaml" ] || python -m yolo_ray data synth "datasets/scale$n" style=real images="$n" imgsz=640 classes=5
[ "${PROBE:-1}" = 0 ] || python benchmarks/decode_probe.py "datasets/scale$n/train/images" 512 --out "$out/decode.json"
summarize() {  # each run's epochs so far -> $out/epochs.json (after each size: a call cut short keeps the first)
  python - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
keep = ("epoch", "images_per_s", "train_time_s", "epoch_time_s", "gpu_mem_peak_gib", "feed/wait_first_s", "feed/wait_s",
        "feed/read_first_s", "data_device_peak_gib")
runs = {f"{h.parent.parent.name}/{h.parent.name}": [{k: r.get(k) for k in keep} for r in map(json.loads, h.read_text().splitlines())]
        for h in sorted(out.glob("*/*/history.jsonl"))}
(out / "epochs.json").write_text(json.dumps(runs, indent=1))
for name, rows in runs.items():
    print(name, [(r["epoch"], round(r["images_per_s"], 1), r["gpu_mem_peak_gib"], r.get("feed/wait_first_s"),
                  r.get("feed/wait_s")) for r in rows])
PY
}
small=${SMALL_RUNS-graphs-e3-s0,stream-e3-s0,streamcpu-e3-s0}
if [ -n "$small" ]; then
  python -m yolo_ray bench --parity data="datasets/scale$n/data.yaml" images="$n" out_dir="$out/small" \
    runs="$small" --out "$out/small.json"
  summarize
fi
if [ "$copies" -gt 0 ]; then
  python benchmarks/link_dataset.py "datasets/scale$n/data.yaml" "datasets/scale${n}x$copies" "$copies"
  python -m yolo_ray bench --parity data="datasets/scale${n}x$copies/data.yaml" images=$((n * copies)) \
    out_dir="$out/large" runs="${LARGE_RUNS:-stream-e2-s0}" --out "$out/large.json"
  summarize
fi
