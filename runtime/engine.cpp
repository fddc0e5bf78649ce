#include "runtime/engine.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "common/units.h"
#include "kernels/cpu/ops.h"
#include "runtime/checkpoint.h"

namespace shardline::runtime {

namespace {

partition::ModelShape checked_shape(const EngineOptions& options, const partition::Mesh& mesh) {
  partition::ModelShape shape = read_checkpoint_shape(options.model_path);
  if (auto problem = partition::find_layout_problem(shape, mesh.tp_size(), mesh.pp_size())) {
    throw ConfigError(fmt::format("layout tp={} pp={} cannot serve '{}': {}", mesh.tp_size(), mesh.pp_size(),
                                  options.model_path, *problem));
  }
  return shape;
}

}  // namespace

Engine::Engine(const EngineOptions& options, const partition::Mesh& mesh, comm::Communicator& tp_comm)
    : options_(options),
      mesh_(mesh),
      shape_(checked_shape(options, mesh)),
      tokenizer_(options.tokenizer_path, shape_.vocab_size) {
  const double start_s = now_s();
  if (options.chunk_tokens < 1) throw ConfigError("--chunk-tokens must be >= 1");
  kernels::cpu::set_num_threads(options.threads);
  const auto stages = partition::stage_layer_ranges(shape_, mesh.pp_size());
  const partition::RankShard shard = partition::shard_for(shape_, mesh, stages);
  weights_ = std::make_unique<ShardWeights>(options.model_path, shape_, shard);
  StageOptions stage_options;
  stage_options.max_chunk_tokens = std::min(options.chunk_tokens, shape_.seq_len);
  stage_ = std::make_unique<Stage>(*weights_, tp_comm, stage_options);
  load_s_ = now_s() - start_s;
}

std::vector<int> Engine::encode_checked(const GenerationRequest& request) const {
  if (request.steps < 1) throw ConfigError(fmt::format("--steps must be >= 1, got {}", request.steps));
  std::vector<int> ids = tokenizer_.encode(request.prompt, /*bos=*/true, /*eos=*/false);
  const int n_prompt = static_cast<int>(ids.size());
  if (n_prompt > shape_.seq_len) {
    throw ConfigError(fmt::format("the prompt is {} tokens but the model's context (seq_len) is {}; shorten it",
                                  n_prompt, shape_.seq_len));
  }
  // The last generated token is never fed back, so prompt + steps - 1 positions are used.
  if (n_prompt + request.steps - 1 > shape_.seq_len) {
    throw ConfigError(fmt::format("--steps {} after a {}-token prompt needs {} positions but seq_len is {}; use "
                                  "--steps {} or less",
                                  request.steps, n_prompt, n_prompt + request.steps - 1, shape_.seq_len,
                                  shape_.seq_len - n_prompt + 1));
  }
  return ids;
}

GenerationResult Engine::generate(const GenerationRequest& request, const PieceCallback& on_piece) {
  SL_CHECK_MSG(mesh_.pp_size() == 1, "multi-stage generation goes through the pipeline");
  GenerationResult result;
  result.prompt = request.prompt;
  result.prompt_ids = encode_checked(request);
  const std::vector<int>& prompt = result.prompt_ids;
  const int n_prompt = static_cast<int>(prompt.size());
  const int dim = shape_.dim;
  const int chunk = stage_->max_chunk_tokens();

  auto emit = [&](int prev, int token, bool generated) {
    std::string_view piece = tokenizer_.decode(prev, token);
    if (!Tokenizer::is_printable_piece(piece)) return;
    result.text += piece;
    if (generated) result.generated_text += piece;
    if (on_piece) on_piece(piece);
  };
  for (int i = 1; i < n_prompt; ++i) emit(prompt[i - 1], prompt[i], false);

  KvCache cache = stage_->make_kv_cache();
  std::vector<float> x(static_cast<std::size_t>(chunk) * dim);  // (chunk, dim)
  std::vector<float> logits(shape_.vocab_size);                  // (vocab)
  Sampler sampler(shape_.vocab_size, request.sampler);

  // Prefill in chunks; only the last row's logits matter.
  const double prefill_start_s = now_s();
  for (int pos = 0; pos < n_prompt; pos += chunk) {
    const int n = std::min(chunk, n_prompt - pos);
    stage_->embed(prompt.data() + pos, n, x.data());
    stage_->forward(x.data(), n, pos, cache);
    if (pos + n == n_prompt) stage_->logits(x.data() + static_cast<std::size_t>(n - 1) * dim, logits.data());
  }
  result.stats.prefill_s = now_s() - prefill_start_s;

  const double decode_start_s = now_s();
  int prev = prompt.back();
  for (int step = 0; step < request.steps; ++step) {
    const int next = sampler.sample(logits.data());
    if (next == kBosId) break;  // llama2.c: BOS delimits sequences
    result.ids.push_back(next);
    emit(prev, next, true);
    prev = next;
    if (step + 1 == request.steps) break;
    const int pos = n_prompt + step;
    stage_->embed(&next, 1, x.data());
    stage_->forward(x.data(), 1, pos, cache);
    stage_->logits(x.data(), logits.data());
  }
  result.stats.decode_s = now_s() - decode_start_s;
  result.stats.prompt_tokens = n_prompt;
  result.stats.generated_tokens = static_cast<int>(result.ids.size());
  return result;
}

}  // namespace shardline::runtime
