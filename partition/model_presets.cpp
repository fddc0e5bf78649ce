#include "partition/model_presets.h"

#include <fmt/format.h>

#include "common/error.h"

namespace shardline::partition {

namespace {
ModelShape make(int dim, int hidden, int layers, int heads, int kv_heads, int vocab, int seq, bool shared) {
  ModelShape s;
  s.dim = dim;
  s.hidden_dim = hidden;
  s.n_layers = layers;
  s.n_heads = heads;
  s.n_kv_heads = kv_heads;
  s.vocab_size = vocab;
  s.seq_len = seq;
  s.shared_classifier = shared;
  return s;
}
}  // namespace

const std::vector<ModelPreset>& model_presets() {
  // Shapes from the published configs (llama2.c's stories15M/110M, TinyLlama-1.1B, Meta's Llama 2/3,
  // Mistral's Mixtral treated as a dense shape of one expert's width).
  static const std::vector<ModelPreset> presets = {
      {"15m", "llama2.c stories15M shape", make(288, 768, 6, 6, 6, 32000, 256, true)},
      {"110m", "llama2.c stories110M shape", make(768, 2048, 12, 12, 12, 32000, 1024, true)},
      {"1.1b", "TinyLlama-1.1B shape (GQA 32/4)", make(2048, 5632, 22, 32, 4, 32000, 2048, false)},
      {"llama2-7b", "Llama 2 7B", make(4096, 11008, 32, 32, 32, 32000, 4096, false)},
      {"llama2-13b", "Llama 2 13B", make(5120, 13824, 40, 40, 40, 32000, 4096, false)},
      {"llama2-70b", "Llama 2 70B (GQA 64/8)", make(8192, 28672, 80, 64, 8, 32000, 4096, false)},
      {"llama3-8b", "Llama 3 8B (GQA 32/8)", make(4096, 14336, 32, 32, 8, 128256, 8192, false)},
      {"llama3-70b", "Llama 3 70B (GQA 64/8)", make(8192, 28672, 80, 64, 8, 128256, 8192, false)},
      {"mixtral-8x7b", "Mixtral 8x7B as a dense shape (one expert's MLP)",
       make(4096, 14336, 32, 32, 8, 32000, 32768, false)},
  };
  return presets;
}

const ModelPreset& find_model_preset(const std::string& name) {
  for (const auto& preset : model_presets()) {
    if (preset.name == name) return preset;
  }
  throw ConfigError(fmt::format("unknown model preset '{}' (known: {})", name, model_preset_names()));
}

std::string model_preset_names() {
  std::string names;
  for (const auto& preset : model_presets()) {
    if (!names.empty()) names += ", ";
    names += preset.name;
  }
  return names;
}

}  // namespace shardline::partition
