#include "runtime/checkpoint.h"

#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "common/error.h"
#include "common/units.h"
#include "memory/mapped_file.h"
#include "runtime/gguf.h"
#include "runtime/gguf_model.h"
#include "runtime/llama2c_export.h"

namespace shardline::runtime {

ElementBlock element_block(TensorElement element) {
  if (element == TensorElement::kLlama2cQ8) return {1, 1};
  const GgufBlockSize block = gguf_block_size(static_cast<std::uint32_t>(element));
  return {block.elements, block.bytes};
}

std::string element_name(TensorElement element) {
  if (element == TensorElement::kLlama2cQ8) return "Q8_0 (llama2.c)";
  return gguf_type_name(static_cast<std::uint32_t>(element));
}

double bits_per_weight(const TensorRef& tensor) {
  const ElementBlock block = element_block(tensor.element);
  const double bits = 8.0 * static_cast<double>(block.bytes) / static_cast<double>(block.elements);
  return tensor.element == TensorElement::kLlama2cQ8 ? bits + 32.0 / tensor.group : bits;
}

std::uint64_t tensor_bytes(TensorElement element, std::uint64_t n) {
  const ElementBlock block = element_block(element);
  SL_CHECK_MSG(n % block.elements == 0, "{} values are no whole number of blocks of {}", n, block.elements);
  return n / block.elements * block.bytes;
}

bool CheckpointLayout::all_f32() const {
  auto f32 = [](const TensorRef& t) { return t.element == TensorElement::kF32; };
  for (const LayerTensors& l : layers) {
    for (const TensorRef* t : {&l.rms_att, &l.wq, &l.wk, &l.wv, &l.wo, &l.rms_ffn, &l.w1, &l.w2, &l.w3}) {
      if (!f32(*t)) return false;
    }
  }
  return f32(token_embedding) && f32(rms_final) && f32(classifier);
}

CheckpointLayout checkpoint_layout(const partition::ModelShape& s) {
  const std::uint64_t f = sizeof(float);
  const std::uint64_t L = s.n_layers, d = s.dim, h = s.hidden_dim, kv = s.kv_dim(), v = s.vocab_size;
  CheckpointLayout c;
  std::uint64_t at = kCheckpointHeaderBytes;
  auto take = [&](std::uint64_t n_floats) {
    std::uint64_t offset = at;
    at += n_floats * f;
    return offset;
  };
  c.token_embedding = {take(v * d)};
  // Each kind of tensor is stacked over the layers: layer l's is the l-th of its block.
  const std::uint64_t rms_att = take(L * d), wq = take(L * d * d), wk = take(L * kv * d), wv = take(L * kv * d),
                      wo = take(L * d * d), rms_ffn = take(L * d), w1 = take(L * h * d), w2 = take(L * d * h),
                      w3 = take(L * h * d);
  for (std::uint64_t l = 0; l < L; ++l) {
    c.layers.push_back({{rms_att + l * d * f}, {wq + l * d * d * f}, {wk + l * kv * d * f}, {wv + l * kv * d * f},
                        {wo + l * d * d * f}, {rms_ffn + l * d * f}, {w1 + l * h * d * f}, {w2 + l * d * h * f},
                        {w3 + l * h * d * f}});
  }
  c.rms_final = {take(d)};
  take(2 * static_cast<std::uint64_t>(s.seq_len) * (s.head_size() / 2));  // RoPE tables: computed instead
  c.classifier = s.shared_classifier ? c.token_embedding : TensorRef{take(v * d)};
  c.total_bytes = at;
  return c;
}

namespace {

ModelFile read_llama2c_file(const std::string& path) {
  memory::MappedFile file(path);
  if (is_llama2c_export(file)) return read_llama2c_export(path, file);
  if (file.size_bytes() < kCheckpointHeaderBytes) {
    // Too short for GGUF's magic too (read_model_file checks it first), so neither format.
    throw FormatError(fmt::format("'{}' is neither a GGUF file nor a llama2.c checkpoint: {} bytes, shorter than the "
                                  "28-byte header (a file cut short by a copy or download?)",
                                  path, file.size_bytes()));
  }
  std::int32_t header[7];
  file.read(0, header, sizeof(header));
  ModelFile model;
  partition::ModelShape& shape = model.shape;
  shape.dim = header[0];
  shape.hidden_dim = header[1];
  shape.n_layers = header[2];
  shape.n_heads = header[3];
  shape.n_kv_heads = header[4];
  shape.shared_classifier = header[5] > 0;
  // INT_MIN has no positive counterpart: left negative, the shape check refuses it (negating it is undefined).
  shape.vocab_size = header[5] < 0 && header[5] != std::numeric_limits<std::int32_t>::min() ? -header[5] : header[5];
  shape.seq_len = header[6];
  if (auto problem = shape.find_problem()) {
    throw FormatError(fmt::format("'{}' is neither a GGUF file nor a llama2.c checkpoint: read as a llama2.c header, "
                                  "its first 28 bytes say {}",
                                  path, *problem));
  }
  model.layout = checkpoint_layout(shape);
  require_size_the_header_implies(path, "the header", model, file.size_bytes());
  return model;
}

}  // namespace

void require_size_the_header_implies(const std::string& path, const std::string& header, const ModelFile& model,
                                     std::uint64_t file_bytes) {
  if (file_bytes == model.layout.total_bytes) return;
  throw FormatError(fmt::format("'{}' is {}: {} ({}) implies {} bytes but the file has {} bytes; re-copy or re-export it",
                                path, file_bytes < model.layout.total_bytes ? "truncated" : "longer than its header says",
                                header, model.shape.describe(), model.layout.total_bytes, file_bytes));
}

ModelFile read_model_file(const std::string& path) {
  memory::MappedFile probe(path);  // a missing file is a ResourceError naming it, whatever its format
  if (is_gguf_file(path)) return read_gguf_model(path);
  return read_llama2c_file(path);
}

partition::ModelShape read_checkpoint_shape(const std::string& path) { return read_model_file(path).shape; }

void encode_checkpoint_header(const partition::ModelShape& s, std::int32_t out[7]) {
  out[0] = s.dim;
  out[1] = s.hidden_dim;
  out[2] = s.n_layers;
  out[3] = s.n_heads;
  out[4] = s.n_kv_heads;
  out[5] = s.shared_classifier ? s.vocab_size : -s.vocab_size;
  out[6] = s.seq_len;
}

}  // namespace shardline::runtime
