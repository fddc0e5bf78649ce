#include "comm/link_probe.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

namespace shardline::comm {

namespace {

constexpr int kTagPing = 201;
constexpr std::size_t kHostBytes = 128;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Half the best round trip of `bytes` between ranks a and b; every other rank returns 0.
double ping_pong_s(Communicator& comm, int a, int b, std::size_t bytes, int repeats, std::vector<char>& buffer) {
  const int me = comm.rank();
  double best = 1e30;
  for (int r = 0; r < repeats + 1; ++r) {  // the first round trip warms the connection up
    if (me == a) {
      const double start = now_s();
      comm.send(buffer.data(), bytes, b, kTagPing);
      comm.recv(buffer.data(), bytes, b, kTagPing);
      if (r > 0) best = std::min(best, (now_s() - start) / 2);
    } else if (me == b) {
      comm.recv(buffer.data(), bytes, a, kTagPing);
      comm.send(buffer.data(), bytes, a, kTagPing);
    }
  }
  return me == a ? best : 0.0;
}

// Fits time(n) = α + n·β through the smallest and the largest size.
LinkFit fit(double small_s, double large_s, std::size_t small_bytes, std::size_t large_bytes) {
  LinkFit f;
  f.measured = true;
  f.alpha_s = std::max(0.0, small_s);
  f.beta_s_per_byte = std::max(1e-15, (large_s - small_s) / static_cast<double>(large_bytes - small_bytes));
  return f;
}

}  // namespace

LinkProbeResult probe_links(Communicator& comm, const LinkProbeOptions& options) {
  LinkProbeResult result;
  const int size = comm.size();
  char host[kHostBytes] = {};
  gethostname(host, kHostBytes - 1);
  std::vector<char> all(kHostBytes * size);
  comm.all_gather_bytes(host, kHostBytes, all.data());
  std::map<std::string, int> distinct;
  for (int r = 0; r < size; ++r) {
    result.hosts.emplace_back(all.data() + r * kHostBytes);
    distinct.emplace(result.hosts.back(), static_cast<int>(distinct.size()));
  }
  result.n_hosts = static_cast<int>(distinct.size());
  if (size == 1) return result;

  // One representative pair per class, measured by rank 0: the nearest rank on its host and the nearest
  // on another host. Rank 0 then tells everyone the figures.
  int same = -1, cross = -1;
  for (int r = 1; r < size; ++r) {
    if (result.hosts[r] == result.hosts[0] && same < 0) same = r;
    if (result.hosts[r] != result.hosts[0] && cross < 0) cross = r;
  }
  const std::size_t small = 8, large = options.max_bytes;
  const int repeats_small = options.quick ? 20 : 200, repeats_large = options.quick ? 3 : 20;
  std::vector<char> buffer(large, 1);
  double figures[12] = {};  // same: small, large; cross: small, large; allreduce: small, large
  int slot = 0;
  for (int peer : {same, cross}) {
    if (peer > 0) {
      figures[slot] = ping_pong_s(comm, 0, peer, small, repeats_small, buffer);
      figures[slot + 1] = ping_pong_s(comm, 0, peer, large, repeats_large, buffer);
    }
    slot += 2;
  }
  // All-reduce over everyone: best of several, then fitted to the ring model per hop.
  std::vector<float> data(large / sizeof(float), 1.0f);
  for (int which = 0; which < 2; ++which) {
    const std::size_t count = which == 0 ? 2 : data.size();
    double best = 1e30;
    for (int r = 0; r < (which == 0 ? repeats_small : repeats_large) + 1; ++r) {
      comm.barrier();
      const double start = now_s();
      comm.all_reduce_sum(data.data(), count);
      if (r > 0) best = std::min(best, now_s() - start);
    }
    figures[4 + which] = best;
  }
  comm.broadcast(figures, sizeof(figures), 0);
  if (same > 0) {
    result.same_host = fit(figures[0], figures[1], small, large);
    result.same_host.pairs = 1;
  }
  if (cross > 0) {
    result.cross_host = fit(figures[2], figures[3], small, large);
    result.cross_host.pairs = 1;
  }
  // Ring all-reduce: t = 2(p-1)α + 2(p-1)/p·n·β.
  const double hops = 2.0 * (size - 1);
  LinkFit ring = fit(figures[4] / hops, figures[5] / hops, small, large);
  ring.beta_s_per_byte = std::max(1e-15, (figures[5] - figures[4]) / (hops / size * static_cast<double>(large - small)));
  result.allreduce = ring;
  return result;
}

}  // namespace shardline::comm
