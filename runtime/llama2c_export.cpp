#include "runtime/llama2c_export.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include <fmt/format.h>

#include "common/error.h"

namespace shardline::runtime {

namespace {

constexpr std::uint64_t kF = sizeof(float);

struct ExportHeader {
  std::uint32_t magic = 0;
  std::int32_t version = 0;
  std::int32_t shape[7] = {};
  std::uint8_t shared_classifier = 0;
  std::int32_t group = 0;  // version 2 only
};

// The header's fields at the offsets export.py's struct.pack calls put them (each packed alone: no padding).
ExportHeader read_header(const memory::MappedFile& file) {
  char bytes[41] = {};
  file.read(0, bytes, sizeof bytes);
  ExportHeader h;
  std::memcpy(&h.magic, bytes, 4);
  std::memcpy(&h.version, bytes + 4, 4);
  std::memcpy(h.shape, bytes + 8, 28);
  std::memcpy(&h.shared_classifier, bytes + 36, 1);
  std::memcpy(&h.group, bytes + 37, 4);
  return h;
}

// The tensors in the order both versions write them; `matrix(n)` places a matrix of n values.
template <typename PlaceMatrix>
CheckpointLayout export_layout(const partition::ModelShape& s, PlaceMatrix&& matrix, std::uint64_t& at) {
  const std::uint64_t L = s.n_layers, d = s.dim, h = s.hidden_dim, kv = s.kv_dim(), v = s.vocab_size;
  auto norm = [&] {
    const TensorRef t{at};
    at += d * kF;
    return t;
  };
  CheckpointLayout c;
  c.layers.resize(L);
  for (auto& l : c.layers) l.rms_att = norm();
  for (auto& l : c.layers) l.rms_ffn = norm();
  c.rms_final = norm();
  c.token_embedding = matrix(v * d);
  // Each kind of matrix for every layer, then the next kind.
  for (auto& l : c.layers) l.wq = matrix(d * d);
  for (auto& l : c.layers) l.wk = matrix(kv * d);
  for (auto& l : c.layers) l.wv = matrix(kv * d);
  for (auto& l : c.layers) l.wo = matrix(d * d);
  for (auto& l : c.layers) l.w1 = matrix(h * d);
  for (auto& l : c.layers) l.w2 = matrix(d * h);
  for (auto& l : c.layers) l.w3 = matrix(h * d);
  c.classifier = s.shared_classifier ? c.token_embedding : matrix(v * d);
  c.total_bytes = at;
  return c;
}

// The first scales of a version-2 matrix are scales: finite and not negative (max |w| / 127). A file whose
// matrices lie otherwise (another fork's export, all codes before all scales) has the same header and size;
// read as scales, its int8 codes give negative or NaN floats at once, and the model would run on garbage.
void refuse_scales_that_are_not(const std::string& path, const memory::MappedFile& file, const TensorRef& matrix) {
  float scales[256];
  const std::uint64_t n = std::min<std::uint64_t>(std::size(scales), (matrix.scales - matrix.offset) / matrix.group);
  file.read(matrix.scales, scales, n * kF);
  for (std::uint64_t i = 0; i < n; ++i) {
    if (!(scales[i] >= 0.0f) || std::isinf(scales[i])) {
      throw FormatError(fmt::format("'{}' has a llama2.c version-2 header but its scale {} at byte {} is {}, not a "
                                    "scale (a finite number >= 0): its matrices are not laid out as export.py writes "
                                    "them (each one's int8 values, then its fp32 scales); re-export it with llama2.c's "
                                    "export.py --version 2",
                                    path, i, matrix.scales + i * kF, scales[i]));
    }
  }
}

}  // namespace

bool is_llama2c_export(const memory::MappedFile& file) {
  if (file.size_bytes() < sizeof(std::uint32_t)) return false;
  std::uint32_t magic = 0;
  file.read(0, &magic, sizeof magic);
  return magic == kLlama2cExportMagic;
}

ModelFile read_llama2c_export(const std::string& path, const memory::MappedFile& file) {
  if (file.size_bytes() < kLlama2cExportHeaderBytes) {
    throw FormatError(fmt::format("'{}' is a truncated llama2.c export: {} bytes, shorter than its 256-byte header; "
                                  "re-copy or re-export it", path, file.size_bytes()));
  }
  const ExportHeader h = read_header(file);
  if (h.version != 1 && h.version != 2) {
    throw FormatError(fmt::format("'{}' is a llama2.c export of version {}: shardline reads the legacy format and "
                                  "export.py's versions 1 (fp32) and 2 (int8, Q8_0); re-export it with --version 1 or 2",
                                  path, h.version));
  }
  ModelFile model;
  model.llama2c_version = h.version;
  partition::ModelShape& s = model.shape;
  s.dim = h.shape[0];
  s.hidden_dim = h.shape[1];
  s.n_layers = h.shape[2];
  s.n_heads = h.shape[3];
  s.n_kv_heads = h.shape[4];
  s.vocab_size = h.shape[5];
  s.seq_len = h.shape[6];
  s.shared_classifier = h.shared_classifier != 0;
  if (auto problem = s.find_problem()) {
    throw FormatError(fmt::format("'{}' has a llama2.c version-{} header that makes no sense: {}", path, h.version,
                                  *problem));
  }
  if (h.shared_classifier > 1) {
    throw FormatError(fmt::format("'{}' has a llama2.c version-{} header whose shared-classifier flag is {}, not 0 "
                                  "or 1: the file is damaged; re-copy or re-export it", path, h.version,
                                  h.shared_classifier));
  }
  std::uint64_t at = kLlama2cExportHeaderBytes;
  if (h.version == 1) {
    model.layout = export_layout(s, [&](std::uint64_t n) {
      const TensorRef t{at};
      at += n * kF;
      return t;
    }, at);
  } else {
    // export.py halves the group until it divides dim (so it divides every matrix's size: each is rows of dim
    // or columns of dim).
    if (h.group < 1 || s.dim % h.group != 0) {
      throw FormatError(fmt::format("'{}' is a llama2.c version-2 export whose group size {} does not divide every "
                                    "matrix of its shape ({}), as export.py makes it: the file is damaged; re-copy or "
                                    "re-export it", path, h.group, s.describe()));
    }
    const auto group = static_cast<std::uint32_t>(h.group);
    model.layout = export_layout(s, [&](std::uint64_t n) {
      const TensorRef t{.offset = at, .element = TensorElement::kLlama2cQ8, .scales = at + n, .group = group};
      at += n + n / group * kF;
      return t;
    }, at);
  }
  require_size_the_header_implies(path, fmt::format("its llama2.c version-{} header", h.version), model,
                                  file.size_bytes());
  if (h.version == 2) {
    refuse_scales_that_are_not(path, file, model.layout.token_embedding);
    refuse_scales_that_are_not(path, file, model.layout.layers.back().w3);
  }
  return model;
}

}  // namespace shardline::runtime
