#include <gtest/gtest.h>

#include "partition/model_presets.h"
#include "partition/planner.h"

namespace shardline::partition {
namespace {

// 4 hosts x 4 NUMA domains: fast links inside a host, slow Ethernet between hosts.
ClusterSpec four_by_four(double cross_node_alpha_s, double cross_node_bytes_per_s) {
  ClusterSpec c;
  c.nodes = 4;
  c.domains_per_node = 4;
  c.domain.cores = 16;
  c.domain.memory_bytes = 24e9;
  c.domain.core_bandwidth_bytes_per_s = 10e9;
  c.domain.domain_bandwidth_bytes_per_s = 80e9;
  c.domain.core_flops = 50e9;
  c.same_domain = {0.5e-6, 1.0 / 20e9};
  c.cross_domain = {1e-6, 1.0 / 40e9};
  c.cross_node = {cross_node_alpha_s, 1.0 / cross_node_bytes_per_s};
  return c;
}

Workload throughput_of(const std::string& preset, int batch) {
  Workload w;
  w.shape = find_model_preset(preset).shape;
  w.objective = Objective::kThroughput;
  w.batch = batch;
  w.context = 2048;
  return w;
}

// A search over exactly `world` ranks (0: any) returning the `top` best plans.
PlanSearch search(int world, int top) {
  PlanSearch s;
  s.world = world;
  s.top = top;
  return s;
}

TEST(Planner, FastInsideSlowBetweenPutsTpInsideAndPpAcross) {
  // llama2-13b fp32 (52 GB + KV) does not fit one host's 4 x 24 GB, so the plan must span hosts.
  const auto c = four_by_four(200e-6, 0.125e9);  // 1 GbE between hosts
  const auto plans = search_plans(c, throughput_of("llama2-13b", 16), search(16, 3));
  ASSERT_FALSE(plans.empty());
  const auto& best = plans.front();
  EXPECT_TRUE(best.feasible) << best.infeasible_reason;
  EXPECT_LE(best.layout.tp, 4) << "TP groups must stay inside a host";
  EXPECT_GE(best.layout.pp, 4) << "stages go across hosts";
  for (const auto& stage : best.stages) EXPECT_NE(stage.tp_link, LinkClass::kCrossNode);
}

TEST(Planner, FastLinksEverywhereAllowTpAcrossHostsForLatency) {
  // Same cluster but with links between hosts as good as inside: latency prefers the widest TP.
  const auto c = four_by_four(1e-6, 40e9);
  Workload w = throughput_of("llama2-13b", 1);
  w.objective = Objective::kLatency;
  const auto plans = search_plans(c, w, search(0, 1));
  ASSERT_FALSE(plans.empty());
  EXPECT_EQ(plans.front().layout.tp, 10);  // 40 kv heads: the widest tp within 16 slots is 10
  EXPECT_EQ(plans.front().layout.pp, 1);
}

TEST(Planner, ThroughputUsesEnoughMicroBatchesToFillThePipeline) {
  const auto c = four_by_four(50e-6, 1.25e9);
  const auto plans = search_plans(c, throughput_of("llama2-13b", 32), search(16, 1));
  ASSERT_FALSE(plans.empty());
  EXPECT_GE(plans.front().layout.micro_batches, plans.front().layout.pp);
}

TEST(Planner, InfeasibleEverywhereStillRanksByBytesShort) {
  auto c = four_by_four(50e-6, 1.25e9);
  c.nodes = 1;
  c.domain.memory_bytes = 8e9;
  const auto plans = search_plans(c, throughput_of("llama2-70b", 1), search(0, 3));
  ASSERT_FALSE(plans.empty());
  EXPECT_FALSE(plans.front().feasible);
  for (std::size_t i = 1; i < plans.size(); ++i) EXPECT_LE(plans[0].bytes_short, plans[i].bytes_short);
}

TEST(Planner, ExactWorldOnlyReturnsLayoutsOfThatSize) {
  const auto c = four_by_four(50e-6, 1.25e9);
  for (const auto& p : search_plans(c, throughput_of("110m", 4), search(6, 0))) {
    EXPECT_EQ(p.layout.world(), 6);
  }
  EXPECT_TRUE(search_plans(c, throughput_of("1.1b", 4), search(7, 0)).empty() ||
              search_plans(c, throughput_of("1.1b", 4), search(7, 0)).front().layout.pp == 7);
}

// run --plan auto with --layers-per-stage or --chunk-tokens given: the search keeps them, so the plan it
// reports is the layout the run uses (it once reported its own balanced split instead).
TEST(Planner, AFixedSplitAndChunkAreKeptAndFixThePipelineDepth) {
  const auto c = four_by_four(50e-6, 1.25e9);
  PlanSearch fixed = search(6, 0);
  fixed.layers_per_stage = {20, 1, 1};  // 22 layers (the 1.1B shape) in a deliberately lopsided split
  fixed.chunk_tokens = 7;
  const auto plans = search_plans(c, throughput_of("1.1b", 4), fixed);
  ASSERT_FALSE(plans.empty());
  for (const auto& p : plans) {
    EXPECT_EQ(p.layout.pp, 3);
    EXPECT_EQ(p.layout.layers_per_stage, fixed.layers_per_stage);
    EXPECT_EQ(p.layout.chunk_tokens, 7);
    EXPECT_EQ(p.chunk_tokens, 7);  // priced at the fixed chunk, not the one the model would pick
  }
  // The lopsided split is priced as such: with 4 micro-batches in flight its 20-layer stage sets the pace,
  // slower than the split the planner balances itself.
  PlanSearch open = search(6, 0);
  open.pp_only = {3};
  open.micro_batches_only = {4};
  fixed.micro_batches_only = {4};
  fixed.chunk_tokens = 0;
  EXPECT_LT(search_plans(c, throughput_of("1.1b", 4), fixed).front().throughput_tok_s,
            search_plans(c, throughput_of("1.1b", 4), open).front().throughput_tok_s);
}

// Why nothing fits, for rank counts far past any model's layouts and for filters that leave nothing: a
// million ranks without --tp or --pp walked every (tp, pp) pair, 10^12 of them (`plan --np 1000000` ran for
// minutes); this test would run past CTest's timeout if it did again.
TEST(Planner, NoLayoutMessagesSayWhyForAnyRankCountAndFilters) {
  const ModelShape shape = find_model_preset("15m").shape;
  PlanSearch search;
  search.world = 1000000;
  EXPECT_NE(no_layout_message(shape, search, 1000000).find("no valid layout of"), std::string::npos);
  search.tp_only = {4};
  EXPECT_NE(no_layout_message(shape, search, 2).find("no layout with --tp 4 fits 2 ranks: the smallest it allows needs 4"),
            std::string::npos);
  search.tp_only = {2};
  search.pp_only = {2};
  EXPECT_NE(no_layout_message(shape, search, 6).find("no layout with --tp 2 and --pp 2 uses exactly 6 ranks"),
            std::string::npos);
  search.world = 0;  // up to 6 ranks: 2 x 2 fits, so the model's rules are the reason
  EXPECT_NE(no_layout_message(shape, search, 6).find("tp must divide n_kv_heads=6"), std::string::npos);
  search.pp_only = {};
  search.world = 999983;  // a prime: only tp 1 or tp = ranks, and tp is 2
  EXPECT_NE(no_layout_message(shape, search, 999983).find("uses exactly 999983 ranks"), std::string::npos);
}

}  // namespace
}  // namespace shardline::partition
