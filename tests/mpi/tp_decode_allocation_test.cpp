// "No per-token malloc in the decode loop" for a TP group under real mpirun (tp = the world size): the
// segment products passed from rank to rank (Communicator::ordered_sum through the host's shared memory),
// the TP ranks' greedy pick and the logits' gather, each rank's kernels on one thread (the ranks share this
// host's cores; tests/unit/runtime/decode_allocation_test.cpp, the one-rank twin, runs two kernel threads,
// which is where OpenMP's nested teams would show). Every allocation counts (tests/support/
// counting_allocator.h), on every rank.
#include <string>

#include <gtest/gtest.h>

#include "kernels/cpu/ops.h"
#include "partition/mesh.h"
#include "partition/shard.h"
#include "runtime/checkpoint.h"
#include "runtime/comm_groups.h"
#include "runtime/shard_weights.h"
#include "runtime/stage.h"
#include "tests/support/counting_allocator.h"
#include "tests/support/greedy_steps.h"
#include "tests/support/models.h"
#include "tests/support/mpi_world.h"

namespace shardline::runtime {
namespace {

class TpDecodeLoop : public testing::TestWithParam<test::DecodeCase> {};

TEST_P(TpDecodeLoop, MakesNoHeapAllocationPerTokenOnAnyRank) {
  SHARDLINE_REQUIRE_MODEL_FILE(test::model_file("mini-gqa.bin"));
  const test::DecodeCase c = GetParam();
  const std::string path = test::model_file("mini-gqa.bin");
  const partition::Mesh mesh(test::world_size(), test::world_rank(), test::world_size(), 1);
  const partition::ModelShape shape = read_checkpoint_shape(path);
  const auto shard = partition::shard_for(shape, mesh, partition::stage_layer_ranges(shape, 1));
  CommGroups groups = make_comm_groups(mesh, {true, 60.0});
  kernels::cpu::set_num_threads(1);  // the ranks share this host's cores
  ShardWeights weights(path, shape, shard, {.dtype = c.dtype});
  Stage stage(weights, *groups.tp, {.max_rows = 8, .kv_block_tokens = 16, .kv_dtype = c.kv_dtype});
  test::GreedySteps steps(stage, c.rows, 120, c.pick);
  for (int pos = 0; pos < 20; ++pos) steps.step(pos);  // warm-up: first blocks, grown scratch
  const long before = test::allocations();
  ASSERT_GT(before, 0) << "the counting allocator is not in use";
  for (int pos = 20; pos < 120; ++pos) steps.step(pos);
  EXPECT_EQ(test::allocations() - before, 0) << "heap allocations in the decode loop on rank " << test::world_rank();
}

INSTANTIATE_TEST_SUITE_P(WeightDtypes, TpDecodeLoop, testing::ValuesIn(test::decode_cases()), test::decode_case_name);

}  // namespace
}  // namespace shardline::runtime
