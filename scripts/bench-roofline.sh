#!/usr/bin/env bash
# The CPU performance benchmark (issue #7): `shardline bench` on generated 15M, 110M and 1.1B-shape models
# in fp32, bf16 and int8, for the two layouts of a 2-core machine: one rank with 2 threads, and tp=2 with
# one thread per rank (each rank bound to its core). Every run measures its own read-bandwidth roofline on
# the weights it streams, so every fraction and ratio it prints comes from that run alone. On a CPU with
# AMX a third run repeats bf16 and int8 on the AVX-512 kernels (--isa avx512-vnni) to compare; on one with
# AVX512_BF16 but no AMX it repeats fp32 and bf16 on the bf16 kernel auto did not pick (vdpbf16ps or widening).
# Usage: scripts/bench-roofline.sh [extra bench flags, e.g. --presets 110m --repeats 5]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/shardline}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
first_run=$(mktemp)
trap 'rm -f "$first_run"' EXIT
echo "\$ $BIN bench --threads 2 $*"
"$BIN" bench --threads 2 "$@" | tee "$first_run"
echo
echo "\$ mpirun -np 2 --bind-to core $BIN bench --tp 2 --threads 1 $*"
mpirun -np 2 --bind-to core "$BIN" bench --tp 2 --threads 1 "$@"
echo
# A third run on the other kernels, to show what the first run's choice adds: with AMX, bf16 and int8 on
# the AVX-512 kernels; with AVX512_BF16 but no AMX, bf16 on whichever of vdpbf16ps and widened weights auto
# did not pick (it picks widening where vdpbf16ps is slow, and says so in the header). Without either the
# first run already used the only kernels there are (and --isa avx512-vnni would be refused without VNNI).
if grep -qw amx_int8 /proc/cpuinfo; then
  echo "\$ $BIN bench --threads 2 --isa avx512-vnni --dtypes bf16,int8 $*"
  "$BIN" bench --threads 2 --isa avx512-vnni --dtypes bf16,int8 "$@"
elif grep -qw avx512_bf16 /proc/cpuinfo; then
  # fp32 again as the same run's baseline for the ratio.
  other=avx512-vnni
  if grep -q "avx512-vnni kernels (not avx512-bf16" "$first_run"; then other=avx512-bf16; fi
  echo "\$ $BIN bench --threads 2 --isa $other --dtypes fp32,bf16 $*"
  "$BIN" bench --threads 2 --isa "$other" --dtypes fp32,bf16 "$@"
else
  echo "(no AMX or AVX512_BF16 on this CPU: the first run's bf16 and int8 rows are already its best kernels)"
fi
