#!/usr/bin/env bash
# What crossing a host boundary costs: decode tok/s of tp=2 and of pp=2 with both ranks on one host
# (shared memory between them) and with one rank on each of two hosts (TCP over a veth pair between two
# network namespaces, as the `multihost` tests set up), median of REPEATS runs each, and the cross-host /
# same-host ratio measured in the same invocation. Needs root (namespaces) and a build.
# Usage: scripts/bench-multihost.sh [preset] [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-110m}
STEPS=${2:-64}
REPEATS=${REPEATS:-3}
BIN=$(realpath "${BIN:-./build/shardline}")
MODEL=${MODEL_DIR:-/tmp}/shardline-bench-$PRESET.bin
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -f "$MODEL" ] || "$BIN" gen-model --preset "$PRESET" --out "$MODEL" >/dev/null 2>&1

HOSTS=$(mktemp -d /tmp/shardline-bench-hosts.XXXXXX)
trap 'bash tests/multihost/netns-hosts.sh down "$HOSTS"; rm -rf "$HOSTS"' EXIT
bash tests/multihost/netns-hosts.sh up "$HOSTS" 2>/dev/null
printf '10.200.0.1 slots=2\n' >"$HOSTS/one-host"

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# decode tok/s of one run: HOSTFILE TP PP [extra mpirun flags]
decode_rate() {
  local hostfile=$1 tp=$2 pp=$3
  shift 3
  "$HOSTS/on-host-a" mpirun --hostfile "$hostfile" -np $((tp * pp)) --bind-to none \
    --mca plm_rsh_agent "$HOSTS/agent" --mca oob_tcp_if_include 10.200.0.0/24 "$@" \
    "$BIN" run --model "$MODEL" --steps "$STEPS" --threads 1 --tp "$tp" --pp "$pp" 2>&1 >/dev/null |
    sed -n 's/.*decode [0-9]* tok in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p'
}

echo "model: $PRESET ($(du -h "$MODEL" | cut -f1)), steps: $STEPS, 1 thread per rank, median of $REPEATS runs"
echo "| layout | same host (shared memory) tok/s | two hosts (TCP over veth) tok/s | two hosts / same host |"
echo "| --- | --- | --- | --- |"
for layout in "2 1" "1 2"; do
  read -r tp pp <<<"$layout"
  same=$(for _ in $(seq "$REPEATS"); do decode_rate "$HOSTS/one-host" "$tp" "$pp"; done | median)
  cross=$(for _ in $(seq "$REPEATS"); do
    decode_rate "$HOSTS/hostfile" "$tp" "$pp" --mca btl tcp,self --mca btl_tcp_if_include 10.200.0.0/24
  done | median)
  awk -v l="tp=$tp pp=$pp" -v a="$same" -v b="$cross" 'BEGIN {printf "| %s | %s | %s | %.2fx |\n", l, a, b, b / a}'
done
