#include "runtime/machine_probe.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "common/units.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/packed_matmul.h"
#include "kernels/cpu/weight_format.h"

namespace shardline::runtime {

namespace cpu = kernels::cpu;

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

double available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024.0;
    meminfo.ignore(256, '\n');
  }
  return 0;
}

namespace {

// A packed fp32 (d, k) matrix of 0.5s, in the layout the decode kernels stream (the values do not matter
// for timing; fp32 packing is plain floats, so no packing pass is needed).
struct ProbeMatrix {
  explicit ProbeMatrix(int d, int k) {
    const std::size_t bytes = cpu::packed_size_bytes(cpu::WeightDtype::kF32, d, k);
    storage.resize(bytes / sizeof(float) + 16, 0.5f);
    auto* aligned = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(storage.data()) + 63) & ~std::uintptr_t{63});
    matrix = cpu::PackedMatrix{cpu::WeightDtype::kF32, d, k, aligned};
  }
  std::vector<float> storage;
  cpu::PackedMatrix matrix;
};

// Best-of-n seconds of y = x · Wᵀ for n rows of x with the decode kernels.
double packed_matmul_s(const ProbeMatrix& w, int n, int repeats) {
  std::vector<float> x(static_cast<std::size_t>(n) * w.matrix.k, 1.0f), y(static_cast<std::size_t>(n) * w.matrix.d);
  cpu::Activations act;
  act.reserve(n, w.matrix.k);
  act.prepare(x.data(), n, w.matrix.k, cpu::WeightDtype::kF32);
  cpu::matmul(y.data(), act, w.matrix);  // warm up (page in, caches)
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const double start = now_s();
    cpu::matmul(y.data(), act, w.matrix);
    best = std::min(best, now_s() - start);
  }
  return best;
}

double stream_bandwidth(std::size_t bytes, int threads, int repeats) {
  const int cols = 4096;
  const int rows = std::max(16, static_cast<int>(bytes / (sizeof(float) * cols)));
  const ProbeMatrix w(rows, cols);
  const int previous = cpu::set_num_threads(threads);
  const double seconds = packed_matmul_s(w, 1, repeats);
  cpu::set_num_threads(previous);
  return static_cast<double>(rows) * cols * sizeof(float) / seconds;
}

double gemm_flops_one_core(bool quick) {
  const int n = 64, k = 1024, d = 1024;  // prefill-like: 64 rows share each weight row
  const ProbeMatrix w(d, k);
  const int previous = cpu::set_num_threads(1);
  const double seconds = packed_matmul_s(w, n, quick ? 3 : 10);
  cpu::set_num_threads(previous);
  return 2.0 * n * k * d / seconds;
}

// Fixed cost of one small kernel call with the rank's threads (OpenMP fork/join dominates).
double op_overhead_s(int threads) {
  const ProbeMatrix w(512, 64);
  const int previous = cpu::set_num_threads(threads);
  const double best = packed_matmul_s(w, 1, 200);
  cpu::set_num_threads(previous);
  return best;
}

// Last-level cache size from sysfs (index3 = L3 on x86), 0 when unknown.
double llc_bytes() {
  for (int index = 3; index >= 2; --index) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    std::string text;
    if (in >> text && !text.empty()) {
      double value = std::stod(text);
      if (text.back() == 'K') value *= kKiB;
      if (text.back() == 'M') value *= kMiB;
      return value;
    }
  }
  return 0;
}

}  // namespace

// Widens this thread's CPU set to the whole host for the measurement and restores it after: a rank bound
// to one core by mpirun would otherwise measure one core as "all cores".
class WholeHostAffinity {
 public:
  WholeHostAffinity() {
    saved_ok_ = sched_getaffinity(0, sizeof(saved_), &saved_) == 0;
    cpu_set_t all;
    CPU_ZERO(&all);
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < n && c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
    sched_setaffinity(0, sizeof(all), &all);
  }
  ~WholeHostAffinity() {
    if (saved_ok_) sched_setaffinity(0, sizeof(saved_), &saved_);
  }

 private:
  cpu_set_t saved_{};
  bool saved_ok_ = false;
};

partition::ClusterSpec probe_this_machine(const MachineProbeOptions& options) {
  WholeHostAffinity whole_host;
  const int cores = options.cores > 0 ? options.cores : usable_cores();
  const int repeats = options.quick ? 3 : 8;
  partition::ClusterSpec c;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  c.name = std::string("measured:") + host;
  c.nodes = 1;
  c.domains_per_node = 1;
  c.ranks_per_domain = cores;
  c.domain.cores = cores;
  c.domain.memory_bytes = available_memory_bytes();
  const double cache = llc_bytes();
  c.domain.cache_bytes = cache;
  // From memory: a buffer well beyond the last-level cache. From cache: a quarter of it.
  const std::size_t big = static_cast<std::size_t>(std::max(cache * 2.0, 256.0 * kMiB));
  std::size_t capped = std::min<std::size_t>(big, options.quick ? 1 * kGiB : 2 * kGiB);
  if (options.max_buffer_bytes > 0) capped = std::min(capped, options.max_buffer_bytes);
  c.domain.core_bandwidth_bytes_per_s = stream_bandwidth(capped, 1, repeats);
  c.domain.domain_bandwidth_bytes_per_s = std::max(c.domain.core_bandwidth_bytes_per_s, stream_bandwidth(capped, cores, repeats));
  if (cache > 0 && static_cast<double>(capped) <= cache) {
    // The "big" buffer still fits the cache (a huge L3): what was measured is the cache rate.
    c.domain.cache_bandwidth_bytes_per_s = c.domain.core_bandwidth_bytes_per_s;
  } else if (cache > 0) {
    c.domain.cache_bandwidth_bytes_per_s = stream_bandwidth(static_cast<std::size_t>(cache / 4), 1, repeats);
  }
  c.domain.core_flops = gemm_flops_one_core(options.quick);
  c.domain.op_overhead_s = op_overhead_s(std::max(1, cores));
  // Shared-memory MPI between ranks of one host: typical Open MPI vader figures, replaced by `probe`.
  c.same_domain = {1.0e-6, 1.0 / 8e9};
  c.cross_domain = {1.5e-6, 1.0 / 6e9};
  c.cross_node = {20e-6, 1.0 / 1.25e9};
  return c;
}

}  // namespace shardline::runtime
