#include "runtime/roofline_bench.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "kernels/cpu/bandwidth_probe.h"

namespace shardline::runtime {

namespace {

constexpr int kProbeSweeps = 3;

double best(const std::vector<double>& values) {
  SL_CHECK(!values.empty());
  return *std::max_element(values.begin(), values.end());
}

double median(std::vector<double> values) {
  SL_CHECK(!values.empty());
  std::sort(values.begin(), values.end());
  const std::size_t m = values.size() / 2;
  return values.size() % 2 ? values[m] : 0.5 * (values[m - 1] + values[m]);
}

// What the roofline needs to know about one rank.
struct RankTraffic {
  double weight_bytes = 0;      // streamed per forward pass
  double kv_bytes_per_pos = 0;  // KV bytes one sequence reads per step, per position of context
  double probe_s = 0;           // the probe's time for weight_bytes
};

class Roofline {
 public:
  Roofline(Engine& engine, comm::Communicator& world) : engine_(engine), world_(world) {
    for (const auto& region : engine.weights().streamed_regions()) regions_.push_back(region);
    local_.weight_bytes = 0;
    for (const auto& region : regions_) local_.weight_bytes += static_cast<double>(region.bytes);
    const auto& shard = engine.weights().shard();
    const int hs = engine.shape().head_size();
    local_.kv_bytes_per_pos = 2.0 * engine.weights().n_local_layers() *
                              static_cast<double>(kernels::cpu::kv_row_bytes(
                                  engine.kv_dtype(), static_cast<int>(shard.kv_heads.size()) * hs, hs));
  }

  // Probes every stage in turn (its ranks at once) and shares every rank's traffic with every rank.
  void probe() {
    const auto& mesh = engine_.mesh();
    for (int stage = 0; stage < mesh.pp_size(); ++stage) {
      world_.barrier();
      if (mesh.pp_rank() != stage) continue;
      // The best of a few sweeps: what the memory system can deliver for these bytes. A noisy neighbour
      // can only make a sweep slower, so the roofline errs high and the fractions low.
      local_.probe_s = 1e30;
      for (int sweep = 0; sweep < kProbeSweeps; ++sweep) {
        local_.probe_s = std::min(local_.probe_s, kernels::cpu::time_stream_read(regions_));
      }
    }
    world_.barrier();
    const float mine[3] = {static_cast<float>(local_.weight_bytes), static_cast<float>(local_.kv_bytes_per_pos),
                           static_cast<float>(local_.probe_s)};
    std::vector<float> all(3 * static_cast<std::size_t>(mesh.world_size()));
    world_.all_gather_v(mine, all.data(), std::vector<int>(mesh.world_size(), 3));
    ranks_.resize(mesh.world_size());
    for (int r = 0; r < mesh.world_size(); ++r) ranks_[r] = {all[3 * r], all[3 * r + 1], all[3 * r + 2]};
  }

  // The fastest a forward pass of `rows` sequences at mean context `mean_pos` can be, from the last probe.
  double step_s(int rows, double mean_pos) const {
    const auto& mesh = engine_.mesh();
    double total = 0;
    for (int stage = 0; stage < mesh.pp_size(); ++stage) {
      double slowest = 0;
      for (int tp = 0; tp < mesh.tp_size(); ++tp) {
        const RankTraffic& r = ranks_[mesh.rank_of(stage, tp)];
        const double bytes = r.weight_bytes + rows * mean_pos * r.kv_bytes_per_pos;
        slowest = std::max(slowest, r.probe_s * bytes / r.weight_bytes);
      }
      total += slowest;
    }
    return total;
  }

  double total_weight_bytes() const {
    double total = 0;
    for (const RankTraffic& r : ranks_) total += r.weight_bytes;
    return total;
  }

 private:
  Engine& engine_;
  comm::Communicator& world_;
  std::vector<kernels::cpu::ReadRegion> regions_;
  RankTraffic local_;
  std::vector<RankTraffic> ranks_;
};

// Deterministic prompts: BOS, then ids spread over the vocabulary (never BOS/EOS).
std::vector<int> prompt_ids(int n_tokens, int vocab_size, int sequence) {
  std::vector<int> ids{1};
  std::uint64_t state = 0x9E3779B97F4A7C15ull * (sequence + 1);
  while (static_cast<int>(ids.size()) < n_tokens) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    ids.push_back(3 + static_cast<int>((state >> 33) % static_cast<std::uint64_t>(vocab_size - 3)));
  }
  return ids;
}

std::vector<SequenceSpec> make_specs(int n_sequences, int prompt_tokens, int steps, int vocab_size) {
  std::vector<SequenceSpec> specs(n_sequences);
  for (int i = 0; i < n_sequences; ++i) specs[i] = {prompt_ids(prompt_tokens, vocab_size, i), steps, SamplerOptions{}};
  return specs;
}

// Multiply-adds x 2 of one token at context length ctx: every matrix of every rank, and attention.
double flops_per_token(const partition::ModelShape& s, double ctx, bool with_classifier) {
  const double d = s.dim, h = s.hidden_dim, kv = s.kv_dim();
  const double matrices = s.n_layers * (d * d + 2 * d * kv + d * d + 3 * d * h) + (with_classifier ? s.vocab_size * d : 0);
  const double attention = s.n_layers * 2.0 * d * ctx;  // q·k and the weighted sum of v
  return 2.0 * (matrices + attention);
}

}  // namespace

RooflineBenchResult run_roofline_bench(Engine& engine, comm::Communicator& world, const RooflineBenchOptions& options) {
  const partition::ModelShape& shape = engine.shape();
  SL_CHECK(options.repeats >= 1 && options.decode_steps >= 2 && options.decode_prompt_tokens >= 1);
  SL_CHECK(options.decode_prompt_tokens + options.decode_steps - 1 <= shape.seq_len);
  SL_CHECK(options.prefill_tokens >= 1 && options.prefill_tokens <= shape.seq_len);
  Roofline roofline(engine, world);
  RooflineBenchResult result;
  auto summary = [&](const std::vector<double>& values) {
    return options.statistic == RooflineBenchOptions::Statistic::kBest ? best(values) : median(values);
  };

  // Warm-up: threads started, KV pages and code faulted in.
  const int largest = *std::max_element(options.batches.begin(), options.batches.end());
  engine.generate_ids(make_specs(largest, options.decode_prompt_tokens, 2, shape.vocab_size));

  std::vector<double> read_gbps;  // every probe of the run
  auto probe = [&] {
    roofline.probe();
    read_gbps.push_back(roofline.total_weight_bytes() / roofline.step_s(0, 0) / 1e9);
  };
  // The batch sizes take turns (b=1, b=4, b=16, b=1, ...) rather than each running its repeats in a row, so
  // that the ratios between them compare numbers taken over the same stretch of time: on a shared machine a
  // neighbour's burst then slows every batch size's runs a little instead of one batch size's a lot.
  struct Samples {
    std::vector<double> tok_s, roof_tok_s, gflops;
  };
  std::vector<Samples> samples(options.batches.size());
  for (int rep = 0; rep < options.repeats; ++rep) {
    for (std::size_t i = 0; i < options.batches.size(); ++i) {
      const int batch = options.batches[i];
      probe();
      const auto outputs =
          engine.generate_ids(make_specs(batch, options.decode_prompt_tokens, options.decode_steps, shape.vocab_size));
      if (!engine.is_output_rank()) continue;
      // The batch decodes in lockstep once the last sequence has its first token.
      double start_s = 0, end_s = 0;
      long tokens = 0;
      for (const SequenceOutput& o : outputs) {
        start_s = std::max(start_s, o.first_token_s);
        end_s = std::max(end_s, o.done_s);
        tokens += static_cast<long>(o.ids.size()) - 1;
      }
      const double mean_pos = options.decode_prompt_tokens + 0.5 * (options.decode_steps - 1);
      Samples& s = samples[i];
      s.tok_s.push_back(tokens / (end_s - start_s));
      s.roof_tok_s.push_back(batch / roofline.step_s(batch, mean_pos));
      s.gflops.push_back(s.tok_s.back() * flops_per_token(shape, mean_pos, true) / 1e9);
    }
  }
  if (engine.is_output_rank()) {
    for (std::size_t i = 0; i < options.batches.size(); ++i) {
      const Samples& s = samples[i];
      result.decode.push_back({options.batches[i], summary(s.tok_s), summary(s.roof_tok_s), summary(s.gflops)});
    }
  }

  std::vector<double> tok_s, roof_tok_s, gflops;
  const int chunks = (options.prefill_tokens + engine.options().chunk_tokens - 1) / engine.options().chunk_tokens;
  for (int rep = 0; rep < options.repeats; ++rep) {
    probe();
    const auto outputs = engine.generate_ids(make_specs(1, options.prefill_tokens, 1, shape.vocab_size));
    if (!engine.is_output_rank()) continue;
    const double p = options.prefill_tokens;
    tok_s.push_back(p / outputs[0].first_token_s);
    roof_tok_s.push_back(p / (chunks * roofline.step_s(0, 0)));
    gflops.push_back(tok_s.back() * flops_per_token(shape, 0.5 * p, false) / 1e9);
  }
  result.weight_bytes = static_cast<std::uint64_t>(roofline.total_weight_bytes());
  result.read_gbps = summary(read_gbps);
  if (engine.is_output_rank()) result.prefill = {options.prefill_tokens, summary(tok_s), summary(roof_tok_s), summary(gflops)};
  return result;
}

}  // namespace shardline::runtime
