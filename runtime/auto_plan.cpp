#include "runtime/auto_plan.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/link_probe.h"
#include "common/error.h"
#include "partition/planner.h"
#include "runtime/machine_probe.h"

namespace shardline::runtime {

namespace {

// The decision as plain numbers, for the broadcast from rank 0.
struct WirePlan {
  int ok;
  int tp, pp, micro_batches, n_layers_listed;
  int layers[256];
  double per_pass_s, per_token_s;
  int max_chunk_tokens;
  double tok_s, token_latency_s;
  int feasible;
  char error[512];
};

}  // namespace

AutoPlan plan_job(comm::Communicator& world, const AutoPlanRequest& request) {
  const comm::LinkProbeResult links = comm::probe_links(world, {.quick = true, .max_bytes = 256 * 1024});
  WirePlan wire{};
  if (world.rank() == 0) {
    try {
      MachineProbeOptions probe{.quick = true, .cores = 0, .max_buffer_bytes = 64 << 20};
      probe.only_for(request.weight_format);
      partition::ClusterSpec cluster = probe_this_machine(probe);
      const int per_host = (world.size() + links.n_hosts - 1) / links.n_hosts;
      cluster.nodes = links.n_hosts;
      cluster.domains_per_node = 1;
      cluster.ranks_per_domain = per_host;
      if (links.same_host.measured) {
        cluster.same_domain = {links.same_host.alpha_s, links.same_host.beta_s_per_byte};
        cluster.cross_domain = cluster.same_domain;
      }
      if (links.cross_host.measured) cluster.cross_node = {links.cross_host.alpha_s, links.cross_host.beta_s_per_byte};
      partition::Workload w;
      w.shape = request.shape;
      w.weight_bytes_per_param = request.weight_bytes_per_param;
      w.weight_format = request.weight_format;
      w.kv_bytes_per_value = request.kv_bytes_per_value;
      w.greedy = request.greedy;
      w.batch = std::max(1, request.sequences);
      w.context = std::max(2, request.context);
      w.prompt_tokens = std::clamp(request.prompt_tokens, 1, w.context - 1);
      w.objective = w.batch > 1 ? partition::Objective::kThroughput : partition::Objective::kLatency;
      partition::PlanSearch search;
      search.world = world.size();
      search.top = 1;
      if (request.tp > 0) search.tp_only = {request.tp};
      if (request.pp > 0) search.pp_only = {request.pp};
      if (request.micro_batches > 0) search.micro_batches_only = {request.micro_batches};
      search.layers_per_stage = request.layers_per_stage;
      search.chunk_tokens = request.chunk_tokens;
      const auto plans = partition::search_plans(cluster, w, search);
      if (plans.empty()) {
        throw ConfigError(partition::no_layout_message(request.shape, search, world.size()) +
                          "; launch with another -np");
      }
      const auto& best = plans.front();
      SL_CHECK(best.layout.layers_per_stage.size() <= 256);
      wire.tp = best.layout.tp;
      wire.pp = best.layout.pp;
      wire.micro_batches = best.layout.micro_batches;
      wire.n_layers_listed = static_cast<int>(best.layout.layers_per_stage.size());
      std::copy(best.layout.layers_per_stage.begin(), best.layout.layers_per_stage.end(), wire.layers);
      wire.per_pass_s = best.chunk_policy.per_pass_s;
      wire.per_token_s = best.chunk_policy.per_token_s;
      wire.max_chunk_tokens = best.chunk_policy.max_chunk_tokens;
      wire.tok_s = best.throughput_tok_s;
      wire.token_latency_s = best.token_latency_s;
      wire.feasible = best.feasible ? 1 : 0;
      wire.ok = 1;
    } catch (const Error& e) {
      wire.ok = 0;
      std::snprintf(wire.error, sizeof(wire.error), "%s", e.what());
    }
  }
  world.idle_barrier();  // the others poll every few ms while rank 0 measures (Communicator::idle_barrier)
  world.broadcast(&wire, sizeof(wire), 0);
  if (!wire.ok) throw ConfigError(wire.error);
  AutoPlan plan;
  plan.tp = wire.tp;
  plan.pp = wire.pp;
  plan.micro_batches = wire.micro_batches;
  plan.layers_per_stage.assign(wire.layers, wire.layers + wire.n_layers_listed);
  plan.chunk_policy = {wire.per_pass_s, wire.per_token_s, wire.pp, wire.max_chunk_tokens};
  plan.predicted_tok_s = wire.tok_s;
  plan.predicted_token_latency_s = wire.token_latency_s;
  plan.feasible = wire.feasible != 0;
  return plan;
}

std::string describe(const AutoPlan& plan) {
  return fmt::format("tp={} pp={} layers/stage {} micro-batches {}; predicted {:.1f} tok/s ({:.1f} ms per token)",
                     plan.tp, plan.pp, fmt::join(plan.layers_per_stage, ","), plan.micro_batches, plan.predicted_tok_s,
                     plan.predicted_token_latency_s * 1e3);
}

}  // namespace shardline::runtime
