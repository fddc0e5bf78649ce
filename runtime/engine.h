// The engine: loads this rank's shard and the tokenizer, and generates text for requests.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "partition/mesh.h"
#include "runtime/sampler.h"
#include "runtime/shard_weights.h"
#include "runtime/stage.h"
#include "runtime/tokenizer.h"

namespace shardline::runtime {

struct EngineOptions {
  std::string model_path;
  std::string tokenizer_path;
  int threads = 1;            // kernel threads of this rank
  int chunk_tokens = 64;      // prefill chunk (split granularity)
};

struct GenerationRequest {
  std::string prompt;
  int steps = 256;            // tokens to generate after the prompt
  SamplerOptions sampler;
};

struct GenerationStats {
  int prompt_tokens = 0;
  int generated_tokens = 0;
  double prefill_s = 0.0;
  double decode_s = 0.0;      // time of the generated tokens after the first
};

struct GenerationResult {
  std::string prompt;
  std::vector<int> prompt_ids;  // BOS first
  std::vector<int> ids;         // generated tokens only
  std::string text;             // what plain mode prints: prompt then generated text, llama2.c rules
  std::string generated_text;   // the generated part alone
  GenerationStats stats;
};

// Called with each printable piece as soon as it is known (streaming output).
using PieceCallback = std::function<void(std::string_view)>;

class Engine {
 public:
  // Loads and validates everything before any work: a bad file throws here, on every rank alike.
  Engine(const EngineOptions& options, const partition::Mesh& mesh, comm::Communicator& tp_comm);

  const partition::ModelShape& shape() const { return shape_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const ShardWeights& weights() const { return *weights_; }
  double load_s() const { return load_s_; }

  // Encodes and checks a request against the model (prompt and steps fit seq_len); ConfigError if not.
  std::vector<int> encode_checked(const GenerationRequest& request) const;

  GenerationResult generate(const GenerationRequest& request, const PieceCallback& on_piece = {});

 private:
  EngineOptions options_;
  partition::Mesh mesh_;
  partition::ModelShape shape_;
  Tokenizer tokenizer_;
  std::unique_ptr<ShardWeights> weights_;
  std::unique_ptr<Stage> stage_;
  double load_s_ = 0.0;
};

}  // namespace shardline::runtime
