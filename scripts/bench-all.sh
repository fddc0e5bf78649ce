#!/usr/bin/env bash
# Every benchmark behind BENCHMARKS.md, one after the other, on a quiet machine. Each writes its own log
# under $OUT (default /tmp/shardline-bench-logs); BENCHMARKS.md quotes them with their commands.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/shardline-bench-logs}
mkdir -p "$OUT"
run() {  # name timeout_s command...
  local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee "$OUT/$name.log"
  local start=$SECONDS
  timeout "$limit" "$@" >>"$OUT/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - start)) s" | tee -a "$OUT/$name.log"
}
run decode 300 scripts/bench-decode.sh 110m 128
run layouts 900 scripts/bench-layouts.sh 64 4
run roofline 900 scripts/bench-roofline.sh
run arena-110m 300 env REPEATS=3 scripts/bench-arena.sh 110m 64 2
run arena-1.1b 600 env REPEATS=3 scripts/bench-arena.sh 1.1b 32 2
run gguf-load-fp32 300 env REPEATS=5 scripts/bench-gguf-load.sh 110m 2 fp32
run gguf-load-int8 300 env REPEATS=5 scripts/bench-gguf-load.sh 110m 2 int8
run multihost 300 scripts/bench-multihost.sh 110m 64
