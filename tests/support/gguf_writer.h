// Writes GGUF files for tests: any metadata and tensors (so a test can build malformed ones), and
// llama_gguf_from_llama2c(), which turns a llama2.c checkpoint and its tokenizer into the GGUF file
// llama.cpp's converter would write, with the tensors in an order and alignment of the test's choosing.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/weight_format.h"
#include "runtime/byte_level_bpe.h"
#include "runtime/checkpoint.h"
#include "runtime/tokenizer.h"
#include "tests/support/ggml_quants.h"

namespace shardline::test {

class GgufWriter {
 public:
  enum : std::uint32_t { kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9, kU64 = 10 };

  void u32(const std::string& key, std::uint32_t v) { entry(key, kU32), pod(meta_, v); }
  void f32(const std::string& key, float v) { entry(key, kF32), pod(meta_, v); }
  void string(const std::string& key, const std::string& v) { entry(key, kString), str(meta_, v); }
  void strings(const std::string& key, const std::vector<std::string>& v) {
    entry(key, kArray), pod(meta_, std::uint32_t{kString}), pod(meta_, std::uint64_t{v.size()});
    for (const auto& s : v) str(meta_, s);
  }
  void boolean(const std::string& key, bool v) { entry(key, kBool), pod(meta_, std::uint8_t{v}); }
  void i32s(const std::string& key, const std::vector<int>& v) {
    entry(key, kArray), pod(meta_, std::uint32_t{kI32}), pod(meta_, std::uint64_t{v.size()});
    for (int x : v) pod(meta_, static_cast<std::int32_t>(x));
  }
  void f32s(const std::string& key, const std::vector<float>& v) {
    entry(key, kArray), pod(meta_, std::uint32_t{kF32}), pod(meta_, std::uint64_t{v.size()});
    for (float x : v) pod(meta_, x);
  }
  // ne[0] is the contiguous dimension; data holds the tensor's bytes (type 0 = F32, 1 = F16, ...).
  void tensor(const std::string& name, std::vector<std::uint64_t> ne, std::uint32_t type, std::vector<char> data) {
    tensors_.push_back({name, std::move(ne), type, std::move(data)});
  }

  // The file: header, metadata, tensor table, then the data with every tensor at a multiple of alignment.
  // version and a forced tensor count let a test write the corrupt variants.
  std::vector<char> bytes(std::uint32_t alignment = 32, std::uint32_t version = 3) const {
    std::vector<char> out(kMagic, kMagic + 4);
    pod(out, version), pod(out, std::uint64_t{tensors_.size()}), pod(out, std::uint64_t{n_kv_});
    out.insert(out.end(), meta_.begin(), meta_.end());
    std::uint64_t offset = 0, end = 0;  // no padding after the last tensor: a cut of one byte cuts its data
    std::vector<std::uint64_t> offsets;
    for (const auto& t : tensors_) {
      str(out, t.name), pod(out, std::uint32_t(t.ne.size()));
      for (std::uint64_t d : t.ne) pod(out, d);
      pod(out, t.type), pod(out, offset);
      offsets.push_back(offset);
      end = offset + t.data.size();
      offset = (end + alignment - 1) / alignment * alignment;
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
    const std::size_t data_start = out.size();
    out.resize(data_start + end, 0);
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      std::copy(tensors_[i].data.begin(), tensors_[i].data.end(), out.begin() + data_start + offsets[i]);
    }
    return out;
  }
  void write(const std::string& path, std::uint32_t alignment = 32) const {
    const std::vector<char> b = bytes(alignment);
    std::ofstream(path, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
  }

 private:
  static constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
  struct Tensor {
    std::string name;
    std::vector<std::uint64_t> ne;
    std::uint32_t type;
    std::vector<char> data;
  };
  template <typename T>
  static void pod(std::vector<char>& out, T v) {
    // resize and memcpy, not insert(p, p + sizeof(T)): GCC 12 at -O3 warns falsely (-Warray-bounds) about the
    // inlined insert of a small range.
    const std::size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
  }
  static void str(std::vector<char>& out, const std::string& s) {
    pod(out, std::uint64_t{s.size()});
    out.insert(out.end(), s.begin(), s.end());
  }
  void entry(const std::string& key, std::uint32_t type) {
    str(meta_, key), pod(meta_, type);
    ++n_kv_;
  }
  std::vector<char> meta_;
  std::uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

struct LlamaGgufOptions {
  std::uint32_t alignment = 32;
  unsigned shuffle_seed = 0;     // 0: llama.cpp's order; else the tensors in a random order
  bool write_output = true;      // llama.cpp's converter writes output.weight even for a tied classifier
  bool with_vocabulary = true;
  std::uint32_t context_length = 0;       // 0: the checkpoint's seq_len
  std::uint32_t rope_dimension_count = 0;  // 0: the head size
  std::uint32_t feed_forward_length = 0;   // 0: the checkpoint's hidden_dim
  std::uint32_t head_count = 0;            // 0: the checkpoint's n_heads
  std::uint32_t matrix_type = 0;           // the matrices' and embedding's: 0 F32, 1 F16, 30 BF16, or a ggml block
                                           // type of ggml_quants.h (8 Q8_0, 12 Q4_K ...); the norms stay F32
  // Types for some matrices instead, by the end of their names ("attn_v.weight", "output.weight"), as
  // llama-quantize's presets mix them (Q4_K_M: Q6_K for attn_v, ffn_down and output).
  std::vector<std::pair<std::string, std::uint32_t>> tensor_types = {};
  std::uint32_t type_of(const std::string& name) const {
    for (const auto& [suffix, type] : tensor_types) {
      if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        return type;
      }
    }
    return matrix_type;
  }
  float rms_eps = 1e-5f;
  double rope_freq_base = 0;               // 0: not written (the default, 10000)
  std::vector<float> rope_freqs = {};      // empty: no rope_freqs.weight tensor (Llama 3.1's RoPE divisors)
  // Set: this byte-level (Llama 3) vocabulary instead of the checkpoint's tokenizer (the same token count).
  std::optional<runtime::ByteLevelVocabulary> byte_level = {};
  // The SentencePiece vocabulary's extras: tokenizer.ggml.token_type as llama.cpp's converters write it
  // (<unk> unknown, BOS and EOS control, the byte tokens byte, the rest normal), an EOT id (-1: none) and the
  // two flags (unset: not written, llama.cpp's default true).
  bool token_types = true;
  int eot_token_id = -1;
  std::optional<bool> add_bos_token = {};
  std::optional<bool> add_space_prefix = {};
};

// A byte-level vocabulary's tokenizer.ggml.* keys, as llama.cpp's converter writes Llama 3's.
inline void write_byte_level_vocabulary(GgufWriter& w, const runtime::ByteLevelVocabulary& v) {
  w.string("tokenizer.ggml.model", "gpt2");
  w.string("tokenizer.ggml.pre", v.pre);
  w.strings("tokenizer.ggml.tokens", v.tokens);
  if (!v.types.empty()) w.i32s("tokenizer.ggml.token_type", v.types);
  w.strings("tokenizer.ggml.merges", v.merges);
  if (v.bos_id >= 0) w.u32("tokenizer.ggml.bos_token_id", static_cast<std::uint32_t>(v.bos_id));
  const char* const end_keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
  for (std::size_t i = 0; i < v.end_ids.size() && i < 3; ++i) w.u32(end_keys[i], static_cast<std::uint32_t>(v.end_ids[i]));
  w.boolean("tokenizer.ggml.add_bos_token", v.add_bos);
}

// F32 bytes as F16 or BF16 ones (round to nearest even), as a converter with --outtype f16/bf16 writes them,
// or as one of ggml's block formats (ggml_quants.h; Q8_0's scale is max|x| / 127 and its codes round(x / d),
// as llama.cpp's reference quantiser writes them).
inline std::vector<char> narrowed(const std::vector<char>& f32, std::uint32_t type) {
  if (ggml_block_values(type) > 1) {
    std::vector<float> x(f32.size() / 4);
    std::memcpy(x.data(), f32.data(), f32.size());
    return quantize_blocks(type, x.data(), x.size()).bytes;
  }
  std::vector<char> out(f32.size() / 2);
  for (std::size_t i = 0; i < f32.size() / 4; ++i) {
    float value;
    std::memcpy(&value, f32.data() + 4 * i, 4);
    const std::uint16_t bits = type == 1 ? kernels::cpu::float_to_fp16(value) : kernels::cpu::float_to_bf16(value);
    std::memcpy(out.data() + 2 * i, &bits, 2);
  }
  return out;
}

// The GGUF of a llama2.c checkpoint (and its tokenizer), as llama.cpp's llama2c converter lays it out.
inline GgufWriter llama_gguf_from_llama2c(const std::string& checkpoint, const std::string& tokenizer_path,
                                          const LlamaGgufOptions& options = {}) {
  const runtime::ModelFile model = runtime::read_model_file(checkpoint);
  const partition::ModelShape& s = model.shape;
  std::ifstream in(checkpoint, std::ios::binary);
  auto read = [&](std::uint64_t offset, std::uint64_t floats) {
    std::vector<char> data(floats * 4);
    in.seekg(static_cast<std::streamoff>(offset));
    in.read(data.data(), static_cast<std::streamsize>(data.size()));
    return data;
  };
  GgufWriter w;
  w.string("general.architecture", "llama");
  w.string("general.name", "test");
  if (options.alignment != 32) w.u32("general.alignment", options.alignment);  // else the default, 32
  w.u32("llama.context_length", options.context_length ? options.context_length : s.seq_len);
  w.u32("llama.embedding_length", s.dim);
  w.u32("llama.feed_forward_length", options.feed_forward_length ? options.feed_forward_length : s.hidden_dim);
  w.u32("llama.attention.head_count", options.head_count ? options.head_count : s.n_heads);
  w.u32("llama.attention.head_count_kv", s.n_kv_heads);
  w.u32("llama.block_count", s.n_layers);
  w.u32("llama.rope.dimension_count", options.rope_dimension_count ? options.rope_dimension_count : s.head_size());
  w.f32("llama.attention.layer_norm_rms_epsilon", options.rms_eps);
  if (options.rope_freq_base != 0) w.f32("llama.rope.freq_base", static_cast<float>(options.rope_freq_base));
  if (options.byte_level) {
    write_byte_level_vocabulary(w, *options.byte_level);
  } else if (options.with_vocabulary) {
    const runtime::Tokenizer tokenizer(tokenizer_path, s.vocab_size);
    std::vector<std::string> tokens;
    std::vector<float> scores;
    for (int id = 0; id < s.vocab_size; ++id) {
      std::string piece = tokenizer.piece(id), token;
      if (id == runtime::kBosId) piece = "<s>";
      if (id == runtime::kEosId) piece = "</s>";
      for (char c : piece) token += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
      tokens.push_back(token);
      scores.push_back(tokenizer.score(id));
    }
    w.string("tokenizer.ggml.model", "llama");
    w.strings("tokenizer.ggml.tokens", tokens);
    w.f32s("tokenizer.ggml.scores", scores);
    if (options.token_types) {
      std::vector<int> types(tokens.size(), static_cast<int>(runtime::TokenType::kNormal));
      types[runtime::kUnkId] = static_cast<int>(runtime::TokenType::kUnknown);
      types[runtime::kBosId] = types[runtime::kEosId] = static_cast<int>(runtime::TokenType::kControl);
      for (int b = 0; b < 256; ++b) types[runtime::kByteFallbackId + b] = static_cast<int>(runtime::TokenType::kByte);
      w.i32s("tokenizer.ggml.token_type", types);
    }
    w.u32("tokenizer.ggml.bos_token_id", runtime::kBosId);
    w.u32("tokenizer.ggml.eos_token_id", runtime::kEosId);
    if (options.eot_token_id >= 0) w.u32("tokenizer.ggml.eot_token_id", static_cast<std::uint32_t>(options.eot_token_id));
    if (options.add_bos_token) w.boolean("tokenizer.ggml.add_bos_token", *options.add_bos_token);
    if (options.add_space_prefix) w.boolean("tokenizer.ggml.add_space_prefix", *options.add_space_prefix);
  }
  const std::uint64_t d = s.dim, h = s.hidden_dim, kv = s.kv_dim(), v = s.vocab_size;
  struct Entry {
    std::string name;
    std::vector<std::uint64_t> ne;
    std::uint64_t offset;
  };
  std::vector<Entry> entries = {{"token_embd.weight", {d, v}, model.layout.token_embedding.offset},
                                {"output_norm.weight", {d}, model.layout.rms_final.offset}};
  if (options.write_output || !s.shared_classifier) {
    entries.push_back({"output.weight", {d, v}, model.layout.classifier.offset});
  }
  for (int l = 0; l < s.n_layers; ++l) {
    const runtime::LayerTensors& t = model.layout.layers[l];
    const std::string b = "blk." + std::to_string(l) + ".";
    entries.insert(entries.end(), {{b + "attn_q.weight", {d, d}, t.wq.offset},
                                   {b + "attn_k.weight", {d, kv}, t.wk.offset},
                                   {b + "attn_v.weight", {d, kv}, t.wv.offset},
                                   {b + "attn_output.weight", {d, d}, t.wo.offset},
                                   {b + "attn_norm.weight", {d}, t.rms_att.offset},
                                   {b + "ffn_gate.weight", {d, h}, t.w1.offset},
                                   {b + "ffn_down.weight", {h, d}, t.w2.offset},
                                   {b + "ffn_up.weight", {d, h}, t.w3.offset},
                                   {b + "ffn_norm.weight", {d}, t.rms_ffn.offset}});
  }
  if (!options.rope_freqs.empty()) {  // llama.cpp writes it first, before the token embedding
    std::vector<char> bytes(options.rope_freqs.size() * sizeof(float));
    std::memcpy(bytes.data(), options.rope_freqs.data(), bytes.size());
    w.tensor("rope_freqs.weight", {options.rope_freqs.size()}, 0, bytes);
  }
  if (options.shuffle_seed != 0) std::shuffle(entries.begin(), entries.end(), std::mt19937(options.shuffle_seed));
  for (const auto& e : entries) {
    std::uint64_t floats = 1;
    for (std::uint64_t n : e.ne) floats *= n;
    if (const std::uint32_t type = options.type_of(e.name); type != 0 && e.ne.size() == 2) {
      w.tensor(e.name, e.ne, type, narrowed(read(e.offset, floats), type));
    } else {
      w.tensor(e.name, e.ne, 0, read(e.offset, floats));
    }
  }
  return w;
}

}  // namespace shardline::test
