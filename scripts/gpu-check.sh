#!/usr/bin/env bash
# The CUDA backend's check on a machine with a GPU, in one go and under 8 minutes: configure and build with
# CUDA, run the `cuda`-labelled tests (each kernel against the CPU kernel; NCCL under mpirun), time the
# decode-step proxy (GPU fp32/bf16, eager and CUDA graph, against the CPU kernels and the device's copy
# bandwidth in the same run), the real binary's decode rate on the CUDA stage with and without CUDA graphs
# against the CPU backend, where each rank's GPU sits (NUMA node, from hwloc) and, with two or more GPUs, the
# NCCL all-reduce against MPI (TP and PP over NCCL run as cuda-labelled tests). A short summary table comes
# last; logs stay in $BUILD_DIR/gpu-check/.
#
#   bash scripts/gpu-check.sh                       # from the repository root or anywhere
#   INSTALL_DEPS=1 bash scripts/gpu-check.sh        # run scripts/install-deps.sh first (needs apt access)
#   BUILD_DIR=build-gpu CUDA_ARCHS=90 JOBS=16 bash scripts/gpu-check.sh
#   SHARDLINE_MODELS_DIR=/data/models bash scripts/gpu-check.sh   # reference models (default ../shared/models)
#
# Exit code: 0 when every step passed, 1 when a test or benchmark failed, 4 when there is no usable GPU or
# toolchain (nothing was measured).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
CUDA_ARCHS=${CUDA_ARCHS:-native}          # "native": only the GPUs in this machine, the fastest build
DECODE_ARGS=${DECODE_ARGS:---layers 8 --tokens 50 --cpu-tokens 3}
LOG_DIR="$BUILD_DIR/gpu-check"
MODELS_DIR=${SHARDLINE_MODELS_DIR:-$(cd .. && pwd)/shared/models}
RUN_STEPS=${RUN_STEPS:-400}               # decode steps of the end-to-end runs (mini-gqa: seq_len 512)
START_S=$(date +%s)

say() { echo "gpu-check: $*" >&2; }
die() { say "error: $1"; exit "${2:-1}"; }
elapsed() { echo "$(( $(date +%s) - START_S )) s"; }

# Open MPI refuses to run as root unless told (CI and lent machines run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PATH="$PATH:/usr/local/cuda/bin"

if [ "${INSTALL_DEPS:-0}" = "1" ]; then
  bash scripts/install-deps.sh
fi

# --- What this machine has ---------------------------------------------------------------------------------
missing=()
for tool in cmake mpirun nvcc; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
[ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}: install the CUDA toolkit (nvcc under /usr/local/cuda/bin) and run scripts/install-deps.sh (or INSTALL_DEPS=1)" 4
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: no NVIDIA driver on this machine, so there is no GPU to check" 4
GPU_LIST=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1) ||
  die "nvidia-smi failed: $GPU_LIST" 4
N_GPUS=$(printf '%s\n' "$GPU_LIST" | grep -c . || true)
[ "$N_GPUS" -gt 0 ] || die "nvidia-smi lists no GPU" 4
GPU_NAME=$(printf '%s\n' "$GPU_LIST" | head -1 | cut -d, -f1)
DRIVER=$(printf '%s\n' "$GPU_LIST" | head -1 | cut -d, -f3 | tr -d ' ')
say "$N_GPUS GPU(s): $GPU_NAME, driver $DRIVER; nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
mkdir -p "$LOG_DIR"

# --- Configure and build -----------------------------------------------------------------------------------
say "configuring $BUILD_DIR with CUDA (architectures: $CUDA_ARCHS)"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DSHARDLINE_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" -DSHARDLINE_BUILD_BENCHMARKS=ON \
  -DSHARDLINE_MODELS_DIR="$MODELS_DIR" >"$LOG_DIR/configure.log" 2>&1 ||
  { tail -30 "$LOG_DIR/configure.log" >&2; die "configure failed (log: $LOG_DIR/configure.log)"; }
grep -q "Shardline CUDA backend: ON" "$LOG_DIR/configure.log" ||
  die "configure did not enable the CUDA backend (nvcc or NCCL not found); see $LOG_DIR/configure.log" 4
say "building the CUDA tests and benchmarks with $JOBS jobs"
cmake --build "$BUILD_DIR" -j"$JOBS" --target cuda_device_test cuda_ops_test nccl_test cuda_decode_bench \
  nccl_allreduce_bench shardline device_cli_test >"$LOG_DIR/build.log" 2>&1 ||
  { grep -E "error|Error" "$LOG_DIR/build.log" | head -30 >&2; die "build failed (log: $LOG_DIR/build.log)"; }
say "built in $(elapsed)"

# --- Tests -------------------------------------------------------------------------------------------------
failed=0
say "running the cuda-labelled tests and the device unit test"
set +e
(cd "$BUILD_DIR" && timeout 240 ctest -L cuda --output-on-failure --timeout 120) >"$LOG_DIR/tests.log" 2>&1
tests_rc=$?
(cd "$BUILD_DIR" && timeout 60 ctest -R "^CudaDevice\\." --output-on-failure) >>"$LOG_DIR/tests.log" 2>&1
device_rc=$?
set -e
if [ $tests_rc -ne 0 ] || [ $device_rc -ne 0 ]; then failed=1; tail -40 "$LOG_DIR/tests.log" >&2; fi
count_of() { grep -cE "Test +#[0-9]+: .*$1" "$LOG_DIR/tests.log" || true; }
TESTS_PASSED=$(count_of "Passed")
TESTS_FAILED=$(count_of "(Failed|Timeout|Exception)")
TESTS_SKIPPED=$(count_of "Skipped")
SKIP_REASONS=""
if [ "$TESTS_SKIPPED" -gt 0 ]; then
  # ctest does not show a skipped test's output; ask the tests themselves why they skip.
  SKIP_REASONS=$( { "$BUILD_DIR/tests/cuda_ops_test" --gtest_filter=CudaOps.RmsnormMatchesCpu 2>&1
    timeout 60 mpirun --oversubscribe --bind-to none -np 2 "$BUILD_DIR/tests/nccl_test" \
      --gtest_filter=NcclCollectives.EveryOperationOnDeviceBuffers 2>&1; } |
    grep -oE "(no CUDA device|needs one GPU per rank).*" | sort -u | head -3 || true)
fi
say "tests: $TESTS_PASSED passed, $TESTS_FAILED failed, $TESTS_SKIPPED skipped ($(elapsed))"

# --- Decode-step proxy -------------------------------------------------------------------------------------
say "timing the decode-step proxy ($DECODE_ARGS)"
set +e
# shellcheck disable=SC2086
timeout 240 "$BUILD_DIR/tests/cuda_decode_bench" $DECODE_ARGS >"$LOG_DIR/decode.log" 2>&1
decode_rc=$?
set -e
if [ $decode_rc -ne 0 ]; then failed=1; tail -20 "$LOG_DIR/decode.log" >&2; say "decode benchmark failed ($decode_rc)"; fi
result() { sed -n "s/^RESULT $2=//p" "$1" | head -1; }

# --- The real binary on the CUDA stage ---------------------------------------------------------------------
# mini-gqa is small, so its decode step is mostly launch overhead: what CUDA graphs remove.
RUN_MODEL="$MODELS_DIR/mini-gqa.bin"
RUN_NOTE=""
run_rate() {  # $1: log name, rest: shardline run flags; prints the decode tok/s of the run's statistics line
  local log="$LOG_DIR/$1.log"
  shift
  timeout 120 "$BUILD_DIR/shardline" run --steps "$RUN_STEPS" --prompt "Once upon a time" --model "$RUN_MODEL" \
    --tokenizer "$MODELS_DIR/tokenizer.bin" "$@" >"$log" 2>&1 || { echo "failed"; return 0; }
  sed -n 's/.*| decode [0-9]* tok in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$log" | head -1
}
if [ -f "$RUN_MODEL" ]; then
  say "timing decode through shardline run ($RUN_STEPS steps of mini-gqa): cuda graphs on, off, and the cpu"
  set +e
  RATE_GRAPHS=$(run_rate run-cuda-graphs --device cuda --cuda-graphs on -v)
  RATE_EAGER=$(run_rate run-cuda-eager --device cuda --cuda-graphs off)
  RATE_CPU=$(run_rate run-cpu --device cpu)
  set -e
  GPU_PLACEMENT=$(sed -n 's/.*GPU placement: //p' "$LOG_DIR/run-cuda-graphs.log" | head -1)
  for rate in "$RATE_GRAPHS" "$RATE_EAGER" "$RATE_CPU"; do
    if [ "$rate" = "failed" ] || [ -z "$rate" ]; then failed=1; RUN_NOTE="a run failed: see $LOG_DIR/run-*.log"; fi
  done
else
  RUN_NOTE="not run: $RUN_MODEL missing (set SHARDLINE_MODELS_DIR)"
fi

# --- NCCL all-reduce ---------------------------------------------------------------------------------------
ALLREDUCE_NOTE=""
if [ "$N_GPUS" -ge 2 ]; then
  NP=$(( N_GPUS < 8 ? N_GPUS : 8 ))
  say "timing the NCCL all-reduce over $NP GPUs"
  set +e
  timeout 120 mpirun --oversubscribe --bind-to none -np "$NP" "$BUILD_DIR/tests/nccl_allreduce_bench" \
    >"$LOG_DIR/allreduce.log" 2>&1
  allreduce_rc=$?
  set -e
  if [ $allreduce_rc -ne 0 ]; then failed=1; tail -20 "$LOG_DIR/allreduce.log" >&2; ALLREDUCE_NOTE="failed ($allreduce_rc)"; fi
else
  ALLREDUCE_NOTE="not run: needs 2 GPUs, this machine has $N_GPUS"
  : >"$LOG_DIR/allreduce.log"
fi

# --- Summary (last, so it is what a truncated log still shows) ---------------------------------------------
echo
sed -n '/^device copy bandwidth/,/^$/p' "$LOG_DIR/decode.log" || true
# (|| true: under pipefail a grep that matches nothing would end the script before its summary)
{ [ -s "$LOG_DIR/allreduce.log" ] && grep -v "^RESULT" "$LOG_DIR/allreduce.log" | tail -6; } || true
echo
echo "=== gpu-check summary ($(elapsed), $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)) ==="
printf '%-34s %s\n' "GPU" "$N_GPUS x $GPU_NAME (driver $DRIVER)"
printf '%-34s %s\n' "cuda tests" "$TESTS_PASSED passed, $TESTS_FAILED failed, $TESTS_SKIPPED skipped"
[ -n "$SKIP_REASONS" ] && printf '%-34s %s\n' "skip reasons" "$(echo "$SKIP_REASONS" | tr '\n' ';')"
if [ $decode_rc -eq 0 ]; then
  D="$LOG_DIR/decode.log"
  CPU=$(result "$D" cpu_fp32_tok_s)
  printf '%-34s %s\n' "decode proxy shape" "$(sed -n 's/^decode proxy: //p' "$D")"
  printf '%-34s %s GB/s\n' "device copy bandwidth" "$(result "$D" copy_gbps)"
  for path in cpu_fp32 gpu_fp32_eager gpu_fp32_graph gpu_bf16_eager gpu_bf16_graph; do
    TOK=$(result "$D" "${path}_tok_s")
    printf '%-34s %8s tok/s  (%s x cpu)\n' "decode $path" "$TOK" "$(awk -v a="$TOK" -v b="$CPU" 'BEGIN {printf "%.1f", a / b}')"
  done
else
  printf '%-34s %s\n' "decode proxy" "failed ($decode_rc), see $LOG_DIR/decode.log"
fi
if [ -z "$RUN_NOTE" ]; then
  for pair in "graphs:$RATE_GRAPHS" "eager:$RATE_EAGER"; do
    printf '%-34s %8s tok/s  (%s x cpu %s tok/s)\n' "run decode cuda ${pair%%:*}" "${pair#*:}" \
      "$(awk -v a="${pair#*:}" -v b="$RATE_CPU" 'BEGIN {printf "%.1f", a / b}')" "$RATE_CPU"
  done
  printf '%-34s %s\n' "GPU placement (hwloc)" "${GPU_PLACEMENT:-no placement line in $LOG_DIR/run-cuda-graphs.log}"
else
  printf '%-34s %s\n' "run decode (shardline run)" "$RUN_NOTE"
fi
# The issue #8 end-to-end checks (labelled cuda, in tests.log): passed, failed, or skipped with the reason.
for check in GraphsOnAndOffBothReproduceTheGoldens TensorParallelOverNcclReproducesTheGoldens \
  PipelineStagesOverNcclReproduceTheGoldens LongPrefillChunksOverlapTheTpAllReducesAndMatchOneRank; do
  STATE=$(grep -E "Test +#[0-9]+: DeviceGpuRuns\.$check " "$LOG_DIR/tests.log" | head -1 |
    sed -E 's/.*(Passed|Failed|Skipped|Timeout|Not Run).*/\1/' || true)  # no match: "not found" below
  [ "$STATE" = "Skipped" ] && [ "$N_GPUS" -lt 2 ] && [ "$check" != GraphsOnAndOffBothReproduceTheGoldens ] &&
    STATE="Skipped (needs 2 GPUs)"
  printf '%-34s %s\n' "e2e ${check:0:30}" "${STATE:-not found in tests.log}"
done
if [ -z "$ALLREDUCE_NOTE" ]; then
  for size in 16 256 4096 65536; do
    printf '%-34s nccl %8s us, mpi %8s us\n' "all-reduce ${size} KiB x $NP ranks" \
      "$(result "$LOG_DIR/allreduce.log" "allreduce_${size}KiB_nccl_us")" "$(result "$LOG_DIR/allreduce.log" "allreduce_${size}KiB_mpi_us")"
  done
else
  printf '%-34s %s\n' "NCCL all-reduce" "$ALLREDUCE_NOTE"
fi
printf '%-34s %s\n' "result" "$([ $failed -eq 0 ] && echo PASS || echo FAIL)"
exit $failed
