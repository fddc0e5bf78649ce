#include "partition/planner.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace shardline::partition {

namespace {

bool allowed(const std::vector<int>& only, int value) {
  return only.empty() || std::find(only.begin(), only.end(), value) != only.end();
}

std::vector<int> micro_batch_candidates(const Workload& w, const PlanSearch& search, int pp) {
  if (!search.micro_batches_only.empty()) return search.micro_batches_only;
  std::vector<int> ms = {1};
  if (w.objective == Objective::kThroughput) {
    for (long m = 2; m <= w.batch; m *= 2) ms.push_back(static_cast<int>(m));  // long: m *= 2 passes INT_MAX
    if (w.batch > 1 && ms.back() != w.batch) ms.push_back(w.batch);
  } else if (w.batch > 1) {
    for (long m = 2; m <= std::min(w.batch, pp); m *= 2) ms.push_back(static_cast<int>(m));
  }
  return ms;
}

bool better(const PlanEstimate& a, const PlanEstimate& b, Objective objective) {
  if (a.feasible != b.feasible) return a.feasible;
  if (!a.feasible) return a.bytes_short < b.bytes_short;
  const double ka = objective == Objective::kLatency ? a.request_latency_s : -a.throughput_tok_s;
  const double kb = objective == Objective::kLatency ? b.request_latency_s : -b.throughput_tok_s;
  // Within 0.5% the simpler plan (fewer ranks, then fewer stages) wins: the model is not that precise.
  if (std::abs(ka - kb) > 0.005 * std::max(std::abs(ka), std::abs(kb))) return ka < kb;
  if (a.layout.world() != b.layout.world()) return a.layout.world() < b.layout.world();
  if (a.layout.pp != b.layout.pp) return a.layout.pp < b.layout.pp;
  return a.layout.micro_batches < b.layout.micro_batches;
}

}  // namespace

std::vector<PlanEstimate> search_plans(const ClusterSpec& cluster, const Workload& w, const PlanSearch& search) {
  std::vector<PlanEstimate> plans;
  const int slots = search.world > 0 ? search.world : cluster.total_slots();
  for (int tp = 1; tp <= std::min(slots, w.shape.n_kv_heads); ++tp) {
    if (!allowed(search.tp_only, tp)) continue;
    for (int pp = 1; pp * tp <= slots && pp <= w.shape.n_layers; ++pp) {
      if (!allowed(search.pp_only, pp)) continue;
      if (!search.layers_per_stage.empty() && static_cast<int>(search.layers_per_stage.size()) != pp) continue;
      if (search.world > 0 && tp * pp != search.world) continue;
      if (find_layout_problem(w.shape, tp, pp)) continue;
      if (tp * pp > cluster.total_slots()) continue;
      for (int m : micro_batch_candidates(w, search, pp)) {
        plans.push_back(estimate_plan(cluster, w, Layout{tp, pp, search.layers_per_stage, m, search.chunk_tokens}));
      }
    }
  }
  std::stable_sort(plans.begin(), plans.end(),
                   [&](const PlanEstimate& a, const PlanEstimate& b) { return better(a, b, w.objective); });
  if (search.top > 0 && static_cast<int>(plans.size()) > search.top) plans.resize(search.top);
  return plans;
}

std::string no_layout_message(const ModelShape& shape, const PlanSearch& search, int ranks) {
  std::vector<std::string> given;
  if (!search.tp_only.empty()) given.push_back(fmt::format("--tp {}", fmt::join(search.tp_only, ",")));
  if (!search.pp_only.empty()) given.push_back(fmt::format("--pp {}", fmt::join(search.pp_only, ",")));
  if (!search.layers_per_stage.empty()) {
    given.push_back(fmt::format("--layers-per-stage's {} stages", search.layers_per_stage.size()));
  }
  const std::string filters = given.empty() ? "" : fmt::format(" with {}", fmt::join(given, " and "));
  // Filters no rank count fits whatever the model: say that, not the model's rules. With an exact rank
  // count (--np, a job's world) tp x pp must equal it; otherwise it must not exceed it.
  // A filter allows its listed values, or every count from 1 to ranks when not given. Membership and the
  // least value instead of every pair: with neither --tp nor --pp, the pairs of a --np of 10^5 took 12 s
  // and of 10^6 minutes.
  auto allows = [&](const std::vector<int>& only, long long v) {
    return only.empty() ? v >= 1 && v <= ranks : std::find(only.begin(), only.end(), v) != only.end();
  };
  auto least = [](const std::vector<int>& only) {
    return only.empty() ? 1LL : static_cast<long long>(*std::min_element(only.begin(), only.end()));
  };
  const std::vector<int> pps = search.layers_per_stage.empty()
                                   ? search.pp_only
                                   : std::vector<int>{static_cast<int>(search.layers_per_stage.size())};
  const long long fewest = least(search.tp_only) * least(pps);  // the fewest ranks a layout needs
  bool any = search.world > 0 ? false : fewest <= ranks;
  if (search.world > 0) {  // tp x pp must equal ranks: some allowed tp whose cofactor pp is allowed
    if (search.tp_only.empty()) {
      for (int tp = 1; tp <= ranks && !any; ++tp) any = ranks % tp == 0 && allows(pps, ranks / tp);
    } else {
      for (int tp : search.tp_only) any = any || (tp >= 1 && ranks % tp == 0 && allows(pps, ranks / tp));
    }
  }
  if (!any && fewest > ranks) {
    return fmt::format("no layout{} fits {} rank{}: the smallest it allows needs {} (tp x pp ranks)", filters, ranks,
                       ranks == 1 ? "" : "s", fewest);
  }
  if (!any) {
    return fmt::format("no layout{} uses exactly {} ranks: tp x pp must equal the rank count", filters, ranks);
  }
  return fmt::format("no valid layout of {} fits {} ranks{} (tp must divide n_kv_heads={}, pp <= n_layers={})",
                     shape.describe(), ranks, filters, shape.n_kv_heads, shape.n_layers);
}

}  // namespace shardline::partition
