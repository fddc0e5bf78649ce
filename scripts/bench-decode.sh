#!/usr/bin/env bash
# Decode throughput of a generated model at 1 and 2 threads: median of REPEATS runs each, and the
# 2-thread / 1-thread ratio measured in the same invocation. Usage: scripts/bench-decode.sh [preset] [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-110m}
STEPS=${2:-128}
REPEATS=${REPEATS:-5}
BIN=${BIN:-./build/shardline}
MODEL=${MODEL_DIR:-/tmp}/shardline-bench-$PRESET.bin
[ -f "$MODEL" ] || "$BIN" gen-model --preset "$PRESET" --out "$MODEL" >/dev/null 2>&1
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
declare -A result
for threads in 1 2; do
  result[$threads]=$(for _ in $(seq "$REPEATS"); do
    "$BIN" run --model "$MODEL" --steps "$STEPS" --threads "$threads" 2>&1 >/dev/null |
      sed -n 's/.*decode [0-9]* tok in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p'
  done | median)
done
echo "model: $PRESET ($(du -h "$MODEL" | cut -f1)), steps: $STEPS, median of $REPEATS runs"
echo "decode tok/s, 1 thread:  ${result[1]}"
echo "decode tok/s, 2 threads: ${result[2]}"
awk -v a="${result[1]}" -v b="${result[2]}" 'BEGIN {printf "2-thread / 1-thread: %.2fx\n", b / a}'
