// Measures the links between ranks: point-to-point ping-pong per pair class (same host / across hosts),
// fitted to time(n) = α + n·β, and the all-reduce over the whole communicator fitted to the ring model.
// Algorithms only: the transport is whatever Communicator it is given.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"

namespace shardline::comm {

struct LinkFit {
  bool measured = false;
  double alpha_s = 0;
  double beta_s_per_byte = 0;
  int pairs = 0;  // rank pairs this figure comes from
};

struct LinkProbeResult {
  std::vector<std::string> hosts;  // per rank
  int n_hosts = 0;
  LinkFit same_host;
  LinkFit cross_host;
  LinkFit allreduce;  // per-hop α/β of a ring fitted to whole-communicator all-reduce timings
};

struct LinkProbeOptions {
  bool quick = false;       // fewer repetitions and sizes (for `run`'s automatic plan)
  std::size_t max_bytes = 1 << 20;
};

// Collective: every member calls it. The result is the same on every member.
LinkProbeResult probe_links(Communicator& comm, const LinkProbeOptions& options = {});

}  // namespace shardline::comm
