// The pipeline's side of StageBackend::moves_activations (issue #8: NCCL between pipeline stages), under real
// `mpirun --oversubscribe`. The CUDA stage keeps activations on its GPU and moves them over NCCL; no GPU
// here, so this test drives the same pipeline path with a backend that keeps "resident" activations in its
// own host buffer and moves them over its own MPI group of equal-tp ranks (the group the CUDA stage makes
// over NCCL). It checks what is the pipeline's to get right: the header goes first and the next stage's
// receive follows it, stage 0 keeps several sends in flight from copies, the last stage downloads before
// sampling, nothing deadlocks, and every layout generates exactly the tokens of the plain path. The CUDA
// half (NCCL send/recv from device buffers) runs in scripts/gpu-check.sh.
#include <mpi.h>

#include <memory>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "comm/mpi_communicator.h"
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

// The CPU Stage's arithmetic, with activations held and moved by the backend.
class ResidentStage final : public StageBackend {
 public:
  ResidentStage(Stage& cpu, comm::Communicator& pp_group, int pp_rank)
      : cpu_(cpu), pp_(pp_group), pp_rank_(pp_rank) {}

  std::string describe() const override { return "cpu, resident activations"; }
  const partition::ModelShape& shape() const override { return cpu_.shape(); }
  KvCache make_kv_cache(int n_positions) override { return cpu_.make_kv_cache(n_positions); }
  int kv_blocks_for(int n_positions) const override { return cpu_.kv_blocks_for(n_positions); }
  const memory::KvBlockPool& kv_pool() const override { return cpu_.kv_pool(); }
  void embed(const int* tokens, int n, float* x) override { cpu_.embed(tokens, n, x); }
  void forward(float*, const Row*, int) override { ADD_FAILURE() << "forward() called on a resident pipeline"; }
  void logits(const float* x, int n, float* logits) override { cpu_.logits(x, n, logits); }
  int max_rows() const override { return cpu_.max_rows(); }
  void reserve_rows(int rows) override {
    cpu_.reserve_rows(rows);
    resident_.resize(static_cast<std::size_t>(cpu_.max_rows()) * shape().dim);
  }

  bool moves_activations() const override { return true; }
  void recv_activations(int n) override {
    ++received;
    pp_.recv(resident_.data(), bytes(n), pp_rank_ - 1, 0);
  }
  void forward_resident(const float* x, const Row* rows, int n) override {
    if (x) std::copy(x, x + static_cast<std::size_t>(n) * shape().dim, resident_.begin());
    cpu_.forward(resident_.data(), rows, n);
  }
  std::unique_ptr<comm::PendingSend> isend_activations(int n) override {
    ++sent;
    // A copy per send, as the CUDA stage's send buffers: resident_ is the next item's before this arrives.
    struct Send final : comm::PendingSend {
      std::vector<float> copy;
      std::unique_ptr<comm::PendingSend> inner;
      void wait() override { inner->wait(); }
    };
    auto send = std::make_unique<Send>();
    send->copy.assign(resident_.begin(), resident_.begin() + static_cast<std::ptrdiff_t>(n) * shape().dim);
    send->inner = pp_.isend(send->copy.data(), bytes(n), pp_rank_ + 1, 0);
    return send;
  }
  void download_activations(float* x, int n) override {
    ++downloaded;
    std::copy(resident_.begin(), resident_.begin() + static_cast<std::ptrdiff_t>(n) * shape().dim, x);
  }

  int received = 0, sent = 0, downloaded = 0;

 private:
  std::size_t bytes(int n) const { return static_cast<std::size_t>(n) * shape().dim * sizeof(float); }
  Stage& cpu_;
  comm::Communicator& pp_;
  int pp_rank_;
  std::vector<float> resident_;  // (max_rows, dim)
};

struct Outcome {
  std::vector<std::vector<int>> ids;  // last stage only
  int received = 0, sent = 0, downloaded = 0;
};

// Runs the sequences through a (tp, pp) pipeline of the model, the plain way or with resident activations.
Outcome run_layout(const std::string& model, int tp, int pp, int micro_batches, bool resident,
                   const std::vector<SequenceSpec>& specs) {
  const partition::Mesh mesh(world_size(), world_rank(), tp, pp);
  const partition::ModelShape shape = read_checkpoint_shape(model);
  const partition::RankShard shard = partition::shard_for(shape, mesh, partition::stage_layer_ranges(shape, pp));
  CommGroups groups = make_comm_groups(mesh, {true, 60.0});
  std::vector<int> pp_ranks;
  for (int p = 0; p < pp; ++p) pp_ranks.push_back(mesh.rank_of(p, mesh.tp_rank()));
  const auto pp_group = comm::make_mpi_group(pp_ranks, comm::MpiCommOptions{60.0});
  ShardWeights weights(model, shape, shard, ShardWeightsOptions{});
  StageOptions options;
  options.max_rows = Pipeline::max_rows_for(PipelineOptions{micro_batches}, specs);
  Stage cpu(weights, *groups.tp, options);
  ResidentStage moving(cpu, *pp_group, mesh.pp_rank());
  moving.reserve_rows(options.max_rows);
  StageBackend& stage = resident ? static_cast<StageBackend&>(moving) : cpu;
  Pipeline pipeline(stage, mesh, *groups.world, PipelineOptions{micro_batches});
  Outcome out;
  for (const auto& o : pipeline.run(specs)) out.ids.push_back(o.ids);
  out.received = moving.received;
  out.sent = moving.sent;
  out.downloaded = moving.downloaded;
  return out;
}

std::vector<SequenceSpec> sequences() {
  // Prompts of different lengths, prefilled in chunks of 5 (several items per prompt), decoded together.
  std::vector<SequenceSpec> specs(3);
  const std::vector<std::vector<int>> prompts = {{1, 450, 4996, 17354, 1701, 285, 432, 975, 29879, 310, 278, 17366},
                                                 {1, 9038, 2501, 263, 931},
                                                 {1, 319}};
  for (std::size_t i = 0; i < specs.size(); ++i) {
    specs[i].prompt_ids = prompts[i];
    specs[i].steps = 12;
    specs[i].chunk_tokens = 5;
  }
  return specs;
}

TEST(ResidentPipeline, EveryLayoutGeneratesThePlainPathsTokens) {
  const std::string model = test::model_file("mini-gqa.bin");
  SHARDLINE_REQUIRE_MODEL_FILE(model);
  const int size = world_size();
  const auto specs = sequences();
  for (int pp = 2; pp <= size; ++pp) {
    if (size % pp != 0) continue;
    const int tp = size / pp;
    for (int micro_batches : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "tp " << tp << " pp " << pp << " micro-batches " << micro_batches);
      const Outcome plain = run_layout(model, tp, pp, micro_batches, false, specs);
      const Outcome moved = run_layout(model, tp, pp, micro_batches, true, specs);
      EXPECT_EQ(moved.ids, plain.ids);
      const partition::Mesh mesh(size, world_rank(), tp, pp);
      if (mesh.is_last_stage()) {
        ASSERT_EQ(moved.ids.size(), specs.size());
        for (const auto& ids : moved.ids) EXPECT_EQ(ids.size(), 12u);
        EXPECT_GT(moved.downloaded, 0);
        EXPECT_EQ(moved.sent, 0);
      } else {
        EXPECT_GT(moved.sent, 0);
        EXPECT_EQ(moved.downloaded, 0);
      }
      if (mesh.is_first_stage()) {
        EXPECT_EQ(moved.received, 0);
      } else {
        EXPECT_EQ(moved.received, mesh.is_last_stage() ? moved.downloaded : moved.sent);
      }
    }
  }
}

}  // namespace
}  // namespace shardline::runtime
