#!/usr/bin/env bash
# Load time of one rank for the same generated model as a llama2.c checkpoint (F32, mapped), as GGUF files
# of other element types (F16, Q8_0, Q4_K, Q6_K: decoded to fp32 at load, on the rank's kernel threads) and
# as llama2.c's export.py version-2 file (L2C_Q8: runq.c's Q8_0, decoded alike), each converted to
# --weights-dtype DTYPE. Median of REPEATS runs per row, the files interleaved run by run
# so drift hits them alike, every row's ratio to the F32 checkpoint measured in the same invocation.
# The GGUF files come from tests/bench/gguf_from_llama2c (simple scales, llama.cpp's block layouts).
# Usage: scripts/bench-gguf-load.sh [preset] [threads] [dtype]      e.g. scripts/bench-gguf-load.sh 110m 2 fp32
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-110m}
THREADS=${2:-$(nproc)}
DTYPE=${3:-fp32}
REPEATS=${REPEATS:-5}
BIN=${BIN:-./build/shardline}
CONVERT=${CONVERT:-./build/tests/gguf_from_llama2c}
DIR=${MODEL_DIR:-/tmp}/shardline-bench-gguf-$PRESET
mkdir -p "$DIR"
MODEL=$DIR/model.bin
[ -f "$MODEL" ] || "$BIN" gen-model --preset "$PRESET" --out "$MODEL" >/dev/null 2>&1
declare -A TYPE=([F16]=1 [Q8_0]=8 [Q4_K]=12 [Q6_K]=14 [L2C_Q8]=llama2c-v2)
ROWS=(F32 F16 Q8_0 Q4_K Q6_K L2C_Q8)
declare -A FILE=([F32]=$MODEL)
for row in F16 Q8_0 Q4_K Q6_K L2C_Q8; do
  FILE[$row]=$DIR/model-$row.$([ "$row" = L2C_Q8 ] && echo bin || echo gguf)
  [ -f "${FILE[$row]}" ] || "$CONVERT" "$MODEL" "$DIR/model.tokenizer.bin" "${TYPE[$row]}" "${FILE[$row]}"
done
declare -A LOADS
for ((i = 0; i < REPEATS; i++)); do
  for row in "${ROWS[@]}"; do
    line=$("$BIN" run --model "${FILE[$row]}" --tokenizer "$DIR/model.tokenizer.bin" --steps 2 --threads "$THREADS" \
           --weights-dtype "$DTYPE" 2>&1 | grep -o 'load [0-9.]* s' | head -1 | awk '{print $2}')
    [ -n "$line" ] || { echo "bench-gguf-load: the $row run printed no load time" >&2; exit 1; }
    LOADS[$row]+="$line "
  done
done
median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "# bench-gguf-load: preset $PRESET, --threads $THREADS, --weights-dtype $DTYPE, median of $REPEATS"
printf '%-6s %10s %12s %8s\n' file "file MiB" "load s" "x F32"
base=$(median "${LOADS[F32]}")
for row in "${ROWS[@]}"; do
  load=$(median "${LOADS[$row]}")
  printf '%-6s %10.1f %12.3f %8.2f\n' "$row" "$(awk -v b="$(stat -c %s "${FILE[$row]}")" 'BEGIN {print b / 1048576}')" \
    "$load" "$(awk -v a="$load" -v b="$base" 'BEGIN {print a / b}')"
done
