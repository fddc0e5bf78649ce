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
  mpich                                 # only its mpiexec.hydra, for the test that run refuses a launcher Open MPI cannot join
  libhwloc-dev hwloc                    # topology discovery and CPU binding
  libnuma-dev numactl                   # NUMA memory policy
  libboost-program-options-dev          # CLI parsing (brings Boost's headers: Boost.Sort for top-p)
  libgtest-dev libgmock-dev             # unit tests
  libbenchmark-dev                      # kernel micro-benchmarks
  nlohmann-json3-dev libfmt-dev         # JSON output, formatting
  libpcre2-dev                          # Unicode regexes: Llama 3's pre-tokenizer
  coreutils procps                      # timeout, ps (used by tests)
  munge slurmctld slurmd slurm-client   # real Slurm for the `slurm` tests (they start their own daemons)
  iproute2 util-linux                   # ip netns / unshare: two hosts for the `multihost` tests
  qemu-user                             # qemu-x86_64: the binary on an emulated AVX2 CPU and the x86-64 baseline
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  # munge and Slurm run only when a test starts them with its own configuration: keep their packages from
  # starting system-wide daemons during the install (where no policy says so already).
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all packages present"
fi
