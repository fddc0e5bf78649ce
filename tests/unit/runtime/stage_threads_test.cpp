// A stage's logits must not depend on how many kernel threads compute them: each half of a layer is one
// parallel pass of the threads with barriers between its steps (stage.cpp), rows go to the threads as
// bands, or, with fewer rows than threads and a context longer than cpu::kMinParallelAttentionContext, each
// row's heads do. Decoding a few sequences side by side past that length on 1, 2 and 3 threads must give the
// same bits at every step, for fp32 and int8 weights (the AMX path where the CPU has it).
#include <limits>
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
#include "tests/support/kernel_fixtures.h"
#include "tests/support/models.h"

namespace shardline::runtime {
namespace {

constexpr int kSteps = 80;  // past kMinParallelAttentionContext, so the heads' split runs too

// Every step's logits of n_sequences sequences decoded side by side (one row each per forward call) from
// different first tokens, greedy: (steps, n_sequences, vocab) flattened.
// context: the positions the stage's attention scratch is first sized for (StageOptions::context; 0: seq_len).
std::vector<float> decode_logits(const ShardWeights& weights, int threads, int n_sequences, int context = 0) {
  test::ScopedThreads scoped(threads);
  auto comm = comm::make_solo_communicator();
  const partition::ModelShape& shape = weights.shape();
  Stage stage(weights, *comm, {.max_rows = 4, .kv_block_tokens = 16, .context = context});
  std::vector<KvCache> caches;
  for (int s = 0; s < n_sequences; ++s) caches.push_back(stage.make_kv_cache(kSteps));
  std::vector<int> tokens;
  for (int s = 0; s < n_sequences; ++s) tokens.push_back(1 + 97 * s);
  std::vector<Row> rows(n_sequences);
  std::vector<float> x(static_cast<std::size_t>(n_sequences) * shape.dim);
  std::vector<float> step(static_cast<std::size_t>(n_sequences) * shape.vocab_size), all;
  for (int pos = 0; pos < kSteps; ++pos) {
    for (int s = 0; s < n_sequences; ++s) rows[s] = {&caches[s], pos};
    stage.embed(tokens.data(), n_sequences, x.data());
    stage.forward(x.data(), rows.data(), n_sequences);
    stage.logits(x.data(), n_sequences, step.data());
    all.insert(all.end(), step.begin(), step.end());
    for (int s = 0; s < n_sequences; ++s) {
      tokens[s] = kernels::cpu::argmax(step.data() + static_cast<std::size_t>(s) * shape.vocab_size, shape.vocab_size);
    }
  }
  return all;
}

// mini-gqa, and tiny-32k, whose int8 wo input is spread into padded segments (runtime::WoInput: kv heads of
// 16 query columns, each padded to 32) after attention, on the thread that attended the row or, with the
// heads split, on the thread whose band the row is in.
TEST(StageThreads, LogitsAreTheSameBitsForEveryThreadCountBatchAndContext) {
  for (const std::string model : {"mini-gqa.bin", "tiny-32k.bin"}) {
    const std::string path = test::model_file(model);
    SHARDLINE_REQUIRE_MODEL_FILE(path);
  }
  for (const std::string model : {"mini-gqa.bin", "tiny-32k.bin"}) {
    const std::string path = test::model_file(model);
    const partition::ModelShape shape = read_checkpoint_shape(path);
    const auto shard = partition::shard_for(shape, partition::Mesh::single(), partition::stage_layer_ranges(shape, 1));
    for (kernels::cpu::WeightDtype dtype : {kernels::cpu::WeightDtype::kF32, kernels::cpu::WeightDtype::kInt8}) {
      SCOPED_TRACE(model + " " + kernels::cpu::weight_dtype_name(dtype));
      ShardWeights weights(path, shape, shard, {dtype});
      for (int n_sequences : {1, 2, 3}) {
        const std::vector<float> one_thread = decode_logits(weights, 1, n_sequences);
        for (int threads : {2, 3}) {
          EXPECT_TRUE(decode_logits(weights, threads, n_sequences) == one_thread)
              << n_sequences << " sequences on " << threads << " threads differ from one thread";
        }
      }
    }
  }
}

// The attention scratch sized for 5 positions grows as the rows pass it (5 -> 10 -> 20 -> 40 -> 80), on
// one thread and on three: the logits are the bits of a scratch sized for the whole context at load.
TEST(StageThreads, AScratchSizedForAShortContextGrowsWithTheRowsAndGivesTheSameBits) {
  const std::string path = test::model_file("mini-gqa.bin");
  SHARDLINE_REQUIRE_MODEL_FILE(path);
  const partition::ModelShape shape = read_checkpoint_shape(path);
  ASSERT_GT(shape.seq_len, kSteps);
  const auto shard = partition::shard_for(shape, partition::Mesh::single(), partition::stage_layer_ranges(shape, 1));
  EXPECT_LT(Stage::scratch_bytes(shape, shard, 4, 5), Stage::scratch_bytes(shape, shard, 4));
  ShardWeights weights(path, shape, shard, {kernels::cpu::WeightDtype::kF32});
  for (int threads : {1, 3}) {
    EXPECT_TRUE(decode_logits(weights, threads, 2, /*context=*/5) == decode_logits(weights, threads, 2))
        << "a scratch grown from 5 positions differs on " << threads << " threads";
  }
}

// The automatic KV pool: 64 contexts, bounded by the memory the blocks could be committed in, never zero,
// and no int overflow for a context of 2^31 positions.
TEST(StageKvPool, TheAutomaticPoolIsSixtyFourContextsBoundedByMemory) {
  constexpr std::uint64_t kGiB = 1ull << 30;
  EXPECT_EQ(default_kv_blocks(16, 4096, 64 * kGiB), 64 * 16);          // a short context: 64 of them
  EXPECT_EQ(default_kv_blocks(16, 4096, 0), 64 * 16);                  // no memory figure: no bound
  // 2^20 blocks of 128 KiB a context (a 16M-token context of an 8-layer, 2048-wide model): 64 contexts are
  // 8 PiB; 64 GiB hold 512K blocks, half a context.
  EXPECT_EQ(default_kv_blocks(1 << 20, 128 * 1024, 64 * kGiB), 512 * 1024);
  EXPECT_EQ(default_kv_blocks(1, 128 * kGiB, 64 * kGiB), 1);           // a block larger than memory: still one
  EXPECT_EQ(default_kv_blocks((1ll << 31) / 16, 4096, 0), std::numeric_limits<int>::max());  // was an int overflow
  // A memory figure misread as (nearly) nothing still leaves the floor: one context of the initial scratch.
  EXPECT_EQ(default_kv_blocks(1 << 20, 128 * 1024, 4096, 256), 256);
  EXPECT_EQ(default_kv_blocks(16, 4096, 4096, 5000), 64 * 16);  // never more than 64 contexts
}

}  // namespace
}  // namespace shardline::runtime
