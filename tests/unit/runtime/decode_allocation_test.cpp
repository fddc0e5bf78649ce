// "No per-token malloc in the decode loop": this binary counts every allocation (tests/support/
// counting_allocator.h: operator new's and what libraries make on their own, OpenMP's included: a parallel
// pragma entered inside a kernel pass allocates a nested team on every call; session 29: a fold in the tiles
// did, and a batch-16 decode step ran 3x slower). It runs a stage's decode steps, one row and a batch of
// rows, every weight dtype, and requires zero heap allocations once warmed up, over enough steps to cross
// KV blocks. tests/mpi/tp_decode_allocation_test.cpp does the same for a TP group.
#include <string>

#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "kernels/cpu/ops.h"
#include "partition/mesh.h"
#include "partition/shard.h"
#include "runtime/checkpoint.h"
#include "runtime/shard_weights.h"
#include "runtime/stage.h"
#include "tests/support/counting_allocator.h"
#include "tests/support/greedy_steps.h"
#include "tests/support/models.h"

namespace shardline::runtime {
namespace {

class DecodeLoop : public testing::TestWithParam<test::DecodeCase> {};

TEST_P(DecodeLoop, MakesNoHeapAllocationPerToken) {
  SHARDLINE_REQUIRE_MODEL_FILE(test::model_file("mini-gqa.bin"));
  const test::DecodeCase c = GetParam();
  const std::string path = test::model_file("mini-gqa.bin");
  const partition::ModelShape shape = read_checkpoint_shape(path);
  const auto stages = partition::stage_layer_ranges(shape, 1);
  const auto shard = partition::shard_for(shape, partition::Mesh::single(), stages);
  kernels::cpu::set_num_threads(2);
  ShardWeights weights(path, shape, shard, {.dtype = c.dtype});
  auto comm = comm::make_solo_communicator();
  Stage stage(weights, *comm, {.max_rows = 8, .kv_block_tokens = 16, .kv_dtype = c.kv_dtype});
  test::GreedySteps steps(stage, c.rows, 200, c.pick);
  for (int pos = 0; pos < 20; ++pos) steps.step(pos);  // warm-up: OpenMP's thread pool, first blocks
  const long before = test::allocations();
  ASSERT_GT(before, 0) << "the counting allocator is not in use";  // loading allocated, so it counts
  for (int pos = 20; pos < 200; ++pos) steps.step(pos);  // 180 tokens across 11 more blocks
  EXPECT_EQ(test::allocations() - before, 0) << "heap allocations in the decode loop";
  for (const KvCache& cache : steps.caches()) EXPECT_EQ(cache.blocks_held(), 13);
}

INSTANTIATE_TEST_SUITE_P(WeightDtypes, DecodeLoop, testing::ValuesIn(test::decode_cases()), test::decode_case_name);

}  // namespace
}  // namespace shardline::runtime
