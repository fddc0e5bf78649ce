// The engine: loads this rank's shard and the tokenizer, and generates text for requests through the
// pipeline. Every rank of the job builds one and calls generate() with the same requests.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "memory/arena.h"
#include "partition/chunk_policy.h"
#include "partition/mesh.h"
#include "runtime/checkpoint.h"
#include "runtime/load_watch.h"
#include "runtime/pipeline.h"
#include "runtime/sampler.h"
#include "runtime/shard_weights.h"
#include "runtime/stage.h"
#include "runtime/stage_backend.h"
#include "runtime/tokenizer.h"

namespace shardline::runtime {

struct EngineOptions {
  std::string model_path;
  std::string tokenizer_path;
  int threads = 1;            // kernel threads of this rank
  int chunk_tokens = 0;       // fixed prefill chunk (split granularity); 0 = chunk_policy per prompt
  partition::ChunkPolicy chunk_policy;  // the planner's per-request rule (one stage: no split)
  int micro_batches = 1;      // sequences are spread over this many micro-batches in flight
  std::vector<int> layers_per_stage;  // explicit layer split; empty = even
  // Memory placement (issue #4): the rank's node, its arena's page tier, its KV pool.
  int numa_node = -1;                 // bind the arena, KV pool and weight mappings here; -1: unbound
  memory::PagePolicy arena_pages = memory::PagePolicy::kAuto;
  bool weights_in_arena = false;      // copy every weight slice into the arena instead of mapping the file
  int kv_block_tokens = 16;           // positions per KV cache block
  int kv_blocks = 0;                  // KV pool blocks per rank; 0: default_kv_blocks (64 contexts within memory)
  int ranks_on_host = 1;              // ranks sharing this host's memory (the automatic KV pool's share of it)
  kernels::cpu::WeightDtype weights_dtype = kernels::cpu::WeightDtype::kF32;  // converted to at load
  // The KV cache's values (run --kv-dtype); unset: resolve_kv_dtype's default for the weights and backend.
  std::optional<kernels::cpu::KvDtype> kv_dtype;
  // The backend (runtime/backend_choice.h): the CPU Stage, or the CUDA stage on this device.
  int cuda_device = -1;               // >= 0: run the stage on this CUDA device
  double comm_timeout_s = 120.0;      // the CUDA stage's NCCL TP group waits this long for a peer
  bool cuda_graphs = true;            // the CUDA stage captures decode steps in CUDA graphs (cuda_stage.h)
  // Armed while the engine reads this rank's header, tokenizer and weights (runtime/load_watch.h), not in
  // the collectives between; the caller's, outliving the construction. Null: no watch.
  LoadWatch* load_watch = nullptr;
};

struct GenerationRequest {
  std::string prompt;
  int steps = 256;            // tokens to generate after the prompt
  SamplerOptions sampler;
};

struct GenerationStats {
  int prompt_tokens = 0;
  int generated_tokens = 0;
  double prefill_s = 0.0;     // start of the batch to this sequence's first token (TTFT)
  double decode_s = 0.0;      // first token to last token
};

struct GenerationResult {
  std::string prompt;
  std::vector<int> prompt_ids;  // BOS first
  std::vector<int> ids;         // generated tokens only
  int chunk_tokens = 0;         // the prefill chunk this request was split into
  std::string text;             // what plain mode prints: prompt then generated text, llama2.c rules
  std::string generated_text;   // the generated part alone
  GenerationStats stats;
};

// Called on the output rank with each printable piece as soon as it is known (single-sequence streaming).
using PieceCallback = std::function<void(std::string_view)>;
// Called on the output rank with each step's logits: (sequence, step, logits[vocab]).
using LogitsCallback = std::function<void(int sequence, int step, const float* logits)>;

// Encodes request's prompt and checks that it and its steps fit seq_len positions; ConfigError if not.
// The CLI runs it on every request before any rank maps weights; the engine runs it again on what it gets.
std::vector<int> encode_checked(const Tokenizer& tokenizer, int seq_len, const GenerationRequest& request);
// Each request's prompt encoded with BOS, each distinct prompt once (run --batch repeats one prompt for every
// sequence); nothing checked.
std::vector<std::vector<int>> encode_prompts(const Tokenizer& tokenizer, const std::vector<GenerationRequest>& requests);
// encode_prompts() and encode_checked()'s checks for each request; an error names the sequence (1-based) and
// the start of its prompt.
std::vector<std::vector<int>> encode_requests(const Tokenizer& tokenizer, int seq_len,
                                              const std::vector<GenerationRequest>& requests);
// encode_requests() for its errors alone.
void check_requests(const Tokenizer& tokenizer, int seq_len, const std::vector<GenerationRequest>& requests);

class Engine {
 public:
  // Loads and validates everything before any work: a bad file or layout throws here, on every rank alike.
  // world: all ranks (stages talk through it); tp_comm: this rank's TP group. Both outlive the Engine.
  Engine(const EngineOptions& options, const partition::Mesh& mesh, comm::Communicator& world,
         comm::Communicator& tp_comm);

  const partition::ModelShape& shape() const { return model_.shape; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  // The CPU stage's host weights; the CUDA stage uploads its own from the file, so has_host_weights() is
  // false there.
  bool has_host_weights() const { return weights_ != nullptr; }
  const ShardWeights& weights() const { return *weights_; }
  // "cpu" or the CUDA device.
  std::string backend() const { return stage_->describe(); }
  kernels::cpu::KvDtype kv_dtype() const { return kv_dtype_; }
  const partition::Mesh& mesh() const { return mesh_; }
  const partition::RankShard& shard() const { return shard_; }
  const EngineOptions& options() const { return options_; }
  double load_s() const { return load_s_; }
  // Whether the last generate() had more sequences than its KV pool holds at once (the others waited).
  bool kv_queued() const { return kv_queued_; }
  const PipelineStats& pipeline_stats() const { return pipeline_->stats(); }

  // The rank that samples and prints: tp_rank 0 of the last stage.
  bool is_output_rank() const { return mesh_.is_last_stage() && mesh_.tp_rank() == 0; }

  // Checks that the KV pool can hold each request alone at its longest; ResourceError if one cannot.
  // Every rank computes the same answer, so the check belongs before generation starts.
  void check_kv_capacity(const std::vector<GenerationRequest>& requests) const;

  const memory::Arena& arena() const { return *arena_; }
  const memory::KvBlockPool& kv_pool() const { return stage_->kv_pool(); }

  // Generates every request, all in flight together as far as the KV pool holds them (the rest wait for
  // blocks: see KV admission in pipeline.h). Results on the output rank, empty elsewhere. on_piece may be
  // set on the output rank alone; on_logits must be set on every rank or on none (it is called on the
  // output rank only): without it, TP ranks pick greedy tokens without gathering the logits, and the
  // ranks of a TP group must agree on which way they go.
  std::vector<GenerationResult> generate(const std::vector<GenerationRequest>& requests,
                                         const PieceCallback& on_piece = {}, const LogitsCallback& on_logits = {});
  // Token sequences straight through the pipeline (benchmarks, accuracy checks): every rank calls it with
  // the same specs; outputs on the last stage, empty elsewhere.
  std::vector<SequenceOutput> generate_ids(const std::vector<SequenceSpec>& sequences);

  // One request; the result is meaningful on the output rank only.
  GenerationResult generate(const GenerationRequest& request, const PieceCallback& on_piece = {});

 private:
  // check_kv_capacity on sequences already encoded.
  void check_kv_fits(const std::vector<SequenceSpec>& specs) const;
  double created_s_;  // first member: load_s() covers everything the constructor does
  EngineOptions options_;
  partition::Mesh mesh_;
  comm::Communicator& world_;
  LoadWatch::Armed loading_;  // from here to the first collective: the header, tokenizer and weights
  ModelFile model_;  // read once: its shape, and the RMSNorm epsilon and RoPE base a GGUF file may set
  partition::RankShard shard_;
  kernels::cpu::KvDtype kv_dtype_ = kernels::cpu::KvDtype::kF32;
  Tokenizer tokenizer_;
  std::unique_ptr<memory::Arena> arena_;  // before the weights and stage, which point into it
  std::unique_ptr<ShardWeights> weights_;
  std::unique_ptr<StageBackend> stage_;
  std::unique_ptr<Pipeline> pipeline_;
  double load_s_ = 0.0;
  bool kv_queued_ = false;
};

}  // namespace shardline::runtime
