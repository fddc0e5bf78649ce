// Test-side writer of llama2.c's versioned model files, as its export.py writes them (version1_export,
// version2_export): from a legacy checkpoint, read here by the legacy layout with its own offsets, so a test
// checks the product's reader (runtime/llama2c_export.h) against code that shares nothing with it.
// Version 2 quantises every matrix as export.py's quantize_q80 does (groups over the flattened tensor, scale =
// max |w| / 127 in fp32, codes rounded half to even) and also writes a legacy checkpoint of the values those
// codes decode to (q x scale), whose tokens the version-2 file must give.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace shardline::test {

struct LegacyCheckpoint {
  std::int32_t dim = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, vocab = 0, seq = 0;
  bool shared = true;
  // Each kind of tensor with every layer's one after the other, as the legacy file stacks them.
  std::vector<float> embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, rope, classifier;
};

inline LegacyCheckpoint read_legacy_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::int32_t h[7] = {};
  in.read(reinterpret_cast<char*>(h), sizeof h);
  LegacyCheckpoint c;
  c.dim = h[0], c.hidden = h[1], c.layers = h[2], c.heads = h[3], c.kv_heads = h[4], c.vocab = std::abs(h[5]),
  c.seq = h[6], c.shared = h[5] > 0;
  const std::size_t d = c.dim, L = c.layers, kv = d / c.heads * c.kv_heads, hd = c.hidden, v = c.vocab;
  auto take = [&](std::vector<float>& t, std::size_t n) {
    t.resize(n);
    in.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(n * sizeof(float)));
  };
  take(c.embedding, v * d);
  take(c.rms_att, L * d);
  take(c.wq, L * d * d);
  take(c.wk, L * kv * d);
  take(c.wv, L * kv * d);
  take(c.wo, L * d * d);
  take(c.rms_ffn, L * d);
  take(c.w1, L * hd * d);
  take(c.w2, L * d * hd);
  take(c.w3, L * hd * d);
  take(c.rms_final, d);
  take(c.rope, static_cast<std::size_t>(c.seq) * (d / c.heads));  // the real and imaginary tables
  if (!c.shared) take(c.classifier, v * d);
  EXPECT_TRUE(in) << path;
  EXPECT_EQ(in.peek(), std::char_traits<char>::eof()) << path << " is longer than its header says";
  return c;
}

inline void write_legacy_checkpoint(const LegacyCheckpoint& c, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  const std::int32_t h[7] = {c.dim, c.hidden, c.layers, c.heads, c.kv_heads, c.shared ? c.vocab : -c.vocab, c.seq};
  out.write(reinterpret_cast<const char*>(h), sizeof h);
  for (const auto* t : {&c.embedding, &c.rms_att, &c.wq, &c.wk, &c.wv, &c.wo, &c.rms_ffn, &c.w1, &c.w2, &c.w3,
                        &c.rms_final, &c.rope, &c.classifier}) {
    out.write(reinterpret_cast<const char*>(t->data()), static_cast<std::streamsize>(t->size() * sizeof(float)));
  }
}

// export.py's quantize_q80 of one tensor: its codes and scales; `values` becomes what they decode to.
struct Q80 {
  std::vector<std::int8_t> codes;
  std::vector<float> scales;
};
inline Q80 quantize_q80(std::vector<float>::iterator values, std::size_t n, std::size_t group) {
  Q80 q;
  for (std::size_t g = 0; g < n / group; ++g) {
    float wmax = 0.0f;
    for (std::size_t i = 0; i < group; ++i) wmax = std::max(wmax, std::fabs(values[g * group + i]));
    const float scale = wmax / 127.0f;
    q.scales.push_back(scale);
    for (std::size_t i = 0; i < group; ++i) {
      float& w = values[g * group + i];
      const auto code = static_cast<std::int8_t>(std::nearbyint(w / scale));  // torch.round: half to even
      q.codes.push_back(code);
      w = static_cast<float>(code) * scale;
    }
  }
  return q;
}

struct ExportOptions {
  int version = 1;
  int group = 64;  // version 2: export.py's default, halved until it divides dim
};

// Writes the checkpoint at `legacy` as export.py's version 1 or 2 file `out`; for version 2 also the legacy
// checkpoint of its decoded values to `decoded` (when given). Returns the group size version 2 used.
inline int write_llama2c_export(const std::string& legacy, const std::string& out, const ExportOptions& options,
                                const std::string& decoded = "") {
  LegacyCheckpoint c = read_legacy_checkpoint(legacy);
  int group = options.group;
  while (c.dim % group != 0) group /= 2;
  std::vector<char> header(256, '\0');
  const std::uint32_t magic = 0x616b3432;
  const std::int32_t fields[8] = {options.version, c.dim, c.hidden, c.layers, c.heads, c.kv_heads, c.vocab, c.seq};
  std::memcpy(header.data(), &magic, 4);
  std::memcpy(header.data() + 4, fields, sizeof fields);
  header[36] = c.shared ? 1 : 0;
  if (options.version == 2) std::memcpy(header.data() + 37, &group, 4);
  std::ofstream file(out, std::ios::binary);
  file.write(header.data(), static_cast<std::streamsize>(header.size()));
  auto write_floats = [&](const float* p, std::size_t n) {
    file.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n * sizeof(float)));
  };
  write_floats(c.rms_att.data(), c.rms_att.size());
  write_floats(c.rms_ffn.data(), c.rms_ffn.size());
  write_floats(c.rms_final.data(), c.rms_final.size());
  // The matrices: the embedding, then each kind for every layer (one layer's matrix at a time), the classifier.
  std::vector<std::pair<std::vector<float>*, std::size_t>> matrices = {{&c.embedding, 1}};
  for (auto* kind : {&c.wq, &c.wk, &c.wv, &c.wo, &c.w1, &c.w2, &c.w3}) {
    matrices.push_back({kind, static_cast<std::size_t>(c.layers)});
  }
  if (!c.shared) matrices.push_back({&c.classifier, 1});
  for (auto [tensor, count] : matrices) {
    const std::size_t each = tensor->size() / count;
    for (std::size_t i = 0; i < count; ++i) {
      if (options.version == 1) {
        write_floats(tensor->data() + i * each, each);
        continue;
      }
      EXPECT_EQ(each % group, 0u) << "export.py asserts every matrix is whole groups";
      const Q80 q = quantize_q80(tensor->begin() + static_cast<std::ptrdiff_t>(i * each), each, group);
      file.write(reinterpret_cast<const char*>(q.codes.data()), static_cast<std::streamsize>(q.codes.size()));
      write_floats(q.scales.data(), q.scales.size());
    }
  }
  EXPECT_TRUE(file) << out;
  if (!decoded.empty()) write_legacy_checkpoint(c, decoded);
  return group;
}

}  // namespace shardline::test
