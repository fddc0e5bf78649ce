#!/usr/bin/env bash
# Every (tp, pp, m) with tp x pp <= 4 on the 110M shape, measured with real mpirun jobs, next to what the
# planner predicts for the same layout from a probe of this machine taken in the same run.
#   latency rows:    batch 1, one sequence; per-token decode latency
#   throughput rows: batch B sequences in m micro-batches; decode tokens/s over the batch
# Output: a markdown table (stdout) with the relative error of each prediction and the medians.
# Usage: scripts/bench-layouts.sh [steps] [batch]      (defaults: 64 steps, batch 4)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-64}
BATCH=${2:-4}
BIN=${BIN:-./build/shardline}
WORK=${WORK:-/tmp/shardline-bench}
mkdir -p "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MODEL=$WORK/m110.bin
[ -f "$MODEL" ] || "$BIN" gen-model --preset 110m --out "$MODEL" >/dev/null 2>&1
PROBE=$WORK/probe.json
# Links from two ranks; the host from one process, which has it to itself (as the table in BENCHMARKS.md
# was made; since the waiting ranks poll every 5 ms, the mpirun probe's host numbers agree with it).
mpirun --oversubscribe --bind-to none -np 2 "$BIN" probe --out "$WORK/links.json" >&2
"$BIN" probe --out "$WORK/host.json" >&2
python3 - "$WORK/host.json" "$WORK/links.json" "$PROBE" <<'PY'
import json, sys
host, links = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
host["links"] = links["links"]
json.dump(host, open(sys.argv[3], "w"), indent=2)
PY
PROMPT="Once upon a time there was a cluster"
: > "$WORK/prompts"
for _ in $(seq "$BATCH"); do echo "$PROMPT" >> "$WORK/prompts"; done
PROMPT_TOKENS=$("$BIN" run --model "$MODEL" --prompt "$PROMPT" --steps 1 --json --plan none 2>/dev/null |
  python3 -c 'import json,sys; print(len(json.load(sys.stdin)["prompt_ids"]))')
CONTEXT=$((PROMPT_TOKENS + STEPS))

measure() {  # np tp pp m prompts-args -> decode tok/s (median of 3)
  local np=$1 tp=$2 pp=$3 m=$4; shift 4
  for _ in 1 2 3; do
    mpirun --oversubscribe --bind-to none -np "$np" "$BIN" run --model "$MODEL" --tp "$tp" --pp "$pp" \
      --micro-batches "$m" --steps "$STEPS" "$@" 2>&1 >/dev/null |
      sed -n 's/.*decode [0-9]* tok in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p'
  done | sort -n | sed -n 2p
}
predict() {  # np tp pp m batch -> "token_latency_s throughput_tok_s"
  "$BIN" plan --preset 110m --probe-file "$PROBE" --ranks-per-domain 4 --np "$1" --tp "$2" --pp "$3" \
    --micro-batches "$4" --batch "$5" --context "$CONTEXT" --prompt-tokens "$PROMPT_TOKENS" --top 1 --json |
    python3 -c 'import json,sys; p=json.load(sys.stdin)["plans"][0]; print(p["token_latency_s"], p["throughput_tok_s"])'
}

echo "| layout | kind | measured | predicted | error |"
echo "| --- | --- | --- | --- | --- |"
errors=()
LAYOUTS=${LAYOUTS:-"1,1 2,1 3,1 4,1 1,2 2,2 1,3 1,4"}
for layout in $LAYOUTS; do
  IFS=, read -r tp pp <<<"$layout"
  np=$((tp * pp))
  # Latency: one sequence.
  tok_s=$(measure "$np" "$tp" "$pp" 1 --prompt "$PROMPT")
  read -r lat _ < <(predict "$np" "$tp" "$pp" 1 1)
  measured_ms=$(python3 -c "print(1000 / $tok_s)")
  predicted_ms=$(python3 -c "print($lat * 1000)")
  err=$(python3 -c "print(($predicted_ms - $measured_ms) / $measured_ms)")
  errors+=("$err")
  printf '| tp=%s pp=%s | token latency, batch 1 | %.1f ms | %.1f ms | %+.0f%% |\n' "$tp" "$pp" "$measured_ms" "$predicted_ms" \
    "$(python3 -c "print(100 * $err)")"
  # Throughput: BATCH sequences in m micro-batches.
  for m in 1 2 4; do
    [ "$m" -le "$BATCH" ] || continue
    tok_s=$(measure "$np" "$tp" "$pp" "$m" --prompts-file "$WORK/prompts")
    read -r _ thr < <(predict "$np" "$tp" "$pp" "$m" "$BATCH")
    err=$(python3 -c "print(($thr - $tok_s) / $tok_s)")
    errors+=("$err")
    printf '| tp=%s pp=%s m=%s | throughput, batch %s | %.1f tok/s | %.1f tok/s | %+.0f%% |\n' "$tp" "$pp" "$m" "$BATCH" \
      "$tok_s" "$thr" "$(python3 -c "print(100 * $err)")"
  done
done
python3 - "${errors[@]}" <<'PY'
import statistics, sys
e = [abs(float(x)) for x in sys.argv[1:]]
print(f"\nmedian |error| over {len(e)} predictions: {100 * statistics.median(e):.1f}%  (max {100 * max(e):.0f}%)")
PY
