#include "partition/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "common/error.h"
#include "common/units.h"
#include "partition/shard.h"

namespace shardline::partition {

double ring_allreduce_s(int p, double bytes, const LinkCost& link) {
  if (p <= 1) return 0.0;
  return 2.0 * (p - 1) * link.alpha_s + 2.0 * (p - 1) / p * bytes * link.beta_s_per_byte;
}

double ring_allgather_s(int p, double bytes, const LinkCost& link) {
  if (p <= 1) return 0.0;
  return (p - 1) * link.alpha_s + static_cast<double>(p - 1) / p * bytes * link.beta_s_per_byte;
}

// In double: m + p - 1 overflowed int for a --batch of 2^31 - 1 micro-batches, and the bubble read negative.
double pipeline_bubble(int p, int m) { return static_cast<double>(p - 1) / (static_cast<double>(m) + p - 1); }

double design_split_granularity(double work_s, double alpha_s, int p) {
  if (p <= 1 || alpha_s <= 0) return std::numeric_limits<double>::infinity();
  return std::sqrt(work_s * std::log2(static_cast<double>(p)) / (alpha_s * p));
}

double split_time_s(double work_s, double alpha_s, int p, double s) {
  return work_s / (s * p) + alpha_s * s * std::log2(static_cast<double>(p));
}

double split_time_argmin(double work_s, double alpha_s, int p) {
  if (p <= 1 || alpha_s <= 0) return std::numeric_limits<double>::infinity();
  return std::sqrt(work_s / (alpha_s * p * std::log2(static_cast<double>(p))));
}

const char* objective_name(Objective objective) {
  return objective == Objective::kLatency ? "latency" : "throughput";
}

namespace {

constexpr double kFloat = 4.0;            // activations and messages are fp32
constexpr double kGreedyPickBytes = 8.0;  // a row's best (float value, int index) from each TP rank
constexpr double kSmallOpsPerLayer = 6;   // rmsnorm x2, rope, swiglu, residual adds: overhead only
constexpr double kCacheSpill = 4;         // streams this many times the cache's size run at memory's rate
constexpr double kPassesPerLayer = 2;     // CPU stage: a pass of the threads per half layer (a kernel call's cost)
constexpr double kStepsPerLayer = 7;      // and the barriers between the passes' steps
constexpr int kHeaderInts = 3;            // per-row header entries of a stage-to-stage message

// Everything about one layout that does not depend on rows or context.
struct LayoutGeometry {
  const ClusterSpec& cluster;
  const Workload& w;
  const Layout& layout;
  std::vector<Range> stage_layers;

  int q_local() const { return w.shape.n_heads / layout.tp * w.shape.head_size(); }
  int kv_local() const { return w.shape.n_kv_heads / layout.tp * w.shape.head_size(); }
  // The widest rank's hidden slice (split_hidden: in blocks of 128 or 32, so not always an even split).
  int hidden_local() const {
    int widest = 0;
    for (int r = 0; r < layout.tp; ++r) widest = std::max(widest, split_hidden(w.shape, layout.tp, r).size());
    return widest;
  }
  int vocab_local() const { return (w.shape.vocab_size + layout.tp - 1) / layout.tp; }
  int first_rank(int stage) const { return stage * layout.tp; }

  // Only the weight matrices take --weights-dtype's format; the norms and the token embedding stay fp32
  // (mapped from the file or read into the arena as floats).
  static constexpr double kFp32Bytes = 4;
  double layer_weight_bytes() const {
    const double d = w.shape.dim;
    const double matrix_params = 2.0 * q_local() * d + 2.0 * kv_local() * d + 3.0 * hidden_local() * d;
    return matrix_params * w.weight_bytes_per_param + 2 * d * kFp32Bytes;
  }
  double classifier_bytes() const { return static_cast<double>(vocab_local()) * w.shape.dim * w.weight_bytes_per_param; }
  double embedding_bytes() const { return static_cast<double>(w.shape.vocab_size) * w.shape.dim * kFp32Bytes; }
  double stage_weight_bytes(int s) const {
    double bytes = stage_layers[s].size() * layer_weight_bytes();
    if (s == layout.pp - 1) bytes += classifier_bytes();
    if (s == 0) bytes += embedding_bytes();
    return bytes;
  }
  // Weights a decode pass streams (the embedding is only looked up).
  double stage_streamed_bytes(int s) const {
    return stage_layers[s].size() * layer_weight_bytes() + (s == layout.pp - 1 ? classifier_bytes() : 0.0);
  }
  LinkClass tp_link(int s) const {
    return cluster.link_between(first_rank(s), first_rank(s) + layout.tp - 1);
  }
  LinkClass pp_link(int s) const { return cluster.link_between(first_rank(s), first_rank(s + 1)); }
  int ranks_on_domain_of(int rank) const {
    const int domain = cluster.domain_of(rank);
    int count = 0;
    for (int r = 0; r < layout.world(); ++r) count += cluster.domain_of(r) == domain ? 1 : 0;
    return count;
  }
};

struct RankRates {
  double bandwidth = 0;     // bytes/s of weight streaming, for the workload's weight format
  double flops = 0;         // the weight matmuls' FLOP rate, same format, at 64 rows and more
  double small_flops = 0;   // the same at 16 rows and fewer
  double kv_bandwidth = 0;  // bytes/s of KV cache streaming (attention's kernels are fp32's)
  double kv_flops = 0;
  double row_element_s = 0;  // per element of a row's element-wise work, this format's, on one core
  double row_threads = 1;    // a batch's rows go to the rank's threads (times its share of the cores)
};

// What one rank of stage s gets while it works, when `busy` ranks of its domain work at the same time.
RankRates rank_rates(const LayoutGeometry& g, int s, double busy) {
  const DomainSpec& d = g.cluster.domain;
  const int on_domain = g.ranks_on_domain_of(g.first_rank(s));
  const int threads = std::max(1, d.cores / on_domain);  // `run` gives each rank its share of the cores
  busy = std::max(1.0, busy);
  const double core_share = std::min(1.0, d.cores / busy);  // time slicing when ranks outnumber cores
  // Weights the domain's ranks stream in turn: all from the cache's rate up to cache_bytes, memory's from
  // kCacheSpill x cache_bytes on, in between a blend by log(size) (measured on the project VM: 55 GB/s on
  // both cores up to 60 MiB, 47 at 120 MiB, memory's 30 from 240 MiB).
  const double streamed = g.stage_streamed_bytes(s) * on_domain;
  const double from_memory = d.cache_bytes <= 0 || d.cache_bandwidth_bytes_per_s <= 0 ? 1.0
                             : streamed <= d.cache_bytes                             ? 0.0
                             : std::min(1.0, std::log(streamed / d.cache_bytes) / std::log(kCacheSpill));
  auto stream = [&](const FormatRates& f) {
    auto blend = [&](double cache, double memory) { return cache + from_memory * (memory - cache); };
    const double per_core = blend(f.cache_bandwidth_bytes_per_s, f.core_bandwidth_bytes_per_s);
    const double domain_cap = blend(f.cache_bandwidth_bytes_per_s * d.cores, f.domain_bandwidth_bytes_per_s);
    return std::min(threads * per_core * core_share, domain_cap / busy);
  };
  const FormatRates weights = d.rates(g.w.weight_format), fp32 = d.rates(WeightFormat::kF32);
  RankRates r;
  r.bandwidth = stream(weights);
  r.flops = threads * weights.core_flops * core_share;
  r.small_flops = threads * weights.small_batch_rate() * core_share;
  r.kv_bandwidth = stream(fp32);
  r.kv_flops = threads * (d.attention_flops > 0 ? d.attention_flops : fp32.core_flops) * core_share;
  r.row_element_s = weights.row_element_s;
  r.row_threads = threads * core_share;
  return r;
}

// One op's roofline time: the longer of its memory and compute bounds, plus the share `overlap_loss` of
// the shorter one that the hardware did not hide behind it, each attributed to its own kind.
void roofline(double bytes, double flops, double bandwidth, double flop_rate, double overhead_s, double overlap_loss,
              TimeBreakdown& t) {
  const double memory_s = bytes / bandwidth;
  const double compute_s = flops / flop_rate;
  if (memory_s >= compute_s) {
    t.memory_s += memory_s;
    t.compute_s += overlap_loss * compute_s;
  } else {
    t.compute_s += compute_s;
    t.memory_s += overlap_loss * memory_s;
  }
  t.compute_s += overhead_s;
}

// The weight matmuls' FLOP rate for a pass of `rows` rows: the 16-row rate up to 16, the 64-row one from
// 64, between them by log(rows) (fewer rows reuse each loaded weight less).
double matmul_flops(const RankRates& r, double rows) {
  if (rows <= 16) return r.small_flops;
  if (rows >= 64) return r.flops;
  const double f = std::log(rows / 16) / std::log(4.0);
  return r.small_flops + f * (r.flops - r.small_flops);
}

// The fixed costs of one layer's ops. With a step cost given (the CPU stage: each half layer one pass of the
// rank's threads, its steps separated by barriers) two kernel calls and the barriers; without (every op its
// own kernel call, as the CUDA stage launches them) one call per matrix, attention and small op.
double layer_overhead_s(const DomainSpec& d) {
  if (d.step_overhead_s >= 0) return kPassesPerLayer * d.op_overhead_s + kStepsPerLayer * d.step_overhead_s;
  return (7 + 1 + kSmallOpsPerLayer) * d.op_overhead_s;
}

// One pass of `rows` rows through stage s (logits for `logit_rows` of them), attention over `context`;
// `sequence_rows` of them at a time are one sequence's (a prefill chunk's: its rows can share their reads of
// the cache; 1 for a decode batch).
TimeBreakdown stage_pass(const LayoutGeometry& g, int s, double rows, double logit_rows, double context,
                         const RankRates& rates, double sequence_rows = 1) {
  const Workload& w = g.w;
  const double d = w.shape.dim, wb = w.weight_bytes_per_param, overhead = g.cluster.domain.op_overhead_s;
  const double q = g.q_local(), kv = g.kv_local(), h = g.hidden_local();
  const LinkCost& tp_link = g.cluster.link(g.tp_link(s));
  TimeBreakdown layer;
  const double mats[][2] = {{q, d}, {kv, d}, {kv, d}, {d, q}, {h, d}, {h, d}, {d, h}};
  const double flop_rate = matmul_flops(rates, rows);
  const double loss = g.cluster.domain.overlap_loss;
  for (const auto& m : mats) {
    roofline(m[0] * m[1] * wb, 2.0 * rows * m[0] * m[1], rates.bandwidth, flop_rate, 0, loss, layer);
  }
  // Attention reads each cached key and value row once per kv head group and does 4 FLOPs per element; a
  // sequence's rows on one thread read the cache once for up to attention_rows of them (the CPU's prefill
  // kernel: runtime/stage.cpp), the rest from the core's caches.
  const double sharing = std::clamp(std::floor(sequence_rows / std::max(1.0, rates.row_threads)), 1.0,
                                    static_cast<double>(std::max(1, g.cluster.domain.attention_rows)));
  roofline(rows * context * 2.0 * kv * w.kv_bytes_per_value / sharing, 4.0 * rows * context * q, rates.kv_bandwidth,
           rates.kv_flops, 0, loss, layer);
  layer.compute_s += layer_overhead_s(g.cluster.domain);
  // Row-wise work: the two residual adds, RMSNorms and rows prepared for the matrices (2 dim), q and k
  // rotated, k and v written to the cache (q + 3 kv), the attention output and the hidden row prepared
  // and the SwiGLU gate (q + 2 hidden); and each head's fixed attention cost.
  const double row_elements = 2 * d + 2 * q + 3 * kv + 2 * h;
  const double heads = q / w.shape.head_size();
  const double per_row_s = row_elements * rates.row_element_s + heads * g.cluster.domain.attention_head_s;
  layer.compute_s += rows * per_row_s / rates.row_threads;
  // TP: the sum of wo's and of w2's segment products passed from rank to rank in segment order and then
  // broadcast from the last (runtime/stage.h), in blocks of kSegmentSumRows rows; each rank adds its own
  // products (S / tp of rows x dim) onto it.
  if (g.layout.tp > 1) {
    const int p = g.layout.tp;
    const double bytes = rows * d * kFloat;
    const double hops = (p - 1) + std::ceil(std::log2(static_cast<double>(p)));  // the chain, then a binomial broadcast
    const double chain_s = std::ceil(rows / kSegmentSumRows) * hops * tp_link.alpha_s + hops * bytes * tp_link.beta_s_per_byte;
    layer.comm_s += 2 * chain_s;
    const double local_segments = static_cast<double>(n_reduction_segments(w.shape)) / p;
    layer.compute_s += 2 * rows * local_segments * d * rates.row_element_s / rates.row_threads;
  }
  TimeBreakdown total;
  for (int l = 0; l < g.stage_layers[s].size(); ++l) total += layer;
  if (s == g.layout.pp - 1 && logit_rows > 0) {
    roofline(g.vocab_local() * d * wb, 2.0 * logit_rows * g.vocab_local() * d, rates.bandwidth,
             matmul_flops(rates, logit_rows), overhead, loss, total);
    if (w.greedy) {
      total.comm_s += ring_allgather_s(g.layout.tp, logit_rows * g.layout.tp * kGreedyPickBytes, tp_link);
    } else {
      // One all-gather of every row's logit slices (Stage::logits), not one per row.
      total.comm_s += ring_allgather_s(g.layout.tp, logit_rows * w.shape.vocab_size * kFloat, tp_link);
      // The sampler's scan, ~1 ns per logit, a row per thread (the pipeline samples rows on the kernel threads).
      total.compute_s += logit_rows * w.shape.vocab_size * 1e-9 / std::min(rates.row_threads, logit_rows);
    }
  }
  return total;
}

double send_s(const LayoutGeometry& g, int s, double rows, double max_rows) {
  const double bytes = rows * g.w.shape.dim * kFloat + (2 + kHeaderInts * max_rows) * 4.0;
  return g.cluster.link(g.pp_link(s)).time_s(bytes);
}

double reply_s(const LayoutGeometry& g, double max_rows) {
  if (g.layout.pp == 1) return 0.0;
  return g.cluster.link(g.cluster.link_between(g.first_rank(g.layout.pp - 1), 0)).time_s(4.0 * (1 + max_rows));
}

// `items` passes of `rows` rows each through all stages in order (pipelined): the last item leaves after
// the first item's trip plus (items - 1) passes of the slowest stage.
double pipelined_s(const LayoutGeometry& g, double items, double rows, double context, double max_rows,
                   const std::vector<RankRates>& rates, double sequence_rows) {
  double trip = 0, slowest = 0;
  for (int s = 0; s < g.layout.pp; ++s) {
    const double t =
        stage_pass(g, s, rows, s == g.layout.pp - 1 ? 1.0 : 0.0, context, rates[s], sequence_rows).total_s();
    trip += t + (s + 1 < g.layout.pp ? send_s(g, s, rows, max_rows) : 0.0);
    slowest = std::max(slowest, t);
  }
  return trip + (items - 1) * slowest + reply_s(g, max_rows);
}

std::vector<Range> ranges_of(const ModelShape& shape, int pp, const std::vector<int>& counts) {
  return stage_layer_ranges(shape, pp, counts);
}

}  // namespace

std::vector<int> balanced_layer_split(const ClusterSpec& cluster, const Workload& workload, int tp, int pp) {
  const int n = workload.shape.n_layers;
  if (pp == 1) return {n};
  // Stage times are (layers x per-layer time) plus the classifier on the last stage: try every size of
  // the last stage, spread the rest evenly, keep the split whose slowest stage is fastest.
  Layout probe{tp, pp, {}, 1, 1};
  std::vector<int> even;
  for (int s = 0; s < pp; ++s) even.push_back(split_evenly(n, pp, s).size());
  probe.layers_per_stage = even;
  LayoutGeometry g{cluster, workload, probe, ranges_of(workload.shape, pp, even)};
  const int last = pp - 1;
  const RankRates rates = rank_rates(g, last, g.ranks_on_domain_of(g.first_rank(last)));
  const double context = workload.prompt() + workload.generated() / 2.0;
  const double one_layer =
      stage_pass(LayoutGeometry{cluster, workload, probe, {{0, 1}, {0, 1}}}, 0, 1, 0, context, rates).total_s();
  const double classifier =
      stage_pass(LayoutGeometry{cluster, workload, Layout{tp, 1, {1}, 1, 1}, {{0, 0}}}, 0, 1, 1, context, rates).total_s();
  std::vector<int> best = even;
  double best_max = std::numeric_limits<double>::infinity();
  for (int k = 1; k <= n - (pp - 1); ++k) {
    std::vector<int> counts;
    for (int s = 0; s < pp - 1; ++s) counts.push_back(split_evenly(n - k, pp - 1, s).size());
    counts.push_back(k);
    double worst = 0;
    for (int s = 0; s < pp; ++s) worst = std::max(worst, counts[s] * one_layer + (s == last ? classifier : 0.0));
    if (worst < best_max - 1e-12) {
      best_max = worst;
      best = counts;
    }
  }
  return best;
}

PlanEstimate estimate_plan(const ClusterSpec& cluster, const Workload& w, const Layout& requested) {
  if (auto problem = find_layout_problem(w.shape, requested.tp, requested.pp)) throw ConfigError(*problem);
  if (requested.world() > cluster.total_slots()) {
    throw ConfigError(fmt::format("tp={} x pp={} needs {} ranks but the cluster has {} slots", requested.tp,
                                  requested.pp, requested.world(), cluster.total_slots()));
  }
  if (requested.micro_batches < 1) throw ConfigError("micro-batches must be >= 1");
  PlanEstimate plan;
  plan.layout = requested;
  Layout& layout = plan.layout;
  if (layout.layers_per_stage.empty()) layout.layers_per_stage = balanced_layer_split(cluster, w, layout.tp, layout.pp);
  const LayoutGeometry g{cluster, w, layout, ranges_of(w.shape, layout.pp, layout.layers_per_stage)};
  layout.micro_batches = w.micro_batches_for(layout.micro_batches);  // recorded: the plan shows what was priced
  const int pp = layout.pp, m = layout.micro_batches;
  const double rows = std::ceil(static_cast<double>(w.batch) / m);  // decode rows per micro-batch
  const double decode_context = w.prompt() + w.generated() / 2.0;
  // (a double: a batch of millions times a chunk of 512 overflowed an int, and a plan read "mem/rank 0 B")
  const double max_rows = rows * std::max(1, layout.chunk_tokens > 0 ? layout.chunk_tokens : w.max_chunk_tokens);

  // Decode cycle. Bandwidth depends on how many ranks of a domain are busy at once, which depends on the
  // cycle: start from "all busy", then refine once with the utilisations the first pass predicts.
  std::vector<double> busy(pp);
  for (int s = 0; s < pp; ++s) busy[s] = g.ranks_on_domain_of(g.first_rank(s));
  std::vector<RankRates> rates(pp);
  std::vector<TimeBreakdown> pass(pp);
  double cycle = 0;
  for (int iteration = 0; iteration < 2; ++iteration) {
    double trip = 0, slowest = 0;
    for (int s = 0; s < pp; ++s) {
      rates[s] = rank_rates(g, s, busy[s]);
      pass[s] = stage_pass(g, s, rows, rows, decode_context, rates[s]);
      trip += pass[s].total_s() + (s + 1 < pp ? send_s(g, s, rows, max_rows) : 0.0);
      slowest = std::max(slowest, pass[s].total_s());
    }
    trip += reply_s(g, max_rows);
    // A micro-batch's next token needs its previous one back from the last stage (the round trip), and
    // the slowest stage serves all m micro-batches in turn.
    cycle = std::max(trip, m * slowest);
    // Busy ranks of each domain = sum of the utilisations of the ranks placed on it.
    std::vector<double> domain_busy(cluster.nodes * cluster.domains_per_node, 0.0);
    for (int s = 0; s < pp; ++s) {
      const double utilization = std::min(1.0, m * pass[s].total_s() / cycle);
      for (int t = 0; t < layout.tp; ++t) domain_busy[cluster.domain_of(g.first_rank(s) + t)] += utilization;
    }
    for (int s = 0; s < pp; ++s) busy[s] = domain_busy[cluster.domain_of(g.first_rank(s))];
  }
  plan.token_latency_s = cycle;
  plan.throughput_tok_s = w.batch / cycle;
  plan.bubble = pipeline_bubble(pp, m);
  double slowest = 0;
  for (int s = 0; s < pp; ++s) {
    StageEstimate stage;
    stage.layers = g.stage_layers[s];
    stage.decode_item_s = pass[s].total_s();
    stage.utilization = std::min(1.0, m * pass[s].total_s() / cycle);
    stage.bandwidth_bytes_per_s = rates[s].bandwidth;
    stage.tp_link = g.tp_link(s);
    plan.decode += pass[s];
    if (s + 1 < pp) plan.decode.comm_s += send_s(g, s, rows, max_rows);
    slowest = std::max(slowest, pass[s].total_s());
    plan.stages.push_back(stage);
  }
  plan.decode.comm_s += reply_s(g, max_rows);
  plan.decode_efficiency = slowest * m / cycle;

  // Prefill: every sequence's prompt in chunks. Chunk size: the one that minimises TTFT, searched over
  // the sizes that change the chunk count (the refined, per-chunk version of the design's s*).
  const int prompt = w.prompt();
  const int cap = std::max(1, std::min(prompt, w.max_chunk_tokens));
  // The rates while prompts go through: unlike decode's (whose stages wait for each other's tokens), once
  // the chunks fill the pipeline every stage works at once, so ranks that outnumber their domain's cores
  // share them. With fewer items than stages, that share of the stages at a time (at least the stage's own).
  // Worked out once per stage (each count walks the ranks), and the rates of a full pipeline once: the chunk
  // search below asks for them up to 256 times.
  std::vector<int> own_ranks(pp), domain_ranks(pp);  // stage s's ranks on its first rank's domain; all there
  for (int s = 0; s < pp; ++s) {
    for (int t = 0; t < layout.tp; ++t) {
      own_ranks[s] += cluster.domain_of(g.first_rank(s) + t) == cluster.domain_of(g.first_rank(s)) ? 1 : 0;
    }
    domain_ranks[s] = g.ranks_on_domain_of(g.first_rank(s));
  }
  auto rates_when_filled = [&](double filled) {
    std::vector<RankRates> r(pp);
    for (int s = 0; s < pp; ++s) r[s] = rank_rates(g, s, std::max<double>(own_ranks[s], filled * domain_ranks[s]));
    return r;
  };
  const std::vector<RankRates> prefilling = rates_when_filled(1.0);
  auto prefill_rates = [&](double items) { return items >= pp ? prefilling : rates_when_filled(items / pp); };
  auto ttft_for = [&](int chunk) {
    const double chunks = std::ceil(static_cast<double>(prompt) / chunk);
    return pipelined_s(g, chunks * m, rows * chunk, prompt / 2.0, max_rows, prefill_rates(chunks * m), chunk);
  };
  int best_chunk = cap;
  if (layout.chunk_tokens > 0) {
    best_chunk = std::min(layout.chunk_tokens, prompt);  // as the engine takes it: no max_chunk_tokens cap
  } else {
    double best = std::numeric_limits<double>::infinity();
    for (int chunks = 1; chunks <= std::min(prompt, 256); ++chunks) {
      const int chunk = std::min(cap, (prompt + chunks - 1) / chunks);
      const double t = ttft_for(chunk);
      if (t < best - 1e-12) {
        best = t;
        best_chunk = chunk;
      }
    }
  }
  plan.chunk_tokens = best_chunk;
  plan.ttft_s = ttft_for(best_chunk);
  plan.request_latency_s = plan.ttft_s + (w.generated() - 1) * plan.token_latency_s;

  // The chunk rule `run` applies per request: fixed and per-token cost of a pass over the slowest stage,
  // at the rates of a full pipeline.
  double per_pass = 0, per_token = 0;
  for (int s = 0; s < pp; ++s) {
    const double one = stage_pass(g, s, 1, 0, prompt / 2.0, prefilling[s]).total_s();
    const double many = stage_pass(g, s, 65, 0, prompt / 2.0, prefilling[s], 65).total_s();
    if (many > per_pass + 65 * per_token) {
      per_token = (many - one) / 64.0;
      per_pass = std::max(0.0, one - per_token);
    }
  }
  plan.chunk_policy = ChunkPolicy{per_pass, per_token, pp, w.max_chunk_tokens};
  // W: the prompt's work on all p ranks (one rank's share, the first stage's, times p); α: the link between
  // stages, or between the TP ranks of the one stage.
  const double work_s = stage_pass(g, 0, prompt, 0, prompt / 2.0, prefilling[0], prompt).total_s() * layout.world();
  const double alpha_s = pp > 1 ? cluster.link(g.pp_link(0)).alpha_s : cluster.link(g.tp_link(0)).alpha_s;
  plan.design_split_tokens = design_split_granularity(work_s, alpha_s, layout.world());

  // Memory per rank: weight shard + KV of every sequence for the full context + scratch.
  plan.rank_memory_available_bytes =
      cluster.domain.memory_bytes / std::max(1, g.ranks_on_domain_of(0));
  const double scratch_per_row = (3.0 * w.shape.dim + 2.0 * g.q_local() + 2.0 * g.kv_local() + 2.0 * g.hidden_local()) * kFloat;
  for (int s = 0; s < pp; ++s) {
    StageEstimate& stage = plan.stages[s];
    stage.weight_bytes = g.stage_weight_bytes(s);
    stage.kv_bytes = static_cast<double>(w.batch) * w.context * stage.layers.size() * 2.0 * g.kv_local() * w.kv_bytes_per_value;
    stage.rank_memory_bytes = stage.weight_bytes + stage.kv_bytes + max_rows * scratch_per_row + 2.0 * w.shape.vocab_size * kFloat;
    const double available = cluster.domain.memory_bytes / std::max(1, g.ranks_on_domain_of(g.first_rank(s)));
    const double short_bytes = stage.rank_memory_bytes - available;
    if (short_bytes > plan.bytes_short) {
      plan.feasible = false;
      plan.bytes_short = short_bytes;
      plan.infeasible_reason = fmt::format(
          "stage {} ({}) needs {} per rank ({} weights + {} KV + {} activations and logits) but a rank has {}: {} "
          "short",
          s,
          layout.tp == 1 ? fmt::format("rank {}", g.first_rank(s))
                         : fmt::format("ranks {}-{}", g.first_rank(s), g.first_rank(s) + layout.tp - 1),
          format_bytes(stage.rank_memory_bytes), format_bytes(stage.weight_bytes), format_bytes(stage.kv_bytes),
          format_bytes(stage.rank_memory_bytes - stage.weight_bytes - stage.kv_bytes), format_bytes(available),
          format_bytes(short_bytes));
    }
  }
  return plan;
}

}  // namespace shardline::partition
