#include "runtime/machine_probe.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/units.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/packed_matmul.h"
#include "kernels/cpu/weight_format.h"
#include "memory/system_memory.h"

namespace shardline::runtime {

namespace cpu = kernels::cpu;

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

double available_memory_bytes() {
  return static_cast<double>(memory::usable_memory_bytes().value_or(memory::read_meminfo().total_bytes));
}

partition::WeightFormat weight_format_of(cpu::WeightDtype dtype) {
  switch (dtype) {
    case cpu::WeightDtype::kF32: return partition::WeightFormat::kF32;
    case cpu::WeightDtype::kBf16: return partition::WeightFormat::kBf16;
    case cpu::WeightDtype::kInt8: return partition::WeightFormat::kInt8;
  }
  return partition::WeightFormat::kF32;
}

namespace {

// The fastest of `repeats` runs of timed(), in seconds, each run after an untimed before().
template <typename Before, typename Timed>
double best_of_s(int repeats, Before&& before, Timed&& timed) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    before();
    const double start = now_s();
    timed();
    best = std::min(best, now_s() - start);
  }
  return best;
}

template <typename Timed>
double best_of_s(int repeats, Timed&& timed) {
  return best_of_s(repeats, [] {}, timed);
}

// Memory for the probe's matrices, filled once: every measurement takes a matrix of its dtype from the
// start of it (allocating and filling a buffer per measurement took longer than the measurements). Bytes of
// 0x01 read as finite, non-subnormal values in every format: fp32 2.4e-38, bf16 2.4e-38, int8 codes of 1
// with fp16 scales of 1.5e-5 (which convert exactly to normal fp32), so no measurement meets a slow path.
class ProbeBuffer {
 public:
  explicit ProbeBuffer(std::size_t bytes) : storage_(bytes + 64, std::byte{1}), bytes_(bytes) {}
  std::byte* data() {
    return reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(storage_.data()) + 63) & ~std::uintptr_t{63});
  }
  std::size_t size() const { return bytes_; }

 private:
  std::vector<std::byte> storage_;
  std::size_t bytes_;
};

// A packed (d, k) matrix of one dtype, in the layout the decode kernels stream, over the buffer's bytes
// (the values do not matter for timing).
struct ProbeMatrix {
  ProbeMatrix(ProbeBuffer& buffer, cpu::WeightDtype dtype, int d, int k) {
    const int group = dtype == cpu::WeightDtype::kInt8 ? cpu::default_int8_group(k) : 0;
    SL_CHECK(cpu::packed_size_bytes(dtype, d, k, group) <= buffer.size());
    matrix = cpu::PackedMatrix{dtype, d, k, buffer.data(), group};
  }
  cpu::PackedMatrix matrix;
};

// Best-of-n seconds of y = x · Wᵀ for n rows of x with the decode kernels.
double packed_matmul_s(const ProbeMatrix& w, int n, int repeats) {
  std::vector<float> x(static_cast<std::size_t>(n) * w.matrix.k, 1.0f), y(static_cast<std::size_t>(n) * w.matrix.d);
  cpu::Activations act;
  act.reserve(n, w.matrix.k);
  act.prepare(x.data(), n, w.matrix);
  cpu::matmul(y.data(), act, w.matrix);  // warm up (page in, caches)
  return best_of_s(repeats, [&] { cpu::matmul(y.data(), act, w.matrix); });
}

// Bytes of packed weights of `dtype` streamed per second by a GEMV with `threads` threads, over a matrix
// of about `bytes`.
double stream_bandwidth(ProbeBuffer& buffer, cpu::WeightDtype dtype, std::size_t bytes, int threads, int repeats) {
  const int cols = 4096;
  const double row_bytes = static_cast<double>(cpu::packed_size_bytes(dtype, 16, cols, cpu::default_int8_group(cols))) / 16;
  const double fit = static_cast<double>(std::min(bytes, buffer.size())) / row_bytes;
  const int rows = std::max(16, static_cast<int>(fit) / 16 * 16);
  const ProbeMatrix w(buffer, dtype, rows, cols);
  const int previous = cpu::set_num_threads(threads);
  const double seconds = packed_matmul_s(w, 1, repeats);
  cpu::set_num_threads(previous);
  return static_cast<double>(w.matrix.size_bytes()) / seconds;
}

// n = 64: a prefill chunk's rows share each weight row; n = 16: a decode batch's.
double gemm_flops_one_core(ProbeBuffer& buffer, cpu::WeightDtype dtype, int n, bool quick) {
  const int k = 1024, d = 1024;
  const ProbeMatrix w(buffer, dtype, d, k);
  const int previous = cpu::set_num_threads(1);
  const double seconds = packed_matmul_s(w, n, quick ? 3 : 10);
  cpu::set_num_threads(previous);
  return 2.0 * n * k * d / seconds;
}

// How much of the shorter of a matmul's memory and compute bounds its time adds to the longer (0: fully
// hidden, the plain roofline; 1: their sum): 16 fp32 rows (a decode batch, where the two bounds are about
// even) over the buffer, with all cores, against its bytes at the memory rate and its FLOPs at the 16-row
// rate. The project VM measured 0.57-0.75 over five probes.
double overlap_loss(ProbeBuffer& buffer, int cores, double domain_bandwidth, double small_batch_flops, int repeats) {
  constexpr int kRows = 16, kCols = 4096;
  const int rows = std::max(16, static_cast<int>(buffer.size() / (kCols * sizeof(float))) / 16 * 16);
  const ProbeMatrix w(buffer, cpu::WeightDtype::kF32, rows, kCols);
  const int previous = cpu::set_num_threads(cores);
  const double both_s = packed_matmul_s(w, kRows, repeats);
  cpu::set_num_threads(previous);
  const double memory_s = static_cast<double>(w.matrix.size_bytes()) / domain_bandwidth;
  const double compute_s = 2.0 * kRows * rows * kCols / (small_batch_flops * cores);
  const double loss = (both_s - std::max(memory_s, compute_s)) / std::min(memory_s, compute_s);
  return std::clamp(loss, 0.0, 1.0);
}

// Fixed cost of one small kernel call with the rank's threads (OpenMP fork/join dominates).
double op_overhead_s(ProbeBuffer& buffer, int threads) {
  const ProbeMatrix w(buffer, cpu::WeightDtype::kF32, 512, 64);
  const int previous = cpu::set_num_threads(threads);
  const double best = packed_matmul_s(w, 1, 200);
  cpu::set_num_threads(previous);
  return best;
}

// One step inside a parallel pass: a barrier of the rank's threads (Stage runs each half layer as one pass
// of the kernel threads, its steps separated by barriers; see cpu::run_team).
double step_overhead_s(int threads) {
  if (threads <= 1) return 0.0;
  const int previous = cpu::set_num_threads(threads);
  constexpr int kBarriers = 200;
  const double best = best_of_s(5, [] {
    cpu::run_team([](cpu::Team) {
      for (int b = 0; b < kBarriers; ++b) cpu::team_barrier();
    });
  });
  cpu::set_num_threads(previous);
  return best / kBarriers;
}

// One core's time per element of a row's element-wise work: normalise_rows() (residual add, RMSNorm, the
// row prepared for `dtype`'s kernels) over 64 rows of 4096, in L2.
double row_element_s(cpu::WeightDtype dtype) {
  constexpr int kRows = 64, kDim = 4096;
  const int group = dtype == cpu::WeightDtype::kInt8 ? cpu::default_int8_group(kDim) : 0;
  const cpu::PackedMatrix shape{dtype, 16, kDim, nullptr, group};
  std::vector<float> x(static_cast<std::size_t>(kRows) * kDim, 0.5f), residual(x.size(), 0.25f), out(x.size()),
      weight(kDim, 1.0f);
  cpu::Activations act;
  act.reserve(kRows, kDim);
  act.prepare_shape(out.data(), kRows, shape);
  const double best = best_of_s(
      10, [&] { std::fill(x.begin(), x.end(), 0.5f); },  // the residual adds must not grow x without bound
      [&] { act.normalise_rows(out.data(), x.data(), residual.data(), weight.data(), 1e-5f, 0, kRows); });
  return best / (static_cast<double>(kRows) * kDim);
}

// One core's fixed cost of one attention head for one row: attention over 16 positions (fp16 cache, 16
// heads of 64), whose bytes and FLOPs are a small part of it, per head.
double attention_head_s() {
  constexpr int kHeads = 16, kHeadSize = 64, kPositions = 16, kStride = kHeads * kHeadSize;
  const cpu::KvDtype dtype = cpu::KvDtype::kF16;
  const std::size_t row_bytes = cpu::kv_row_bytes(dtype, kStride, kHeadSize);
  std::vector<std::byte> keys(row_bytes * kPositions), values(row_bytes * kPositions);
  const std::vector<float> row(kStride, 0.25f);
  for (int t = 0; t < kPositions; ++t) {
    cpu::store_kv_row(keys.data() + t * row_bytes, row.data(), kStride, kHeadSize, dtype);
    cpu::store_kv_row(values.data() + t * row_bytes, row.data(), kStride, kHeadSize, dtype);
  }
  const void* key_blocks[] = {keys.data()};
  const void* value_blocks[] = {values.data()};
  std::vector<float> q(kStride, 0.5f), out(kStride), scratch(static_cast<std::size_t>(kHeads) * kPositions);
  const double best = best_of_s(50, [&] {
    cpu::attention_paged(out.data(), q.data(), key_blocks, value_blocks, dtype, kPositions, scratch.data(), kPositions,
                         kHeads, kHeads, kHeadSize, kStride, cpu::Team{});
  });
  return best / kHeads;
}

// One core's attention FLOP rate over a prefill chunk's long context: kAttentionRowsAtOnce rows of one
// sequence at 512 positions and on (fp32 cache, 12 heads of 64, a 110M layer's) in one call, which goes row
// by row where the ISA has no kernel for several rows; 4 FLOPs per cached element a row reads.
double attention_flops() {
  constexpr int kHeads = 12, kHeadSize = 64, kStride = kHeads * kHeadSize, kRows = cpu::kAttentionRowsAtOnce;
  constexpr int kFirstContext = 512, kPositions = kFirstContext + kRows - 1;
  const std::vector<float> cache(static_cast<std::size_t>(kPositions) * kStride, 0.25f);  // (kPositions, kStride)
  const void* blocks[] = {cache.data()};
  const std::vector<float> q(static_cast<std::size_t>(kRows) * kStride, 0.5f);  // (kRows, kStride)
  std::vector<float> out(q.size());
  const std::size_t scratch_stride = static_cast<std::size_t>(kHeads) * kPositions;
  std::vector<float> scratch(kRows * scratch_stride);  // (kRows, kHeads, up to kPositions)
  const double best = best_of_s(10, [&] {
    cpu::attention_rows_paged(out.data(), kStride, q.data(), kStride, blocks, blocks, cpu::KvDtype::kF32, kPositions,
                              scratch.data(), scratch_stride, kFirstContext, kRows, kHeads, kHeads, kHeadSize, kStride,
                              cpu::Team{});
  });
  const double elements = (kRows * (kFirstContext + (kRows - 1) / 2.0)) * kStride;
  return 4.0 * elements / best;
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

// The last-level cache as streamed weights see it. sysfs gives the hardware's size, but a VM or its
// neighbours may leave the rank only part of it: on the project VM sysfs says 480 MiB while the GEMV rate
// on both cores held 55 GB/s up to 60 MiB, fell to 47 at 120 MiB and to memory's 30 at 240 MiB. The cost
// model takes the cache's rate up to cache_bytes, memory's from 4x cache_bytes, and a blend by log(size)
// between (cost_model.cpp), whose midpoint is at 2x cache_bytes. So: streams of doubling size on all cores
// from well inside the cache, until one runs at memory's rate; the size where the rate crosses half way
// between the first's and memory's (interpolated by log(size) between the two streams around it) is
// 2x cache_bytes. A threshold on one stream's rate instead flipped between 60 and 120 MiB from run to run.
struct CacheFit {
  double bytes = 0;
  double core_bandwidth_bytes_per_s = 0;  // one core, the smallest stream
};

CacheFit fit_cache(ProbeBuffer& buffer, double llc, int cores, double memory_rate, int repeats) {
  CacheFit fit;
  if (llc <= 0) return fit;
  const double top = std::min(llc * 2, static_cast<double>(buffer.size()));
  const double start = std::max(llc / 32, std::min(8.0 * kMiB, llc / 4));
  std::vector<double> sizes, rates;
  for (double size = start; size <= top * 1.001; size *= 2) {
    sizes.push_back(size);
    rates.push_back(stream_bandwidth(buffer, cpu::WeightDtype::kF32, static_cast<std::size_t>(size), cores, repeats));
    if (rates.back() <= 1.05 * memory_rate) break;
  }
  if (sizes.empty() || rates[0] < 1.1 * memory_rate) return fit;  // no cache worth the name
  fit.core_bandwidth_bytes_per_s =
      stream_bandwidth(buffer, cpu::WeightDtype::kF32, static_cast<std::size_t>(sizes[0]), 1, repeats);
  const double half_way = (rates[0] + memory_rate) / 2;
  double crossing = sizes.back();  // every stream above half way: the cache holds at least the largest
  for (std::size_t i = 1; i < sizes.size(); ++i) {
    if (rates[i] > half_way) continue;
    const double f = (rates[i - 1] - half_way) / (rates[i - 1] - rates[i]);
    crossing = sizes[i - 1] * std::pow(sizes[i] / sizes[i - 1], f);
    break;
  }
  fit.bytes = crossing / 2;
  return fit;
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
  // From memory: a buffer well beyond the last-level cache (its hardware size). From cache: fit_cache().
  const double llc = llc_bytes();
  const std::size_t big = static_cast<std::size_t>(std::max(llc * 2.0, 256.0 * kMiB));
  std::size_t capped = std::min<std::size_t>(big, options.quick ? 1 * kGiB : 2 * kGiB);
  if (options.max_buffer_bytes > 0) capped = std::min(capped, options.max_buffer_bytes);
  ProbeBuffer buffer(std::max<std::size_t>(capped, 8 * kMiB));
  // Each weight format's own kernels: bf16 and int8 stream fewer bytes per multiply-add and may run on
  // other units (AMX, VNNI), so their FLOP rate is not fp32's, and their streaming rate need not be.
  auto measure = [&](cpu::WeightDtype dtype, double cache_bytes) {
    partition::FormatRates r;
    r.core_bandwidth_bytes_per_s = stream_bandwidth(buffer, dtype, capped, 1, repeats);
    r.domain_bandwidth_bytes_per_s =
        std::max(r.core_bandwidth_bytes_per_s, stream_bandwidth(buffer, dtype, capped, cores, repeats));
    if (cache_bytes > 0) {
      const auto quarter = static_cast<std::size_t>(cache_bytes / 4);
      r.cache_bandwidth_bytes_per_s = stream_bandwidth(buffer, dtype, quarter, 1, repeats);
    }
    r.core_flops = gemm_flops_one_core(buffer, dtype, 64, options.quick);
    r.small_batch_flops = gemm_flops_one_core(buffer, dtype, 16, options.quick);
    r.row_element_s = row_element_s(dtype);
    return r;
  };
  // fp32's cache rate comes from the cache fit, which needs fp32's memory rate first.
  partition::FormatRates fp32 = measure(cpu::WeightDtype::kF32, 0);
  const CacheFit cache = fit_cache(buffer, llc, cores, fp32.domain_bandwidth_bytes_per_s, repeats);
  fp32.cache_bandwidth_bytes_per_s = cache.core_bandwidth_bytes_per_s;
  c.domain.cache_bytes = cache.bytes;
  c.domain.set_rates(partition::WeightFormat::kF32, fp32);
  c.domain.attention_head_s = attention_head_s();
  c.domain.attention_rows = cpu::attention_rows_at_once();
  c.domain.attention_flops = attention_flops();
  for (const cpu::WeightDtype dtype : {cpu::WeightDtype::kBf16, cpu::WeightDtype::kInt8}) {
    const partition::WeightFormat format = weight_format_of(dtype);
    if (std::find(options.formats.begin(), options.formats.end(), format) != options.formats.end()) {
      c.domain.set_rates(format, measure(dtype, cache.bytes));
    }
  }
  c.domain.overlap_loss =
      overlap_loss(buffer, cores, c.domain.domain_bandwidth_bytes_per_s, c.domain.small_batch_flops, repeats);
  c.domain.op_overhead_s = op_overhead_s(buffer, std::max(1, cores));
  c.domain.step_overhead_s = step_overhead_s(cores);
  // Shared-memory MPI between ranks of one host: typical Open MPI vader figures, replaced by `probe`.
  c.same_domain = {1.0e-6, 1.0 / 8e9};
  c.cross_domain = {1.5e-6, 1.0 / 6e9};
  c.cross_node = {20e-6, 1.0 / 1.25e9};
  return c;
}

}  // namespace shardline::runtime
