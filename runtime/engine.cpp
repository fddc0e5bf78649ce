#include "runtime/engine.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "common/error.h"
#include "common/log.h"
#include "common/printable.h"
#include "common/units.h"
#include "kernels/cpu/ops.h"
#include "runtime/checkpoint.h"
#include "runtime/cuda_stage.h"
#include "runtime/progress_report.h"
#include "runtime/text_stream.h"

namespace shardline::runtime {

namespace {

// Positions the attention scratch is sized for at load: runs within it never grow it. 4096 positions of a
// 7B shape's 32 heads take 512 KiB a row, 4 MiB a thread; the model's own seq_len may be 128K or more.
constexpr int kInitialContext = 4096;

ModelFile checked_model(const EngineOptions& options, const partition::Mesh& mesh) {
  ModelFile model = read_model_file(options.model_path);
  if (auto problem = partition::find_layout_problem(model.shape, mesh.tp_size(), mesh.pp_size())) {
    throw ConfigError(fmt::format("layout tp={} pp={} cannot serve '{}': {}", mesh.tp_size(), mesh.pp_size(),
                                  options.model_path, *problem));
  }
  return model;
}

}  // namespace

Engine::Engine(const EngineOptions& options, const partition::Mesh& mesh, comm::Communicator& world,
               comm::Communicator& tp_comm)
    : created_s_(now_s()),
      options_(options),
      mesh_(mesh),
      world_(world),
      loading_(options.load_watch),
      model_(checked_model(options, mesh)),
      tokenizer_(options.tokenizer_path, model_.shape.vocab_size) {
  if (options.chunk_tokens < 0) throw ConfigError("--chunk-tokens must be >= 1");
  if (options.micro_batches < 1) throw ConfigError("--micro-batches must be >= 1");
  kernels::cpu::set_num_threads(options.threads);  // pinning them is the rank's placement's job (rank_binding.h)
  const auto stages = partition::stage_layer_ranges(model_.shape, mesh.pp_size(), options.layers_per_stage);
  const partition::RankShard shard = partition::shard_for(model_.shape, mesh, stages);
  shard_ = shard;
  StageOptions stage_options;
  stage_options.rms_eps = model_.rms_eps;  // a GGUF file may set these three
  stage_options.rope_theta = model_.rope_theta;
  stage_options.rope_freq_divisors = model_.rope_freq_divisors;
  // Scratch for the largest prefill chunk expected; Pipeline::run grows it when a batch needs more rows.
  stage_options.max_rows = std::min(
      options.chunk_tokens > 0 ? options.chunk_tokens : options.chunk_policy.max_chunk_tokens, model_.shape.seq_len);
  // The attention scratch for this many positions; a longer sequence grows it (Stage::reserve_context).
  stage_options.context = std::min(model_.shape.seq_len, kInitialContext);
  if (options.kv_block_tokens < 1) throw ConfigError("--kv-block-tokens must be >= 1");
  if (options.kv_blocks < 0) throw ConfigError("--kv-blocks must be >= 0 (0 = automatic)");
  stage_options.kv_block_tokens = options.kv_block_tokens;
  stage_options.kv_blocks = options.kv_blocks;
  stage_options.ranks_on_host = options.ranks_on_host;
  stage_options.numa_node = options.numa_node;
  kv_dtype_ = resolve_kv_dtype(options.kv_dtype, options.weights_dtype, options.cuda_device >= 0);
  stage_options.kv_dtype = kv_dtype_;
  memory::ArenaOptions arena_options;
  arena_options.numa_node = options.numa_node;
  arena_options.pages = options.arena_pages;
  if (options.cuda_device >= 0) {
    // The CUDA stage uploads its slices straight from the file; the host arena only backs small buffers.
    arena_options.initial_bytes = 1 << 20;
    arena_ = std::make_unique<memory::Arena>(arena_options);
    CudaStageOptions cuda_options;
    cuda_options.stage = stage_options;
    cuda_options.device = options.cuda_device;
    cuda_options.weights_dtype = options.weights_dtype;
    cuda_options.comm_timeout_s = options.comm_timeout_s;
    cuda_options.graphs = options.cuda_graphs;
    cuda_options.load_watch = options.load_watch;  // armed again for the upload, after the NCCL groups
    loading_.release();
    stage_ = make_cuda_stage(options.model_path, model_.shape, shard, mesh, cuda_options);
  } else {
    // One arena for the weights' copies and the stage's scratch, sized for both up front.
    arena_options.initial_bytes = ShardWeights::arena_bytes_needed(model_.shape, shard, options.weights_dtype,
                                                                   options.weights_in_arena) +
                                  Stage::scratch_bytes(model_.shape, shard, stage_options.max_rows, stage_options.context);
    arena_ = std::make_unique<memory::Arena>(arena_options);
    weights_ = std::make_unique<ShardWeights>(
        options.model_path, model_.shape, shard,
        ShardWeightsOptions{options.weights_dtype, arena_.get(), options.numa_node, options.weights_in_arena,
                            options.load_watch});
    loading_.release();  // the Stage's TP buffers and the Pipeline meet the other ranks
    stage_options.arena = arena_.get();
    stage_ = std::make_unique<Stage>(*weights_, tp_comm, stage_options);
  }
  pipeline_ = std::make_unique<Pipeline>(*stage_, mesh, world, PipelineOptions{options.micro_batches, tokenizer_.end_ids()});
  load_s_ = now_s() - created_s_;
}

namespace {

// ConfigError unless a request's steps after its encoded prompt fit the model's context.
void check_fits(const std::vector<int>& ids, int seq_len, const GenerationRequest& request) {
  if (request.steps < 1) throw ConfigError(fmt::format("--steps must be >= 1, got {}", request.steps));
  if (ids.empty()) throw ConfigError("the prompt is empty and this model's vocabulary adds no BOS token: give a prompt");
  const int n_prompt = static_cast<int>(ids.size());
  if (n_prompt > seq_len) {
    throw ConfigError(fmt::format("the prompt is {} tokens but the model's context (seq_len) is {}; shorten it",
                                  n_prompt, seq_len));
  }
  // The last generated token is never fed back, so prompt + steps - 1 positions are used (in long: steps
  // near INT_MAX would wrap the int sum past the check).
  const long positions = static_cast<long>(n_prompt) + request.steps - 1;
  if (positions > seq_len) {
    throw ConfigError(fmt::format("--steps {} after a {}-token prompt needs {} positions but seq_len is {}; use "
                                  "--steps {} or less",
                                  request.steps, n_prompt, positions, seq_len, seq_len - n_prompt + 1));
  }
}

// A request's own problem, named by its place among many ("sequence 2 of 5 (prompt ...)"); as is for one.
ConfigError for_sequence(std::size_t i, const std::vector<GenerationRequest>& requests, const ConfigError& e) {
  if (requests.size() == 1) return e;
  return ConfigError(fmt::format("sequence {} of {} (prompt \"{}\"): {}", i + 1, requests.size(),
                                 printable(requests[i].prompt, 40), e.what()));
}

}  // namespace

std::vector<int> encode_checked(const Tokenizer& tokenizer, int seq_len, const GenerationRequest& request) {
  std::vector<int> ids = tokenizer.encode(request.prompt, /*bos=*/true, /*eos=*/false);
  check_fits(ids, seq_len, request);
  return ids;
}

std::vector<std::vector<int>> encode_prompts(const Tokenizer& tokenizer, const std::vector<GenerationRequest>& requests) {
  std::vector<std::vector<int>> ids(requests.size());
  std::unordered_map<std::string_view, std::size_t> encoded;  // a prompt -> the first request that has it
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto [first, fresh] = encoded.emplace(requests[i].prompt, i);
    try {
      ids[i] = fresh ? tokenizer.encode(requests[i].prompt, /*bos=*/true, /*eos=*/false) : ids[first->second];
    } catch (const ConfigError& e) {  // a byte-level vocabulary's "not UTF-8", say: which of many prompts
      throw for_sequence(i, requests, e);
    }
  }
  return ids;
}

std::vector<std::vector<int>> encode_requests(const Tokenizer& tokenizer, int seq_len,
                                              const std::vector<GenerationRequest>& requests) {
  std::vector<std::vector<int>> ids = encode_prompts(tokenizer, requests);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    try {
      check_fits(ids[i], seq_len, requests[i]);
    } catch (const ConfigError& e) {
      throw for_sequence(i, requests, e);
    }
  }
  return ids;
}

void check_requests(const Tokenizer& tokenizer, int seq_len, const std::vector<GenerationRequest>& requests) {
  encode_requests(tokenizer, seq_len, requests);
}

void Engine::check_kv_capacity(const std::vector<GenerationRequest>& requests) const {
  std::vector<std::vector<int>> ids = encode_requests(tokenizer_, model_.shape.seq_len, requests);
  std::vector<SequenceSpec> specs(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    specs[i].prompt_ids = std::move(ids[i]);
    specs[i].steps = requests[i].steps;
  }
  check_kv_fits(specs);
}

void Engine::check_kv_fits(const std::vector<SequenceSpec>& specs) const {
  const int free_blocks = stage_->kv_pool().free_blocks();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const SequenceSpec& spec = specs[i];
    const int needed = pipeline_->kv_blocks_needed(spec);
    if (needed > free_blocks) {
      const std::string which = specs.size() == 1
                                    ? fmt::format("a {}-position sequence", spec.positions())
                                    : fmt::format("sequence {} of {} ({} positions)", i + 1, specs.size(), spec.positions());
      // The automatic pool is what this rank's share of the host's memory (and the address space ulimit -v
      // leaves) holds: more blocks would be reserved, but the kernel would kill the rank once they filled.
      const std::string remedy =
          options_.kv_blocks == 0
              ? fmt::format("the automatic pool is what this rank's share of the host's usable memory{} (and of the "
                            "address space `ulimit -v` leaves) holds: run shorter sequences, more stages (--pp), or "
                            "give the job more memory (--kv-blocks {} reserves them anyway)",
                            options_.ranks_on_host > 1 ? fmt::format(", shared by {} ranks,", options_.ranks_on_host) : "",
                            needed)
              : fmt::format("pass --kv-blocks {} or more, or run shorter sequences", needed);
      throw ResourceError(fmt::format("the KV cache pool has {} free block{} of {} tokens but {} needs {}; {}",
                                      free_blocks, free_blocks == 1 ? "" : "s", options_.kv_block_tokens, which, needed,
                                      remedy));
    }
  }
}

std::vector<GenerationResult> Engine::generate(const std::vector<GenerationRequest>& requests,
                                               const PieceCallback& on_piece, const LogitsCallback& on_logits) {
  const int n = static_cast<int>(requests.size());
  std::vector<GenerationResult> results(n);
  std::vector<SequenceSpec> specs(n);
  std::vector<std::vector<int>> ids = encode_requests(tokenizer_, model_.shape.seq_len, requests);
  for (int i = 0; i < n; ++i) {
    results[i].prompt = requests[i].prompt;
    results[i].prompt_ids = std::move(ids[i]);
    const int n_prompt = static_cast<int>(results[i].prompt_ids.size());
    results[i].chunk_tokens = options_.chunk_tokens > 0 ? std::min(options_.chunk_tokens, n_prompt)
                                                         : options_.chunk_policy.chunk_for(n_prompt);
    specs[i] = {results[i].prompt_ids, requests[i].steps, requests[i].sampler, results[i].chunk_tokens};
  }
  check_kv_fits(specs);
  long needed = 0;
  for (const SequenceSpec& spec : specs) needed += pipeline_->kv_blocks_needed(spec);
  kv_queued_ = needed > stage_->kv_pool().free_blocks();
  if (kv_queued_ && is_output_rank()) {
    log::warn("the KV pool ({} free blocks of {} tokens) cannot hold all {} sequences at their longest ({} blocks): "
             "the others wait and start as running ones finish (--kv-blocks raises the pool)",
             stage_->kv_pool().free_blocks(), options_.kv_block_tokens, n, needed);
  }
  const bool output = is_output_rank();
  const bool stream = output && on_piece && n == 1;
  std::vector<int> prev(n);
  std::vector<TextStream> texts(n, TextStream(tokenizer_));  // byte tokens joined into UTF-8 characters
  auto emit = [&](int i, int token, bool generated) {
    const std::string_view piece = texts[i].add(tokenizer_.decode(prev[i], token));
    prev[i] = token;
    if (piece.empty()) return;
    results[i].text += piece;
    if (generated) results[i].generated_text += piece;
    if (stream) on_piece(piece);
  };
  if (output) {
    for (int i = 0; i < n; ++i) {
      const auto& ids = results[i].prompt_ids;
      const bool starts_with_bos = ids[0] == tokenizer_.bos_id();  // not text; it sets prev for the first piece
      prev[i] = starts_with_bos ? ids[0] : -1;
      for (std::size_t t = starts_with_bos ? 1 : 0; t < ids.size(); ++t) emit(i, ids[t], false);
      texts[i].end_prompt();
    }
  }
  std::vector<int> steps_done(n, 0);
  long planned_tokens = 0;
  for (const SequenceSpec& spec : specs) planned_tokens += spec.steps;
  ProgressReport progress(n, planned_tokens);
  TokenCallback on_token;
  if (output) {
    on_token = [&](int i, int token, const float* logits) {
      if (on_logits) on_logits(i, steps_done[i], logits);
      ++steps_done[i];
      emit(i, token, true);
      progress.token();
    };
  }
  // on_logits is the caller's on every rank (run: --dump-logits), so every TP rank agrees on whether
  // greedy rows may skip the logits gather.
  std::vector<SequenceOutput> outputs = pipeline_->run(specs, on_token, static_cast<bool>(on_logits));
  if (!output) return {};
  for (int i = 0; i < n; ++i) {
    results[i].ids = outputs[i].ids;
    auto& s = results[i].stats;
    s.prompt_tokens = static_cast<int>(results[i].prompt_ids.size());
    s.generated_tokens = static_cast<int>(outputs[i].ids.size());
    s.prefill_s = outputs[i].first_token_s;
    s.decode_s = outputs[i].done_s - outputs[i].first_token_s;
  }
  return results;
}

std::vector<SequenceOutput> Engine::generate_ids(const std::vector<SequenceSpec>& sequences) {
  return pipeline_->run(sequences, {}, /*callback_reads_logits=*/false);
}

GenerationResult Engine::generate(const GenerationRequest& request, const PieceCallback& on_piece) {
  auto results = generate(std::vector<GenerationRequest>{request}, on_piece);
  return results.empty() ? GenerationResult{} : results[0];
}

}  // namespace shardline::runtime
