// "No per-token malloc in the decode loop": this binary replaces the C allocator's entry points (malloc,
// calloc, realloc and the aligned ones) with counting ones, so it sees operator new (libstdc++'s calls
// malloc) and the allocations libraries make on their own, OpenMP's included: a parallel pragma opened
// inside a kernel pass allocates a nested team on every call (session 29: a fold in the tiles did, and a
// batch-16 decode step ran 3x slower). It runs a stage's decode steps, one row and a batch of rows, every
// weight dtype, and requires zero heap allocations once warmed up, over enough steps to cross KV blocks.
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "kernels/cpu/ops.h"
#include "partition/mesh.h"
#include "partition/shard.h"
#include "runtime/checkpoint.h"
#include "runtime/shard_weights.h"
#include "runtime/stage.h"
#include "tests/support/models.h"

namespace {
std::atomic<long> g_allocations{0};
void count_allocation() { g_allocations.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

// glibc's own implementations, under the names it exports for allocators that wrap them.
extern "C" {
void* __libc_malloc(std::size_t bytes);
void* __libc_calloc(std::size_t count, std::size_t bytes);
void* __libc_realloc(void* p, std::size_t bytes);
void* __libc_memalign(std::size_t alignment, std::size_t bytes);
void __libc_free(void* p);

void* malloc(std::size_t bytes) noexcept {
  count_allocation();
  return __libc_malloc(bytes);
}
void* calloc(std::size_t count, std::size_t bytes) noexcept {
  count_allocation();
  return __libc_calloc(count, bytes);
}
void* realloc(void* p, std::size_t bytes) noexcept {
  count_allocation();
  return __libc_realloc(p, bytes);
}
void* memalign(std::size_t alignment, std::size_t bytes) noexcept {
  count_allocation();
  return __libc_memalign(alignment, bytes);
}
void* aligned_alloc(std::size_t alignment, std::size_t bytes) noexcept {
  count_allocation();
  return __libc_memalign(alignment, bytes);
}
int posix_memalign(void** out, std::size_t alignment, std::size_t bytes) noexcept {
  count_allocation();
  void* p = __libc_memalign(alignment, bytes);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
void free(void* p) noexcept { __libc_free(p); }
}

namespace shardline::runtime {
namespace {

using kernels::cpu::KvDtype;
using kernels::cpu::WeightDtype;

struct Case {
  WeightDtype dtype;
  KvDtype kv_dtype;
  int rows;  // sequences decoding together, one row each a step
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return std::string(kernels::cpu::weight_dtype_name(info.param.dtype)) + "_kv" +
         kernels::cpu::kv_dtype_name(info.param.kv_dtype) + "_" + std::to_string(info.param.rows) + "rows";
}

class DecodeLoop : public testing::TestWithParam<Case> {};

TEST_P(DecodeLoop, MakesNoHeapAllocationPerToken) {
  SHARDLINE_REQUIRE_MODEL_FILE(test::model_file("mini-gqa.bin"));
  const Case c = GetParam();
  const std::string path = test::model_file("mini-gqa.bin");
  const partition::ModelShape shape = read_checkpoint_shape(path);
  const auto stages = partition::stage_layer_ranges(shape, 1);
  const auto shard = partition::shard_for(shape, partition::Mesh::single(), stages);
  kernels::cpu::set_num_threads(2);
  ShardWeights weights(path, shape, shard, {.dtype = c.dtype});
  auto comm = comm::make_solo_communicator();
  Stage stage(weights, *comm, {.max_rows = 8, .kv_block_tokens = 16, .kv_dtype = c.kv_dtype});
  std::vector<KvCache> caches;
  for (int s = 0; s < c.rows; ++s) caches.push_back(stage.make_kv_cache(200));
  std::vector<Row> rows(c.rows);
  std::vector<int> tokens(c.rows), next(c.rows);
  std::vector<float> x(static_cast<std::size_t>(c.rows) * shape.dim);
  std::vector<float> logits(static_cast<std::size_t>(c.rows) * shape.vocab_size), values(c.rows);
  std::vector<char> saw_nan(c.rows);  // bool's vector packs bits
  for (int s = 0; s < c.rows; ++s) tokens[s] = 1 + s;
  auto step = [&](int pos) {
    for (int s = 0; s < c.rows; ++s) rows[s] = {&caches[s], pos};
    stage.embed(tokens.data(), c.rows, x.data());
    stage.forward(x.data(), rows.data(), c.rows);
    stage.greedy_tokens(x.data(), c.rows, logits.data(), next.data(), values.data(),
                        reinterpret_cast<bool*>(saw_nan.data()));
    tokens.swap(next);
  };
  for (int pos = 0; pos < 20; ++pos) step(pos);  // warm-up: OpenMP's thread pool, first blocks
  const long before = g_allocations.load();
  ASSERT_GT(before, 0) << "the counting allocator is not in use";  // loading allocated, so it counts
  for (int pos = 20; pos < 200; ++pos) step(pos);  // 180 tokens across 11 more blocks
  EXPECT_EQ(g_allocations.load() - before, 0) << "heap allocations in the decode loop";
  for (const KvCache& cache : caches) EXPECT_EQ(cache.blocks_held(), 13);
}

INSTANTIATE_TEST_SUITE_P(WeightDtypes, DecodeLoop,
                         testing::Values(Case{WeightDtype::kF32, KvDtype::kF32, 1}, Case{WeightDtype::kF32, KvDtype::kF32, 4},
                                         Case{WeightDtype::kBf16, KvDtype::kF16, 4},
                                         Case{WeightDtype::kInt8, KvDtype::kF16, 1},
                                         Case{WeightDtype::kInt8, KvDtype::kInt8, 4}),
                         case_name);

}  // namespace
}  // namespace shardline::runtime
