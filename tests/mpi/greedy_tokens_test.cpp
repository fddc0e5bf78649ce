// Greedy tokens without the logits gather (Stage::greedy_tokens: each TP rank's best (value, index) of its
// vocabulary slice, reduced in rank order), under real `mpirun --oversubscribe` with tp = the world size.
// It must pick exactly the token one argmax over the gathered logits picks, including the first of equal
// maxima when they sit in different ranks' slices, and the pipeline must generate the same tokens with and
// without the gather.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/ops.h"
#include "partition/mesh.h"
#include "partition/shard.h"
#include "runtime/checkpoint.h"
#include "runtime/comm_groups.h"
#include "runtime/pipeline.h"
#include "runtime/shard_weights.h"
#include "runtime/stage.h"
#include "tests/support/models.h"
#include "tests/support/mpi_world.h"

namespace shardline::runtime {
namespace {

using test::world_rank;
using test::world_size;

constexpr int kTopToken = 500;  // made the largest logit of the tie rows, and copied into the last slices

// A copy of `original` (tiny-32k: its classifier is the token embedding) after edit(embedding, shape) has
// changed embedding rows. Written per process (no two ranks, nor two jobs, write one file).
template <typename Edit>
std::string edited_copy(const std::string& original, const std::string& tag, Edit&& edit) {
  std::ifstream in(original, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const partition::ModelShape shape = read_checkpoint_shape(original);
  edit(reinterpret_cast<float*>(bytes.data() + 7 * sizeof(int)), shape);  // right after the header
  const std::string path =
      (std::filesystem::temp_directory_path() / ("greedy-" + tag + "-" + std::to_string(getpid()) + ".bin")).string();
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// tiny-32k with embedding row kTopToken scaled up and copied to the first entry of every later rank's
// vocabulary slice and to the last entry: identical classifier rows, so identical logits in several slices.
// With nan_rows, those entries' rows are NaN instead (so are their logits, for every input).
std::string model_with_tied_rows(const std::string& original, int tp, std::vector<int>& copies, bool nan_rows = false) {
  return edited_copy(original, "ties", [&](float* embedding, const partition::ModelShape& shape) {
    float* top = embedding + static_cast<std::size_t>(kTopToken) * shape.dim;
    for (int i = 0; i < shape.dim; ++i) top[i] *= 8.0f;
    copies.clear();
    for (int t = 1; t < tp; ++t) copies.push_back(partition::split_evenly(shape.vocab_size, tp, t).begin);
    copies.push_back(shape.vocab_size - 1);
    for (int c : copies) {
      float* row = embedding + static_cast<std::size_t>(c) * shape.dim;
      if (nan_rows) {
        std::fill(row, row + shape.dim, std::numeric_limits<float>::quiet_NaN());
      } else {
        std::copy(top, top + shape.dim, row);
      }
    }
  });
}

// tiny-32k with the classifier rows of every [begin, end) range NaN: their logits are NaN for every input.
std::string model_with_nan_rows(const std::string& original, const std::vector<std::pair<int, int>>& ranges) {
  return edited_copy(original, "nans", [&](float* embedding, const partition::ModelShape& shape) {
    for (const auto& [begin, end] : ranges) {
      std::fill(embedding + static_cast<std::size_t>(begin) * shape.dim, embedding + static_cast<std::size_t>(end) * shape.dim,
                std::numeric_limits<float>::quiet_NaN());
    }
  });
}

// This rank's share of `model` with tp = the world size and pp = 1: its TP group and weights, and a Stage
// for max_rows rows.
struct TpShard {
  TpShard(const std::string& model, int max_rows)
      : mesh(world_size(), world_rank(), world_size(), 1),
        shape(read_checkpoint_shape(model)),
        shard(partition::shard_for(shape, mesh, partition::stage_layer_ranges(shape, 1))),
        groups(make_comm_groups(mesh, {true, 60.0})),
        weights(model, shape, shard, ShardWeightsOptions{}),
        stage(weights, *groups.tp, StageOptions{.max_rows = max_rows}) {}

  const partition::Mesh mesh;
  const partition::ModelShape shape;
  const partition::RankShard shard;
  CommGroups groups;
  ShardWeights weights;
  Stage stage;
};

// n rows of dim normal(0, 1) values.
std::vector<float> random_rows(int n, int dim, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n) * dim);
  for (float& v : x) v = normal(rng);
  return x;
}

// For x's n rows: the logits Stage::logits gathers over the TP group, and the tokens Stage::greedy_tokens
// picks without them, which must be each row's argmax of the former.
struct Picked {
  std::vector<float> logits;  // (n, vocab)
  std::vector<int> tokens;    // (n)
  const float* row(int r, int vocab) const { return logits.data() + static_cast<std::size_t>(r) * vocab; }
};
Picked pick(TpShard& t, const std::vector<float>& x, int n) {
  Picked p{std::vector<float>(static_cast<std::size_t>(n) * t.shape.vocab_size), std::vector<int>(n, -1)};
  std::vector<float> scratch(p.logits.size());
  t.stage.logits(x.data(), n, p.logits.data());
  std::vector<float> values(n);
  std::unique_ptr<bool[]> saw_nan(new bool[n]);
  t.stage.greedy_tokens(x.data(), n, scratch.data(), p.tokens.data(), values.data(), saw_nan.get());
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(p.tokens[r], kernels::cpu::argmax(p.row(r, t.shape.vocab_size), t.shape.vocab_size)) << "row " << r;
    // The winner's value, and whether the row holds a NaN anywhere (which neither the token nor its value shows).
    const float* row = p.row(r, t.shape.vocab_size);
    const bool any_nan = std::any_of(row, row + t.shape.vocab_size, [](float v) { return std::isnan(v); });
    const float logit = row[p.tokens[r]];
    EXPECT_TRUE(values[r] == logit || (std::isnan(values[r]) && std::isnan(logit))) << "row " << r;
    EXPECT_EQ(saw_nan[r], any_nan) << "row " << r;
  }
  return p;
}

TEST(GreedyTokens, TheArgmaxOfTheGatheredLogitsWithTiesAcrossSlices) {
  const std::string original = test::model_file("tiny-32k.bin");
  SHARDLINE_REQUIRE_MODEL_FILE(original);
  std::vector<int> copies;
  const std::string model = model_with_tied_rows(original, world_size(), copies);
  ASSERT_GE(copies.size(), 2u);
  const int n = 8;
  TpShard t(model, n);
  const int dim = t.shape.dim, vocab = t.shape.vocab_size;
  // Rows 0-5 random; rows 6 and 7 the scaled embedding row times the final RMSNorm's weights, so its
  // logit, |row * weights|^2 / rms, is the largest by far (the row is 8 times as long as the others) and
  // appears in every slice: the first (kTopToken, rank 0's) must win.
  std::vector<float> x = random_rows(n, dim, 3);
  const float* top = t.weights.token_embedding() + static_cast<std::size_t>(kTopToken) * dim;
  for (int r : {6, 7}) {
    for (int i = 0; i < dim; ++i) x[static_cast<std::size_t>(r) * dim + i] = top[i] * t.weights.rms_final()[i];
  }
  const Picked p = pick(t, x, n);
  for (int r : {6, 7}) {
    for (int c : copies) ASSERT_EQ(p.row(r, vocab)[c], p.row(r, vocab)[kTopToken]) << "the tie this test needs, entry " << c;
    EXPECT_EQ(p.tokens[r], kTopToken) << "the first of equal maxima, row " << r;
  }
  std::filesystem::remove(model);
}

// A NaN logit is skipped by the argmax over the whole row unless it is the row's first entry; here it is
// the first entry of every later rank's slice, where a slice's own argmax would keep it.
TEST(GreedyTokens, ANanAtTheStartOfASliceIsSkippedAsByOneArgmax) {
  const std::string original = test::model_file("tiny-32k.bin");
  SHARDLINE_REQUIRE_MODEL_FILE(original);
  std::vector<int> nan_entries;
  const std::string model = model_with_tied_rows(original, world_size(), nan_entries, true);
  const int n = 4;
  TpShard t(model, n);
  const Picked p = pick(t, random_rows(n, t.shape.dim, 5), n);  // checks each token against the argmax
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(std::isnan(p.row(r, t.shape.vocab_size)[nan_entries[0]])) << "the NaN this test needs, row " << r;
  }
  std::filesystem::remove(model);
}

// NaN logits where a slice's own argmax and the row's differ: the row's first logit (argmax() returns 0 then,
// which only rank 0 may answer), whole slices of NaNs (a rank with nothing to offer), and rows of NaNs.
TEST(GreedyTokens, NanSlicesAndANanFirstLogitPickWhatOneArgmaxPicks) {
  const std::string original = test::model_file("tiny-32k.bin");
  SHARDLINE_REQUIRE_MODEL_FILE(original);
  const partition::ModelShape shape = read_checkpoint_shape(original);
  const int tp = world_size(), vocab = shape.vocab_size;
  const auto slice = [&](int t) {
    const auto range = partition::split_evenly(vocab, tp, t);
    return std::pair<int, int>(range.begin, range.begin + range.size());
  };
  const std::vector<std::vector<std::pair<int, int>>> cases = {
      {slice(tp - 1)},                       // the last rank's slice
      {{0, 1}},                              // the first logit
      {{0, 1}, slice(tp - 1)},               // both
      {{1, slice(0).second}, slice(1)},      // rank 0's slice but its first entry, and all of rank 1's
      {{0, vocab - 1}},                      // all but the very last
      {{1, vocab}},                          // all but the first
      {{0, vocab}},                          // all
  };
  const int n = 4;
  for (std::size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(::testing::Message() << "case " << c);
    const std::string model = model_with_nan_rows(original, cases[c]);
    {
      TpShard t(model, n);
      const Picked p = pick(t, random_rows(n, t.shape.dim, 11 + static_cast<std::uint32_t>(c)), n);  // against argmax
      const bool first_is_nan = cases[c].front().first == 0;
      for (int r = 0; r < n && first_is_nan; ++r) {
        EXPECT_EQ(p.tokens[r], 0) << "a NaN first logit is argmax()'s answer, row " << r;
      }
    }
    std::filesystem::remove(model);
  }
}

TEST(GreedyTokens, ThePipelineGeneratesTheSameTokensWithoutTheGather) {
  const std::string model = test::model_file("tiny-32k.bin");  // 4 kv heads: tp up to 4
  SHARDLINE_REQUIRE_MODEL_FILE(model);
  std::vector<SequenceSpec> specs(4);
  const std::vector<std::vector<int>> prompts = {{1, 450, 4996, 17354}, {1, 9038, 2501, 263, 931}, {1, 319}, {1, 29871}};
  for (std::size_t i = 0; i < specs.size(); ++i) {
    specs[i].prompt_ids = prompts[i];
    specs[i].steps = 16;
    specs[i].chunk_tokens = 4;
  }
  TpShard t(model, Pipeline::max_rows_for(PipelineOptions{1}, specs));
  Pipeline pipeline(t.stage, t.mesh, *t.groups.world, PipelineOptions{1});
  std::vector<std::vector<int>> gathered, not_gathered;
  int null_logits = 0;
  for (const auto& o : pipeline.run(specs, {}, true)) gathered.push_back(o.ids);
  const auto on_token = [&](int, int, const float* logits) { null_logits += logits == nullptr; };
  for (const auto& o : pipeline.run(specs, on_token, false)) not_gathered.push_back(o.ids);
  EXPECT_EQ(not_gathered, gathered);
  ASSERT_EQ(gathered.size(), specs.size());
  EXPECT_EQ(null_logits, 4 * 16) << "every token greedy, picked without the logits";
}

}  // namespace
}  // namespace shardline::runtime
