#!/usr/bin/env bash
# A long benchmark across several device-tool calls (each at most 10 minutes): `start` runs a command in its own
# process session (so it outlives the call while the machine stays warm), `wait` follows its log until it ends or
# the given seconds pass, then copies what it wrote under benchmarks/runs*/ (JSON, logs) to $OUT.
#   bash benchmarks/background.sh start NAME -- COMMAND ...
#   bash benchmarks/background.sh wait NAME SECONDS [FILE_TO_COPY ...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=benchmarks/runs-background
mkdir -p "$dir"
copy() {
  [ -n "${OUT:-}" ] || return 0
  cp "$dir/$name.log" "$OUT/" 2>/dev/null || true
  for f in "$@"; do cp "$f" "$OUT/" 2>/dev/null || true; done
}
verb=$1 name=$2
shift 2
case "$verb" in
start)
  [ "$1" = "--" ] && shift
  rm -f "$dir/$name.rc"
  setsid bash -c '"$@"; echo $? > "'"$dir/$name.rc"'"' bash "$@" > "$dir/$name.log" 2>&1 < /dev/null &
  echo "started $name (pid $!): $*"
  ;;
wait)
  seconds=$1
  shift
  end=$((SECONDS + seconds))
  shown=0
  while [ ! -f "$dir/$name.rc" ] && [ $SECONDS -lt $end ]; do
    sleep 5
    total=$(grep -c '' "$dir/$name.log" || true)
    # progress lines only: the benchmark's own, not every run's output
    sed -n "$((shown + 1)),${total}p" "$dir/$name.log" | grep -E '^\[parity\]|^\[bench\]|Error|error:' || true
    shown=$total
    copy "$@"  # every round: a call cut off at its limit still returns what was written
  done
  if [ -f "$dir/$name.rc" ]; then echo "$name finished, exit $(cat "$dir/$name.rc")"; else echo "$name still running"; fi
  tail -n 40 "$dir/$name.log"
  copy "$@"
  ;;
*)
  echo "usage: $0 start NAME -- COMMAND ... | wait NAME SECONDS [FILE ...]" >&2
  exit 2
  ;;
esac
