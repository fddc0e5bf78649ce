// `run --plan auto`: the planner applied to the job at hand. Rank 0 measures quickly (the links between
// the job's ranks, this host's compute), plans for exactly the job's ranks, and every rank receives the
// same decision.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "partition/chunk_policy.h"
#include "partition/cluster.h"
#include "partition/model_shape.h"

namespace shardline::runtime {

struct AutoPlanRequest {
  partition::ModelShape shape;
  int sequences = 1;
  int context = 0;        // positions per sequence (longest prompt + steps)
  int prompt_tokens = 1;  // longest prompt
  int tp = 0;             // 0 = choose; else fixed
  int pp = 0;             // 0 = choose; else fixed
  int micro_batches = 0;  // 0 = choose
  double weight_bytes_per_param = 4.0;  // of the dtype the weights are converted to (run --weights-dtype)
  partition::WeightFormat weight_format = partition::WeightFormat::kF32;  // the same dtype, for its rates
  double kv_bytes_per_value = 4.0;      // of the KV cache's dtype (run --kv-dtype, resolved)
  bool greedy = true;                   // every request at temperature 0 and no logits dumped (Workload::greedy)
  std::vector<int> layers_per_stage = {};  // empty = choose; else fixed (its length is pp)
  int chunk_tokens = 0;                    // 0 = choose; else fixed (the prediction prices it)
};

struct AutoPlan {
  int tp = 1;
  int pp = 1;
  std::vector<int> layers_per_stage;
  int micro_batches = 1;
  partition::ChunkPolicy chunk_policy;
  double predicted_tok_s = 0;
  double predicted_token_latency_s = 0;
  bool feasible = true;
};

// Collective over world. ConfigError when no valid layout exists for the job's ranks.
AutoPlan plan_job(comm::Communicator& world, const AutoPlanRequest& request);

std::string describe(const AutoPlan& plan);

}  // namespace shardline::runtime
