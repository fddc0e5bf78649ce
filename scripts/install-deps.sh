#!/usr/bin/env bash
# Installs every build and test dependency of Shardline from Debian 12 packages.
# CUDA/NCCL are not installed here: they are optional and detected under /usr/local/cuda at configure time.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
packages=(
  build-essential cmake pkg-config git
  openmpi-bin libopenmpi-dev            # MPI runtime and headers (mpirun, PMIx)
  libhwloc-dev hwloc                    # topology discovery and CPU binding
  libnuma-dev numactl                   # NUMA memory policy
  libboost-program-options-dev          # CLI parsing
  libgtest-dev libgmock-dev             # unit tests
  libbenchmark-dev                      # kernel micro-benchmarks
  nlohmann-json3-dev libfmt-dev         # JSON output, formatting
  coreutils procps                      # timeout, ps (used by tests)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all packages present"
fi
