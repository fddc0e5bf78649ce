#include "runtime/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "common/printable.h"
#include "runtime/gguf.h"
#include "runtime/tokenizer.h"

namespace shardline::runtime {

namespace {

[[noreturn]] void refuse(const GgufFile& file, const std::string& why) {
  throw FormatError(fmt::format("GGUF file '{}': {}", file.path(), why));
}

// A dimension from the metadata: present, and an int shardline's shape can hold.
int required_dimension(const GgufFile& file, const std::string& key) {
  const std::optional<std::uint64_t> value = file.get_count(key);
  if (!value) refuse(file, fmt::format("has no {} (a llama model's GGUF carries it)", key));
  if (*value < 1 || *value > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) {
    refuse(file, fmt::format("{} is {}, not a size from 1 to {}", key, *value, std::numeric_limits<std::int32_t>::max()));
  }
  return static_cast<int>(*value);
}

// The element type of a GGUF tensor type shardline reads, or nothing.
std::optional<TensorElement> element_of(std::uint32_t type) {
  switch (const auto element = static_cast<TensorElement>(type)) {
    case TensorElement::kF32:
    case TensorElement::kF16:
    case TensorElement::kBF16:
    case TensorElement::kQ8_0:
    case TensorElement::kQ4_0:
    case TensorElement::kQ4_1:
    case TensorElement::kQ5_0:
    case TensorElement::kQ5_1:
    case TensorElement::kQ4_K:
    case TensorElement::kQ5_K:
    case TensorElement::kQ6_K:
    case TensorElement::kQ2_K:
    case TensorElement::kQ3_K:
    case TensorElement::kIQ4_NL:
    case TensorElement::kIQ4_XS: return element;
    case TensorElement::kLlama2cQ8: return std::nullopt;  // llama2.c's, no ggml type id
  }
  return std::nullopt;
}

// Where a tensor of ne = {cols, rows} is (a vector: rows = 1, ne = {cols}). A block type's rows are whole
// blocks (checked with the table), so every row starts a block and a rank's rows can be read alone.
TensorRef float_tensor(const GgufFile& file, const std::string& name, std::uint64_t rows, std::uint64_t cols) {
  const GgufTensor* t = file.tensor(name);
  if (!t) refuse(file, fmt::format("has no tensor '{}'", name));
  const std::optional<TensorElement> element = element_of(t->type);
  if (!element && t->type >= kGgufTypeIds) {
    refuse(file, fmt::format("tensor '{}' has element type id {}, which no llama.cpp type shardline knows has "
                             "(the last is MXFP4, {}): the file is corrupt, or from a newer llama.cpp; copy or "
                             "convert it again",
                             printable(name), t->type, kGgufTypeIds - 1));
  }
  if (!element) {
    refuse(file, fmt::format("tensor '{}' is {}; shardline reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, "
                             "Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS tensors (requantize the model with "
                             "llama-quantize to one of Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q3_K_M or IQ4_XS, or convert it "
                             "with --outtype f16, bf16 or q8_0)",
                             printable(name), gguf_type_name(t->type)));
  }
  // Compared without trailing 1s, which writers may or may not keep (ggml drops them: a 1-row matrix is {cols}).
  const std::vector<std::uint64_t> expected = rows == 1 ? std::vector<std::uint64_t>{cols}
                                                        : std::vector<std::uint64_t>{cols, rows};
  std::vector<std::uint64_t> ne = t->ne;
  while (ne.size() > 1 && ne.back() == 1) ne.pop_back();
  if (ne != expected) {
    refuse(file, fmt::format("tensor '{}' has ne [{}] but the metadata's shape implies [{}]", printable(name),
                             fmt::join(t->ne, ", "), fmt::join(expected, ", ")));
  }
  return {t->offset, *element};
}

// "blk.N.<one of the nine per-layer tensors>.weight" with N < n_layers.
bool is_layer_tensor(const std::string& name, int n_layers) {
  static const char* const kinds[] = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                      "ffn_norm",  "ffn_gate", "ffn_down", "ffn_up"};
  int layer = -1, consumed = 0;
  if (std::sscanf(name.c_str(), "blk.%d.%n", &layer, &consumed) != 1 || consumed == 0 || layer < 0 ||
      layer >= n_layers || name != fmt::format("blk.{}.", layer) + name.substr(consumed)) {
    return false;  // (the last test refuses "blk.+1." or "blk.01.")
  }
  for (const char* kind : kinds) {
    if (name.substr(consumed) == std::string(kind) + ".weight") return true;
  }
  return false;
}

// Llama 3.1's RoPE scaling as llama.cpp's converter stores it: the tensor rope_freqs.weight, F32, one divisor
// per rotated pair (ggml divides each pair's angle by it). Empty when the file has none.
std::vector<float> rope_freq_divisors(const GgufFile& file, int head_size) {
  const GgufTensor* t = file.tensor("rope_freqs.weight");
  if (t == nullptr) return {};
  const std::uint64_t pairs = static_cast<std::uint64_t>(head_size) / 2;
  std::vector<std::uint64_t> ne = t->ne;
  while (ne.size() > 1 && ne.back() == 1) ne.pop_back();  // as float_tensor() compares shapes
  if (t->type != static_cast<std::uint32_t>(TensorElement::kF32) || ne != std::vector<std::uint64_t>{pairs}) {
    refuse(file, fmt::format("tensor 'rope_freqs.weight' is {} [{}]; RoPE frequency factors are F32 [{}] (one per "
                             "pair of a head's {} dimensions)",
                             gguf_type_name(t->type), fmt::join(t->ne, ", "), pairs, head_size));
  }
  std::vector<float> divisors(pairs);
  std::ifstream in(file.path(), std::ios::binary);
  in.seekg(static_cast<std::streamoff>(t->offset));
  in.read(reinterpret_cast<char*>(divisors.data()), static_cast<std::streamsize>(pairs * sizeof(float)));
  if (!in) refuse(file, "cannot read tensor 'rope_freqs.weight'");
  for (std::size_t i = 0; i < divisors.size(); ++i) {
    // Llama 3.1's are 1 to 8; a divisor near 0 turns the angle infinite and every logit NaN.
    if (!(divisors[i] >= 1e-3f && divisors[i] <= 1e9f)) {
      refuse(file, fmt::format("rope_freqs.weight[{}] is {}; RoPE frequency factors must be numbers from 0.001 to "
                               "1e9",
                               i, divisors[i]));
    }
  }
  return divisors;
}

// tokenizer.ggml.token_type: a TokenType per token, or empty when the file has none (every token normal).
std::vector<int> read_token_types(const GgufFile& file, std::size_t n_tokens) {
  std::vector<int> types;
  const GgufValue* array = file.find("tokenizer.ggml.token_type");
  if (array == nullptr) return types;
  if (array->kind != GgufValue::Kind::kArray || array->array_count != n_tokens) {
    refuse(file, "tokenizer.ggml.token_type is not an array of one type per token");
  }
  for (const double type : file.numbers("tokenizer.ggml.token_type")) {
    // llama.cpp's llama_token_type: 0 undefined ... 6 byte (checked before the cast: a NaN has no int).
    if (!(type >= 0.0 && type <= 6.0) || type != std::floor(type)) {
      refuse(file, fmt::format("token {} has the type {}; tokenizer.ggml.token_type holds 0 to 6", types.size(), type));
    }
    types.push_back(static_cast<int>(type));
  }
  return types;
}

// The token id under `key`, or -1 when the file has none; FormatError when it is not a token.
int read_token_id(const GgufFile& file, const std::string& key, std::size_t n_tokens) {
  const std::optional<std::uint64_t> value = file.get_count(key);
  if (!value) return -1;
  if (*value >= n_tokens) refuse(file, fmt::format("{} is {} but the vocabulary has {} tokens", key, *value, n_tokens));
  return static_cast<int>(*value);
}

// EOS, EOT and EOM, each once, in that order: llama.cpp's end-of-generation tokens.
std::vector<int> read_end_ids(const GgufFile& file, std::size_t n_tokens) {
  std::vector<int> ends;
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    const int end = read_token_id(file, key, n_tokens);
    if (end >= 0 && std::find(ends.begin(), ends.end(), end) == ends.end()) ends.push_back(end);
  }
  return ends;
}

// A boolean key, `absent` when the file lacks it (or stores it as another kind).
bool read_flag(const GgufFile& file, const std::string& key, bool absent) {
  const GgufValue* value = file.find(key);
  return value == nullptr || value->kind != GgufValue::Kind::kBool ? absent : value->u != 0;
}

// Llama 3's vocabulary: tokens spelled in GPT-2's byte alphabet, their types, the merges by rank, and the ids
// that begin and end text (byte_level_bpe.h checks them against the vocabulary).
ByteLevelVocabulary read_byte_level_vocabulary(const GgufFile& file) {
  ByteLevelVocabulary v;
  v.tokens = file.strings("tokenizer.ggml.tokens");
  v.types = read_token_types(file, v.tokens.size());
  const GgufValue* merges = file.find("tokenizer.ggml.merges");
  if (!merges || merges->kind != GgufValue::Kind::kArray) refuse(file, "has no tokenizer.ggml.merges array (byte-level BPE needs its merges)");
  v.merges = file.strings("tokenizer.ggml.merges");
  v.pre = file.get_string("tokenizer.ggml.pre").value_or("default");
  v.bos_id = read_token_id(file, "tokenizer.ggml.bos_token_id", v.tokens.size());
  v.add_bos = v.bos_id >= 0 && read_flag(file, "tokenizer.ggml.add_bos_token", true);
  v.end_ids = read_end_ids(file, v.tokens.size());
  return v;
}

// What llama.cpp reads beside a SentencePiece vocabulary's pieces: which tokens a prompt may write by name
// and which print nothing (from the token types), BOS and the dummy prefix, the ends of generation.
SentencePieceGguf read_sentencepiece_conventions(const GgufFile& file, const std::vector<std::string>& tokens) {
  SentencePieceGguf c;
  const std::vector<int> types = read_token_types(file, tokens.size());
  if (!types.empty()) c.silent.assign(tokens.size(), false);
  for (std::size_t id = 0; id < types.size(); ++id) {
    const auto type = static_cast<TokenType>(types[id]);
    if (is_special_token_type(type)) c.specials.emplace_back(tokens[id], static_cast<int>(id));
    c.silent[id] = type == TokenType::kControl || type == TokenType::kUnknown || type == TokenType::kUnused;
  }
  c.add_bos = read_flag(file, "tokenizer.ggml.add_bos_token", true);
  c.add_space_prefix = read_flag(file, "tokenizer.ggml.add_space_prefix", true);
  c.end_ids = read_end_ids(file, tokens.size());
  if (c.end_ids.empty()) c.end_ids.push_back(kEosId);
  return c;
}

}  // namespace

ModelFile read_gguf_model(const std::string& path) {
  const GgufFile file(path);
  const std::optional<std::string> arch = file.get_string("general.architecture");
  if (!arch) refuse(file, "has no general.architecture key; shardline runs 'llama' models");
  if (arch != "llama") {
    refuse(file, fmt::format("architecture '{}' is not one shardline runs (it runs 'llama')", printable(arch.value_or(""))));
  }
  const std::string p = "llama.";
  if (file.get_count(p + "expert_count").value_or(0) > 0) refuse(file, "mixture-of-experts models are not supported");
  if (auto scaling = file.get_string(p + "rope.scaling.type"); scaling && *scaling != "none") {
    refuse(file, fmt::format("RoPE scaling '{}' is not supported", printable(*scaling)));
  }
  // llama.cpp also scales RoPE linearly by these two keys without a scaling type.
  for (const std::string& key : {p + "rope.scaling.factor", p + "rope.scale_linear"}) {
    if (auto factor = file.get_number(key); factor && *factor != 0.0 && *factor != 1.0) {
      refuse(file, fmt::format("{} {} asks for RoPE scaling, which is not supported", key, *factor));
    }
  }
  ModelFile model;
  model.format = ModelFormat::kGguf;
  partition::ModelShape& s = model.shape;
  s.dim = required_dimension(file, p + "embedding_length");
  s.hidden_dim = required_dimension(file, p + "feed_forward_length");
  s.n_layers = required_dimension(file, p + "block_count");
  s.n_heads = required_dimension(file, p + "attention.head_count");
  s.n_kv_heads = file.find(p + "attention.head_count_kv") ? required_dimension(file, p + "attention.head_count_kv")
                                                            : s.n_heads;
  s.seq_len = required_dimension(file, p + "context_length");
  const GgufTensor* embedding = file.tensor("token_embd.weight");
  if (!embedding) refuse(file, "has no tensor 'token_embd.weight'");
  if (embedding->ne.size() != 2 || embedding->ne[1] > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) {
    refuse(file, "tensor 'token_embd.weight' is not a (vocab, dim) matrix");
  }
  s.vocab_size = static_cast<int>(embedding->ne[1]);
  s.shared_classifier = file.tensor("output.weight") == nullptr;
  if (auto problem = s.find_problem()) refuse(file, fmt::format("its metadata give a shape shardline cannot run: {}", *problem));
  // Checked as the file gives them, before they become floats (a double beyond float's range has no float).
  const double eps = file.get_number(p + "attention.layer_norm_rms_epsilon").value_or(1e-5);
  const double theta = file.get_number(p + "rope.freq_base").value_or(10000.0);
  if (!(eps >= 1e-30 && eps < 1.0)) refuse(file, fmt::format("{}attention.layer_norm_rms_epsilon {} is not in [1e-30, 1)", p, eps));
  if (!(theta >= 1.0 && theta <= 1e12)) refuse(file, fmt::format("{}rope.freq_base {} is not in [1, 1e12]", p, theta));
  model.rms_eps = static_cast<float>(eps);
  model.rope_theta = static_cast<float>(theta);
  model.rope_freq_divisors = rope_freq_divisors(file, s.head_size());

  const std::uint64_t d = s.dim, h = s.hidden_dim, kv = s.kv_dim(), v = s.vocab_size;
  CheckpointLayout& at = model.layout;
  at.token_embedding = float_tensor(file, "token_embd.weight", v, d);
  at.rms_final = float_tensor(file, "output_norm.weight", 1, d);
  at.classifier = s.shared_classifier ? at.token_embedding : float_tensor(file, "output.weight", v, d);
  for (int l = 0; l < s.n_layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l);
    at.layers.push_back({float_tensor(file, b + "attn_norm.weight", 1, d), float_tensor(file, b + "attn_q.weight", d, d),
                         float_tensor(file, b + "attn_k.weight", kv, d), float_tensor(file, b + "attn_v.weight", kv, d),
                         float_tensor(file, b + "attn_output.weight", d, d), float_tensor(file, b + "ffn_norm.weight", 1, d),
                         float_tensor(file, b + "ffn_gate.weight", h, d), float_tensor(file, b + "ffn_down.weight", d, h),
                         float_tensor(file, b + "ffn_up.weight", h, d)});
  }
  // Head sizes after the tensors' shapes: a wrong head_count or embedding_length shows there as a tensor of
  // another shape, which names the fault; here it read as partial RoPE.
  if (auto rotated = file.get_count(p + "rope.dimension_count"); rotated && *rotated != static_cast<std::uint64_t>(s.head_size())) {
    refuse(file, fmt::format("RoPE rotates {} of each head's {} dimensions (dim {} / head_count {}); shardline rotates "
                             "them all", *rotated, s.head_size(), s.dim, s.n_heads));
  }
  for (const std::string& key : {p + "attention.key_length", p + "attention.value_length"}) {
    if (auto length = file.get_count(key); length && *length != static_cast<std::uint64_t>(s.head_size())) {
      refuse(file, fmt::format("{} is {} but dim / head_count is {}; shardline needs heads of dim / head_count", key,
                               *length, s.head_size()));
    }
  }
  // Any other tensor (biases, ...) would change the arithmetic if it were used, so a file with one is refused,
  // as llama.cpp refuses a llama file with tensors it does not expect.
  for (const auto& [name, tensor] : file.tensors()) {
    const bool known = name == "token_embd.weight" || name == "output_norm.weight" || name == "rope_freqs.weight" ||
                       (name == "output.weight" && !s.shared_classifier) || is_layer_tensor(name, s.n_layers);
    if (!known && is_layer_tensor(name, std::numeric_limits<int>::max())) {
      // A layer's tensor past the metadata's layer count: the two disagree (a corrupt or hand-edited file).
      refuse(file, fmt::format("holds the tensor '{}' but {}block_count is {}: the metadata and the tensors "
                               "disagree on the number of layers",
                               printable(name), p, s.n_layers));
    }
    if (!known) {
      refuse(file, fmt::format("holds the tensor '{}', which shardline's llama model does not use (biases and other "
                               "extras are not supported)",
                               printable(name)));
    }
  }
  at.total_bytes = file.size_bytes();
  return model;
}

GgufVocabulary read_gguf_vocabulary(const std::string& path, int vocab_size) {
  const GgufFile file(path);
  const std::optional<std::string> kind = file.get_string("tokenizer.ggml.model");
  if (kind != "llama" && kind != "gpt2") {
    refuse(file, kind ? fmt::format("its tokenizer is '{}'; shardline reads llama (SentencePiece) and gpt2 (byte-level "
                                    "BPE, Llama 3) vocabularies",
                                    printable(*kind))
                      : std::string("carries no vocabulary (tokenizer.ggml.model); pass --tokenizer tokenizer.bin"));
  }
  // The counts first: nothing is decoded unless it is the model's vocabulary.
  const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
  if (!tokens) refuse(file, "has no tokenizer.ggml.tokens array");
  if (tokens->kind != GgufValue::Kind::kArray) refuse(file, "holds tokenizer.ggml.tokens as a single value, not an array");
  if (tokens->array_count != static_cast<std::uint64_t>(vocab_size)) {
    refuse(file, fmt::format("its vocabulary has {} tokens but the model expects {}", tokens->array_count, vocab_size));
  }
  if (kind == "gpt2") {
    GgufVocabulary vocabulary;
    vocabulary.byte_level = read_byte_level_vocabulary(file);
    return vocabulary;
  }
  const GgufValue* scores = file.find("tokenizer.ggml.scores");
  if (!scores || scores->kind != GgufValue::Kind::kArray || scores->array_count != tokens->array_count) {
    refuse(file, "tokenizer.ggml.scores is not an array of one number per token");
  }
  // llama2.c's tokenizer (and so shardline's) has BOS = 1 and EOS = 2.
  if (file.get_count("tokenizer.ggml.bos_token_id").value_or(kBosId) != static_cast<std::uint64_t>(kBosId) ||
      file.get_count("tokenizer.ggml.eos_token_id").value_or(kEosId) != static_cast<std::uint64_t>(kEosId)) {
    refuse(file, fmt::format("BOS and EOS must be tokens {} and {}, as in the Llama 2 vocabulary", kBosId, kEosId));
  }
  GgufVocabulary vocabulary;
  const std::vector<std::string> spellings = file.strings("tokenizer.ggml.tokens");
  vocabulary.sentencepiece = read_sentencepiece_conventions(file, spellings);
  for (const std::string& token : spellings) vocabulary.pieces.push_back(sentencepiece_spaces_as_spaces(token));
  for (const double score : file.numbers("tokenizer.ggml.scores")) {
    if (!(std::fabs(score) <= std::numeric_limits<float>::max())) {  // also NaN: no float holds it
      refuse(file, fmt::format("token {} has the score {}", vocabulary.scores.size(), score));
    }
    vocabulary.scores.push_back(static_cast<float>(score));
  }
  // llama2.c's tokenizer.bin spells the two control tokens with newlines around them.
  if (vocabulary.pieces.size() > kEosId && vocabulary.pieces[kBosId] == "<s>" && vocabulary.pieces[kEosId] == "</s>") {
    vocabulary.pieces[kBosId] = "\n<s>\n";
    vocabulary.pieces[kEosId] = "\n</s>\n";
  }
  return vocabulary;
}

}  // namespace shardline::runtime
