// The planner: enumerates layouts (tp over the divisors of the kv heads, pp, a cost-balanced layer split,
// micro-batches, chunk size), predicts each with the cost model, and ranks them for the objective.
#pragma once

#include <vector>

#include "partition/cost_model.h"

namespace shardline::partition {

struct PlanSearch {
  int world = 0;          // 0: any number of ranks up to the cluster's slots; else exactly this many
  int top = 5;            // how many plans to return
  std::vector<int> tp_only;  // restrict tp to these values (empty = all valid)
  std::vector<int> pp_only;  // restrict pp to these values (empty = all valid)
  std::vector<int> micro_batches_only;  // restrict m (empty = 1 for latency, powers of two up to batch)
  std::vector<int> layers_per_stage;    // a split fixed by the caller: only pp = its length (empty = balanced)
  int chunk_tokens = 0;                 // a prefill chunk fixed by the caller (0 = the cost model's best)
};

// Best plans first: feasible before infeasible; then by the objective (latency: request latency, lowest
// first; throughput: tokens/s, highest first); ties go to fewer ranks. Never empty when the model has any
// valid layout within the slots (infeasible ones included, so callers can say how far off they are).
std::vector<PlanEstimate> search_plans(const ClusterSpec& cluster, const Workload& workload, const PlanSearch& search);

// Why search_plans() found nothing for `ranks` ranks: the model's limits, and the filters the search set
// (they, not the model, are often what leaves nothing). `plan` and `run --plan auto` both say it.
std::string no_layout_message(const ModelShape& shape, const PlanSearch& search, int ranks);

}  // namespace shardline::partition
