// Argmax and llama2.c's temperature / top-p sampling (runtime/sampler.cpp) on the device.
//
// Top-p needs the probabilities in descending order with ties by token id: a segmented radix sort (CUB's
// is stable, so equal probabilities keep ascending token order, exactly the CPU comparator's order). The
// cumulative walks ("first index whose running sum exceeds a threshold") are block-wide prefix scans over
// tiles, stopping at the first tile that crosses.
#include <climits>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace shardline::kernels::cuda {

namespace {

constexpr int kItems = 8;  // values per thread per tile of a scan

struct ArgBest {
  float value;
  int index;
};
// Larger value wins; on equal values the smaller index, so the result is the first maximum.
struct ArgBestOp {
  __device__ ArgBest operator()(const ArgBest& a, const ArgBest& b) const {
    if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
    return a;
  }
};

__global__ void argmax_kernel(int* out, const float* x, int size) {
  const float* row = x + static_cast<std::size_t>(blockIdx.x) * size;
  ArgBest best{row[0], 0};
  for (int i = threadIdx.x; i < size; i += blockDim.x) {
    if (row[i] > best.value) best = {row[i], i};  // ascending i per thread: strict > keeps the first
  }
  using Reduce = cub::BlockReduce<ArgBest, kRowThreads>;
  __shared__ typename Reduce::TempStorage storage;
  const ArgBest result = Reduce(storage).Reduce(best, ArgBestOp());
  if (threadIdx.x == 0) out[blockIdx.x] = result.index;
}

// probs = softmax(logits / temperature), one block per row, the CPU sampler's steps in its order.
__global__ void softmax_kernel(float* logits, int size, float temperature) {
  float* row = logits + static_cast<std::size_t>(blockIdx.x) * size;
  float local_max = -INFINITY;
  for (int i = threadIdx.x; i < size; i += blockDim.x) {
    row[i] /= temperature;
    local_max = fmaxf(local_max, row[i]);
  }
  const float max_val = block_max(local_max);
  float local_sum = 0.0f;
  for (int i = threadIdx.x; i < size; i += blockDim.x) {
    row[i] = expf(row[i] - max_val);
    local_sum += row[i];
  }
  const float inv = 1.0f / block_sum(local_sum);
  for (int i = threadIdx.x; i < size; i += blockDim.x) row[i] *= inv;
}

struct Crossing {
  int index;         // first i in [0, n) with p[0] + ... + p[i] > threshold; -1 when none
  float cumulative;  // that running sum; the total of p[0, n) when none
};

// Block-wide: every thread gets the same answer. Tiles of kRowThreads * kItems values, each thread summing
// kItems consecutive ones, so a tile is one exclusive scan.
__device__ Crossing first_crossing(const float* p, int n, float threshold) {
  using Scan = cub::BlockScan<float, kRowThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int found_index;
  __shared__ float found_cumulative;
  __syncthreads();  // a previous call's threads may still be reading found_index
  float carried = 0.0f;  // sum of the tiles before this one
  for (int base = 0; base < n; base += kRowThreads * kItems) {
    const int first = base + threadIdx.x * kItems;
    float values[kItems];
    float thread_sum = 0.0f;
    for (int j = 0; j < kItems; ++j) {
      values[j] = first + j < n ? p[first + j] : 0.0f;
      thread_sum += values[j];
    }
    float before = 0.0f;
    float tile_sum = 0.0f;
    Scan(scan_storage).ExclusiveSum(thread_sum, before, tile_sum);
    if (threadIdx.x == 0) found_index = INT_MAX;
    __syncthreads();
    float running = carried + before;
    int mine = INT_MAX;
    for (int j = 0; j < kItems && first + j < n; ++j) {
      running += values[j];
      if (running > threshold) {
        mine = first + j;
        break;
      }
    }
    if (mine != INT_MAX) atomicMin(&found_index, mine);
    __syncthreads();
    if (mine != INT_MAX && mine == found_index) found_cumulative = running;
    __syncthreads();
    if (found_index != INT_MAX) return {found_index, found_cumulative};
    carried += tile_sum;
    __syncthreads();  // scan_storage is reused by the next tile
  }
  return {-1, carried};
}

// Whole distribution: the first token whose cdf exceeds the coin (the last one if rounding leaves the cdf
// just below 1), as the CPU sampler.
__global__ void sample_full_kernel(int* tokens, const float* probs, const float* coins, int size) {
  const float* row = probs + static_cast<std::size_t>(blockIdx.x) * size;
  const Crossing hit = first_crossing(row, size, coins[blockIdx.x]);
  if (threadIdx.x == 0) tokens[blockIdx.x] = hit.index >= 0 ? hit.index : size - 1;
}

// Top-p over the sorted row: candidates are the prefix with p >= (1 - top_p) / (n - 1); the nucleus ends at
// the first candidate whose running sum exceeds top_p; the coin scaled by the nucleus' mass picks inside it.
__global__ void sample_top_p_kernel(int* tokens, const float* sorted_probs, const int* sorted_ids,
                                    const float* coins, int size, float top_p) {
  const std::size_t row = static_cast<std::size_t>(blockIdx.x) * size;
  const float* p = sorted_probs + row;
  const float cutoff = (1.0f - top_p) / static_cast<float>(size - 1);
  using Count = cub::BlockReduce<int, kRowThreads>;
  __shared__ typename Count::TempStorage count_storage;
  __shared__ int n_candidates;
  int local = 0;
  for (int i = threadIdx.x; i < size; i += blockDim.x) local += p[i] >= cutoff ? 1 : 0;
  const int counted = Count(count_storage).Sum(local);
  if (threadIdx.x == 0) n_candidates = counted > 0 ? counted : 1;  // the top token always qualifies
  __syncthreads();
  const Crossing nucleus = first_crossing(p, n_candidates, top_p);
  const int last = nucleus.index >= 0 ? nucleus.index : n_candidates - 1;
  const Crossing pick = first_crossing(p, last + 1, coins[blockIdx.x] * nucleus.cumulative);
  if (threadIdx.x == 0) tokens[blockIdx.x] = sorted_ids[row + (pick.index >= 0 ? pick.index : last)];
}

__global__ void fill_ids_kernel(int* ids, int* offsets, int n_rows, int size) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < static_cast<std::size_t>(n_rows) * size) ids[i] = static_cast<int>(i % size);
  if (i <= static_cast<std::size_t>(n_rows)) offsets[i] = static_cast<int>(i) * size;
}

std::size_t sort_temp_bytes(int n_rows, int size, const int* offsets) {
  std::size_t bytes = 0;
  check_cuda(cub::DeviceSegmentedRadixSort::SortPairsDescending(
                 nullptr, bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
                 static_cast<const int*>(nullptr), static_cast<int*>(nullptr), n_rows * size, n_rows, offsets,
                 offsets + 1),
             "top-p sort size query");
  return bytes;
}

}  // namespace

void argmax(int* out, const float* x, int n_rows, int size, StreamRef stream) {
  if (n_rows <= 0) return;
  argmax_kernel<<<n_rows, kRowThreads, 0, native(stream)>>>(out, x, size);
}

struct TokenSampler::Impl {
  TokenSamplerOptions options;
  DeviceBuffer ids;           // (max_rows, vocab) token ids 0..vocab-1 of every row: the sort's values
  DeviceBuffer offsets;       // (max_rows + 1) row starts
  DeviceBuffer sorted_probs;  // (max_rows, vocab)
  DeviceBuffer sorted_ids;    // (max_rows, vocab)
  DeviceBuffer sort_temp;
};

TokenSampler::TokenSampler(const TokenSamplerOptions& options) : impl_(std::make_unique<Impl>()) {
  SL_CHECK(options.max_rows > 0 && options.vocab_size > 1);
  SL_CHECK_MSG(static_cast<long long>(options.max_rows) * options.vocab_size < INT_MAX,
               "{} rows of {} logits overflow the sort's int offsets", options.max_rows, options.vocab_size);
  Impl& m = *impl_;
  m.options = options;
  const std::size_t items = static_cast<std::size_t>(options.max_rows) * options.vocab_size;
  m.ids = DeviceBuffer(items * sizeof(int));
  m.offsets = DeviceBuffer((options.max_rows + 1) * sizeof(int));
  m.sorted_probs = DeviceBuffer(items * sizeof(float));
  m.sorted_ids = DeviceBuffer(items * sizeof(int));
  const unsigned blocks = static_cast<unsigned>((items + 1 + kRowThreads - 1) / kRowThreads);
  fill_ids_kernel<<<blocks, kRowThreads>>>(m.ids.as<int>(), m.offsets.as<int>(), options.max_rows,
                                            options.vocab_size);
  check_cuda(cudaGetLastError(), "sampler set-up");
  check_cuda(cudaDeviceSynchronize(), "sampler set-up");
  m.sort_temp = DeviceBuffer(sort_temp_bytes(options.max_rows, options.vocab_size, m.offsets.as<int>()));
}

TokenSampler::TokenSampler(TokenSampler&&) noexcept = default;
TokenSampler& TokenSampler::operator=(TokenSampler&&) noexcept = default;
TokenSampler::~TokenSampler() = default;

void TokenSampler::sample(int* tokens, float* logits, const float* coins, int n_rows, float temperature,
                          float top_p, StreamRef stream) {
  Impl& m = *impl_;
  SL_CHECK_MSG(n_rows > 0 && n_rows <= m.options.max_rows, "{} rows for a sampler of {}", n_rows, m.options.max_rows);
  const int size = m.options.vocab_size;
  if (temperature == 0.0f) {
    argmax(tokens, logits, n_rows, size, stream);
    return;
  }
  softmax_kernel<<<n_rows, kRowThreads, 0, native(stream)>>>(logits, size, temperature);
  if (top_p <= 0.0f || top_p >= 1.0f) {
    sample_full_kernel<<<n_rows, kRowThreads, 0, native(stream)>>>(tokens, logits, coins, size);
    return;
  }
  std::size_t temp_bytes = sort_temp_bytes(n_rows, size, m.offsets.as<int>());
  SL_CHECK_MSG(temp_bytes <= m.sort_temp.bytes(), "sort needs {} bytes, sampler holds {}", temp_bytes,
               m.sort_temp.bytes());
  temp_bytes = m.sort_temp.bytes();
  // Kernels never throw; a failed enqueue shows at the next synchronisation like any launch error.
  cub::DeviceSegmentedRadixSort::SortPairsDescending(
      m.sort_temp.data(), temp_bytes, static_cast<const float*>(logits), m.sorted_probs.as<float>(),
      static_cast<const int*>(m.ids.as<int>()), m.sorted_ids.as<int>(), n_rows * size, n_rows,
      m.offsets.as<int>(), m.offsets.as<int>() + 1, 0, static_cast<int>(sizeof(float) * 8), native(stream));
  sample_top_p_kernel<<<n_rows, kRowThreads, 0, native(stream)>>>(tokens, m.sorted_probs.as<float>(),
                                                                  m.sorted_ids.as<int>(), coins, size, top_p);
}

}  // namespace shardline::kernels::cuda
