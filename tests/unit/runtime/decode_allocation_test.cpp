// "No per-token malloc in the decode loop": this binary replaces the global operator new with a counting
// one, then runs a stage's decode steps (forward of one row over a growing paged cache, then logits) and
// requires zero heap allocations once warmed up, over enough steps to cross many KV blocks.
#include <atomic>
#include <cstdlib>
#include <new>
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
}

void* operator new(std::size_t bytes) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace shardline::runtime {
namespace {

TEST(DecodeLoop, MakesNoHeapAllocationPerToken) {
  SHARDLINE_REQUIRE_MODEL_FILE(test::model_file("mini-gqa.bin"));
  const std::string path = test::model_file("mini-gqa.bin");
  const partition::ModelShape shape = read_checkpoint_shape(path);
  const auto stages = partition::stage_layer_ranges(shape, 1);
  const auto shard = partition::shard_for(shape, partition::Mesh::single(), stages);
  ShardWeights weights(path, shape, shard);
  auto comm = comm::make_solo_communicator();
  kernels::cpu::set_num_threads(2);
  Stage stage(weights, *comm, {.max_rows = 8, .kv_block_tokens = 16});
  KvCache cache = stage.make_kv_cache(200);
  std::vector<float> x(shape.dim), logits(shape.vocab_size);
  int token = 1;
  auto step = [&](int pos) {
    stage.embed(&token, 1, x.data());
    stage.forward(x.data(), 1, pos, cache);
    stage.logits(x.data(), logits.data());
    token = kernels::cpu::argmax(logits.data(), shape.vocab_size);
  };
  for (int pos = 0; pos < 20; ++pos) step(pos);  // warm-up: OpenMP's thread pool, first blocks
  const long before = g_allocations.load();
  ASSERT_GT(before, 0) << "the counting operator new is not in use";  // loading allocated, so it counts
  for (int pos = 20; pos < 200; ++pos) step(pos);  // 180 tokens across 11 more blocks
  EXPECT_EQ(g_allocations.load() - before, 0) << "heap allocations in the decode loop";
  EXPECT_EQ(cache.blocks_held(), 13);
}

}  // namespace
}  // namespace shardline::runtime
