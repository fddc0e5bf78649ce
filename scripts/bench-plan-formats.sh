#!/usr/bin/env bash
# The planner against measurement for each weight format: `shardline probe` measures this host (one
# process: the whole host to itself), `shardline bench` decodes the 15M, 110M and 1.1B shapes in fp32, bf16
# and int8 at batch 1 and 16 (one rank, 2 threads, 8-token prompts + 32 steps), and `shardline plan
# --probe-file` predicts each of those cells for the same layout and context. Prints a markdown table:
# measured, predicted, error. Takes about 6 minutes (the bench run).
# Usage: scripts/bench-plan-formats.sh [extra bench flags, e.g. --repeats 5]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/shardline}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "\$ $BIN probe --out probe.json"
"$BIN" probe --out "$work/probe.json" | tail -5
echo "\$ $BIN bench --threads 2 --batches 1,16 --presets 15m,110m,1.1b --dtypes fp32,bf16,int8 $*"
"$BIN" bench --threads 2 --batches 1,16 --presets 15m,110m,1.1b --dtypes fp32,bf16,int8 "$@" | tee "$work/bench.txt"
echo
echo "| shape | dtype | batch | measured tok/s | predicted tok/s | error |"
echo "| --- | --- | --- | --- | --- | --- |"
# Bench rows: model dtype kv weights MiB GB/s b1 (f) b16 (f) prefill (f) GFLOP/s load.
grep -E '^(15m|110m|1\.1b) ' "$work/bench.txt" | while read -r model dtype _kv _w _mib _gbps b1 _f1 b16 _rest; do
  for batch in 1 16; do
    measured=$([ "$batch" = 1 ] && echo "$b1" || echo "$b16")
    predicted=$("$BIN" plan --probe-file "$work/probe.json" --preset "$model" --dtype "$dtype" --batch "$batch" \
                  --objective throughput --context 40 --prompt-tokens 8 --np 1 --top 1 --json 2>/dev/null |
                python3 -c 'import json, sys; print(json.load(sys.stdin)["plans"][0]["throughput_tok_s"])')
    python3 -c "m, p = $measured, $predicted; print(f'| $model | $dtype | $batch | {m:.1f} | {p:.1f} | {100 * (p - m) / m:+.0f}% |')"
  done
done
