// The cost model: predicted time and memory of one layout of one model on one cluster, from FLOPs and
// bytes per op (a roofline per op), α-β link costs for the collectives and stage-to-stage sends, and the
// pipeline schedule this runtime actually runs (runtime/pipeline.h). Pure math, unit-tested.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "partition/chunk_policy.h"
#include "partition/cluster.h"
#include "partition/model_shape.h"
#include "partition/shard.h"

namespace shardline::partition {

// ---- Formulas ------------------------------------------------------------------------------------------

// Ring all-reduce of n bytes over p ranks: 2(p-1)α + 2(p-1)/p · n · β.
double ring_allreduce_s(int p, double bytes, const LinkCost& link);
// Ring all-gather producing n bytes on every rank: (p-1)α + (p-1)/p · n · β.
double ring_allgather_s(int p, double bytes, const LinkCost& link);
// Idle fraction of a pipeline of p stages running m micro-batches through once: (p-1)/(m+p-1).
double pipeline_bubble(int p, int m);
// The design's split granularity, as the design states it: s* = sqrt(W·log2 p / (α·p)).
// W: the work to split (seconds), α: cost per split (seconds), p: ranks. Infinite (no split) for p = 1.
// Note: the design derives it from T(s) = W/(s·p) + α·s·log2 p, whose minimiser is in fact
// sqrt(W / (α·p·log2 p)) (split_time_argmin); the two agree only at p = 2. Both are reported; the chunk
// size `run` uses comes from the refined per-chunk model (chunk_policy.h), not from either.
double design_split_granularity(double work_s, double alpha_s, int p);
// T(s) = W/(s·p) + α·s·log2 p, and the s that minimises it.
double split_time_s(double work_s, double alpha_s, int p, double s);
double split_time_argmin(double work_s, double alpha_s, int p);

// ---- Inputs --------------------------------------------------------------------------------------------

enum class Objective { kLatency, kThroughput };
const char* objective_name(Objective objective);

struct Workload {
  ModelShape shape;
  double weight_bytes_per_param = 4.0;  // fp32 4, bf16 2, int8 with group scales ~1.03
  WeightFormat weight_format = WeightFormat::kF32;  // whose rates the weight matmuls run at (DomainSpec::rates)
  double kv_bytes_per_value = 4.0;
  Objective objective = Objective::kLatency;
  int batch = 1;             // sequences decoded together
  int context = 512;         // positions per sequence (prompt + generated); sizes the KV cache
  int prompt_tokens = 0;     // 0 = context / 2
  int max_chunk_tokens = 512;  // largest prefill chunk the runtime takes
  // Greedy decoding (temperature 0, `run`'s default): the last stage's TP ranks exchange each row's best
  // (value, index) of their vocabulary slices, picked inside the classifier's pass, instead of gathering
  // the logits for a sampler to scan.
  bool greedy = true;
  int prompt() const { return prompt_tokens > 0 ? prompt_tokens : std::max(1, context / 2); }
  int generated() const { return std::max(1, context - prompt()); }
  // The micro-batches a layout asking for `requested` runs: each holds at least one sequence, so more than
  // the batch run as the batch (run keeps --micro-batches to its sequences too).
  int micro_batches_for(int requested) const { return std::min(requested, std::max(1, batch)); }
};

struct Layout {
  int tp = 1;
  int pp = 1;
  std::vector<int> layers_per_stage;  // empty = balanced by the cost model
  int micro_batches = 1;
  int chunk_tokens = 0;               // 0 = the cost model's best for the workload's prompt
  int world() const { return tp * pp; }
};

// ---- Outputs -------------------------------------------------------------------------------------------

// Where time goes: the design's three-way (Amdahl) breakdown.
struct TimeBreakdown {
  double compute_s = 0;  // ops limited by FLOP rate (and fixed kernel-call overheads)
  double memory_s = 0;   // ops limited by memory bandwidth (weights, KV cache)
  double comm_s = 0;     // TP collectives and stage-to-stage sends
  double total_s() const { return compute_s + memory_s + comm_s; }
  TimeBreakdown& operator+=(const TimeBreakdown& o) {
    compute_s += o.compute_s;
    memory_s += o.memory_s;
    comm_s += o.comm_s;
    return *this;
  }
};

struct StageEstimate {
  Range layers;
  double decode_item_s = 0;    // one micro-batch of decode rows through this stage
  double utilization = 0;      // busy fraction of the decode cycle
  double rank_memory_bytes = 0;  // each rank of this stage
  double weight_bytes = 0;
  double kv_bytes = 0;
  double bandwidth_bytes_per_s = 0;  // what one rank of this stage gets while decoding
  LinkClass tp_link = LinkClass::kSameDomain;
};

struct PlanEstimate {
  Layout layout;
  std::vector<StageEstimate> stages;
  bool feasible = true;
  std::string infeasible_reason;  // names the stage/ranks and the bytes short
  double bytes_short = 0;
  double rank_memory_available_bytes = 0;
  double ttft_s = 0;              // prefill of the workload's prompt(s)
  double token_latency_s = 0;     // one decode step of a sequence (the pipeline cycle)
  double throughput_tok_s = 0;    // decode tokens per second over the batch
  double request_latency_s = 0;   // ttft + generated tokens x token latency
  double bubble = 0;              // (p-1)/(m+p-1)
  double decode_efficiency = 0;   // busiest stage's utilisation in the decode cycle
  TimeBreakdown decode;           // per decode cycle, summed over stages
  double design_split_tokens = 0;  // s* of the design's formula for this prompt and layout
  int chunk_tokens = 0;            // refined per-chunk optimum for the workload's prompt
  ChunkPolicy chunk_policy;        // the per-request chunk rule `run` applies

  double compute_fraction() const { return decode.total_s() > 0 ? decode.compute_s / decode.total_s() : 0; }
  double memory_fraction() const { return decode.total_s() > 0 ? decode.memory_s / decode.total_s() : 0; }
  double comm_fraction() const { return decode.total_s() > 0 ? decode.comm_s / decode.total_s() : 0; }
};

// Predicts one layout. The layout must be valid for the model (find_layout_problem) and fit the cluster's
// slots; ConfigError otherwise.
PlanEstimate estimate_plan(const ClusterSpec& cluster, const Workload& workload, const Layout& layout);

// Layers per stage balancing the predicted stage times (the last stage also runs the classifier).
std::vector<int> balanced_layer_split(const ClusterSpec& cluster, const Workload& workload, int tp, int pp);

}  // namespace shardline::partition
