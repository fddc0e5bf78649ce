#!/usr/bin/env bash
# The whole test suite: install dependencies, configure, build, run every CTest test.
# This is the README's test command and what .ci/run calls. Fails loudly on the first problem.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

bash scripts/install-deps.sh

# Open MPI refuses to run as root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Reference models: ../shared/models unless SHARDLINE_MODELS_DIR says otherwise.
export SHARDLINE_MODELS_DIR=${SHARDLINE_MODELS_DIR:-$(cd .. && pwd)/shared/models}
if [ "${CI:-}" = "true" ] && [ ! -f "$SHARDLINE_MODELS_DIR/goldens.jsonl" ]; then
  echo "test.sh: reference models missing at $SHARDLINE_MODELS_DIR (CI=true makes that a failure)" >&2
  exit 1
fi

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j"$JOBS"
cd "$BUILD_DIR"
ctest --output-on-failure -j"$JOBS" --timeout 600 "$@"
