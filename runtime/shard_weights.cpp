#include "runtime/shard_weights.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "common/error.h"
#include "kernels/cpu/weight_format.h"
#include "runtime/checkpoint.h"
#include "runtime/load_watch.h"
#include "runtime/tensor_decode.h"

namespace shardline::runtime {

namespace {
constexpr std::uint64_t kF = sizeof(float);
// int8 k values per scale of w2, which tensor parallelism slices along k, chosen from the model alone so that
// every layout groups it alike (see the constructor): partition::hidden_block(), the unit of w2's reduction
// segments and TP slices (128 or 32), so every segment and slice starts on a group. Only a hidden dim with
// fewer blocks of 32 than TP ranks is cut elsewhere; a rank then groups its slice from its own first column,
// so its int8 rounding differs from one rank's by quantisation noise (the run warns). wo's groups: WoInput
// (shard_weights.h).
constexpr int kWide = kernels::cpu::kInt8WideGroup;
constexpr int kBlock = kernels::cpu::kInt8Block;
int w2_int8_group(const partition::ModelShape& s) { return partition::hidden_block(s); }
}  // namespace

WoInput wo_input(const partition::ModelShape& shape, WeightDtype dtype) {
  // One kv head's query columns; with a single kv head no layout slices wo, so its k is one segment and the
  // default grouping serves.
  if (shape.n_kv_heads == 1) {
    return {shape.dim, shape.dim, dtype == WeightDtype::kInt8 ? kernels::cpu::default_int8_group(shape.dim) : 0};
  }
  const int segment = shape.n_heads / shape.n_kv_heads * shape.head_size();
  if (dtype == WeightDtype::kF32) return {segment, segment, 0};
  const int padded = (segment + kBlock - 1) / kBlock * kBlock;
  if (dtype == WeightDtype::kBf16) return {segment, padded, 0};  // the bf16-dot kernels read blocks of 32 k
  // The widest of 128, 96, 64 and 32 that divides the padded segment (so every group lies inside one).
  int group = kBlock;
  for (int g = kWide; g > kBlock; g -= kBlock) {
    if (padded % g == 0) {
      group = g;
      break;
    }
  }
  return {segment, padded, group};
}

void WoInput::spread(float* row, int q_columns) const {
  if (!padded()) return;
  // From the last segment back: each moves to a place at or after its own, so none overwrites one not yet moved.
  for (int s = q_columns / segment - 1; s >= 0; --s) {
    float* to = row + static_cast<std::size_t>(s) * padded_segment;
    std::memmove(to, row + static_cast<std::size_t>(s) * segment, sizeof(float) * segment);
    std::fill(to + segment, to + padded_segment, 0.0f);
  }
}

std::vector<int> WoInput::bounds(int q_columns) const {
  std::vector<int> borders;
  for (int s = 0; s <= q_columns / segment; ++s) borders.push_back(s * padded_segment);
  return borders;
}

ShardWeights::ShardWeights(const std::string& path, const partition::ModelShape& shape,
                           const partition::RankShard& shard, const ShardWeightsOptions& options)
    : shape_(shape), shard_(shard), options_(options), file_(path) {
  const LoadWatch::Armed armed(options.load_watch);
  const ModelFile model = read_model_file(path);
  if (!(model.shape == shape)) {
    throw FormatError(fmt::format("'{}' holds a model of shape ({}) but ({}) was expected", path,
                                  model.shape.describe(), shape.describe()));
  }
  const CheckpointLayout& at = model.layout;
  const std::uint64_t d = shape.dim;
  const int hs = shape.head_size();
  const partition::Range all_dim{0, shape.dim};
  const partition::Range q_columns{shard.heads.begin * hs, shard.heads.end * hs};
  const int q_rows = q_columns.size(), kv_rows = shard.kv_heads.size() * hs, h_rows = shard.hidden.size();
  const std::uint64_t q_begin = q_columns.begin, kv_begin = shard.kv_heads.begin * hs, h_begin = shard.hidden.begin;

  if (shard.has_embedding) {
    // Looked up by token id, so any row may be needed; not populated: only rows actually used fault in (an
    // F16/BF16 embedding is widened whole, once, at load).
    token_embedding_ = map_floats(at.token_embedding, shape.vocab_size * d, false);
  }
  for (int l = shard.layers.begin; l < shard.layers.end; ++l) {
    LayerWeights w;
    const LayerTensors& t = at.layers[l];
    w.rms_att = map_floats(t.rms_att, d, true);
    w.rms_ffn = map_floats(t.rms_ffn, d, true);
    // Row slices (q/k/v, w1/w3: this rank's output features) and column slices (wo, w2: its input features).
    // int8 scales wo and w2 in groups (128, 96, 64 or 32 k) on which every valid layout's TP slices of their
    // k fall (WoInput, w2_int8_group): a slice is then grouped exactly as one rank groups those columns, so TP
    // ranks quantise the same weights as one rank on every layout. (The 110M shape: w2 per 128, 16 blocks
    // for at most 12 ranks; wo per 64, since tp=12 gives a rank one head of 64 columns.)
    // Groups of 128 scale a quarter as often as 32, which is what batched int8 decode spends its time on
    // (BENCHMARKS.md, issue #7). The other matrices are never sliced along k and take the widest of 128, 96,
    // 64 and 32 that divides k (kernels/cpu/weight_format.h).
    // q, k and v one after the other in one buffer: the grouped matmul then runs them as one matrix, its
    // tiles and prefetches across their borders (kernels/cpu/packed_matmul.h).
    const std::size_t q_bytes = kernels::cpu::packed_size_bytes(options_.dtype, q_rows, shape.dim);
    const std::size_t kv_bytes = kernels::cpu::packed_size_bytes(options_.dtype, kv_rows, shape.dim);
    std::byte* qkv = allocate_packed(q_bytes + 2 * kv_bytes);
    w.wq = convert(t.wq.at(q_begin * d), q_rows, shape.dim, all_dim, 0, qkv);
    w.wk = convert(t.wk.at(kv_begin * d), kv_rows, shape.dim, all_dim, 0, qkv + q_bytes);
    w.wv = convert(t.wv.at(kv_begin * d), kv_rows, shape.dim, all_dim, 0, qkv + q_bytes + kv_bytes);
    w.wo = convert_wo(t.wo, q_columns, runtime::wo_input(shape, options_.dtype));
    if (h_rows > 0) {  // a toy width can leave a TP rank no hidden features (partition::split_hidden)
      w.w1 = convert(t.w1.at(h_begin * d), h_rows, shape.dim, all_dim);
      w.w2 = convert(t.w2, shape.dim, shape.hidden_dim, shard.hidden, w2_int8_group(shape));
      w.w3 = convert(t.w3.at(h_begin * d), h_rows, shape.dim, all_dim);
    }
    layers_.push_back(w);
  }
  if (shard.has_classifier) {
    rms_final_ = map_floats(at.rms_final, d, true);
    classifier_ = convert(at.classifier.at(static_cast<std::uint64_t>(shard.vocab.begin) * d), shard.vocab.size(),
                          shape.dim, all_dim);
  }
}

std::uint64_t ShardWeights::arena_bytes_needed(const partition::ModelShape& shape, const partition::RankShard& shard,
                                               WeightDtype dtype, bool copy_to_arena) {
  // Mirrors the constructor: every matrix it converts, and with copy_to_arena every range it maps.
  const int d = shape.dim, hs = shape.head_size();
  const int q_rows = shard.heads.size() * hs, kv_rows = shard.kv_heads.size() * hs, h_rows = shard.hidden.size();
  const std::uint64_t n_layers = shard.layers.size();
  auto packed = [&](int rows, int cols, int int8_group = 0) {
    return kernels::cpu::packed_size_bytes(dtype, rows, cols, int8_group) + 64;
  };
  // (q, k and v share one allocation, so their three alignment pads overestimate it by two.)
  const WoInput wo = runtime::wo_input(shape, dtype);
  const std::uint64_t mlp = h_rows > 0 ? 2 * packed(h_rows, d) + packed(d, h_rows, w2_int8_group(shape)) : 0;
  std::uint64_t bytes = n_layers * (packed(q_rows, d) + 2 * packed(kv_rows, d) +
                                    packed(d, wo.packed_k(q_rows), wo.int8_group) + mlp);
  if (shard.has_classifier) bytes += packed(shard.vocab.size(), d);
  if (copy_to_arena) {
    std::uint64_t floats = n_layers * 2 * static_cast<std::uint64_t>(d);
    if (shard.has_embedding) floats += static_cast<std::uint64_t>(shape.vocab_size) * d;
    if (shard.has_classifier) floats += d;  // rms_final
    bytes += floats * kF + (n_layers * 2 + 2) * 64;
  }
  return bytes;
}

const float* ShardWeights::map_floats(TensorRef tensor, std::uint64_t n_floats, bool populate) {
  const bool into_arena = options_.copy_to_arena && options_.arena;
  if (tensor.element != TensorElement::kF32 || into_arena) {
    // Copied (F32) or decoded into the arena or an owned buffer, its pages read in slices, each progress.
    float* dst = nullptr;
    if (into_arena) {
      dst = options_.arena->allocate<float>(n_floats);
    } else {
      widened_.emplace_back(n_floats);
      dst = widened_.back().data();
    }
    decode_tensor(file_, tensor, n_floats, dst, options_.load_watch);
    copied_bytes_ += n_floats * kF;
    return dst;
  }
  regions_.push_back(file_.map(tensor.offset, n_floats * kF, {.populate = populate, .numa_node = options_.numa_node}));
  mapped_bytes_ += n_floats * kF;
  load_progress(options_.load_watch);
  return regions_.back().as<float>();
}

std::byte* ShardWeights::allocate_packed(std::size_t bytes) {
  if (options_.arena) {
    return static_cast<std::byte*>(options_.arena->allocate_bytes(bytes, kernels::cpu::kPackedAlignment));
  }
  converted_.push_back(allocate_weight_memory(bytes));
  return converted_.back().get();
}

const float* ShardWeights::matrix_floats(TensorRef matrix, std::uint64_t n, std::optional<memory::MappedRegion>& mapped,
                                        std::unique_ptr<float[]>& widened) {
  // Other elements than F32 go through fp32 first (a temporary of the slice's rows), which the packers take.
  // Not value-initialised: the widening's threads are the first to touch its pages (a zeroing pass would
  // be a serial write of every byte before them).
  if (matrix.element == TensorElement::kF32) {
    mapped.emplace(file_.map(matrix.offset, n * kF, {.populate = false}));
    populate(*mapped, options_.load_watch);
    return mapped->as<float>();
  }
  widened.reset(new float[n]);
  decode_tensor(file_, matrix, n, widened.get(), options_.load_watch);
  return widened.get();
}

PackedMatrix ShardWeights::convert(TensorRef matrix, int rows, int cols, partition::Range columns, int int8_group,
                                   std::byte* into) {
  // The mapping is dropped on return: its pages were only read to convert this rank's part, so they do not
  // stay in the rank's resident set. A column slice maps every row whole (its columns are strided).
  std::optional<memory::MappedRegion> source;
  std::unique_ptr<float[]> widened;
  const float* floats = matrix_floats(matrix, static_cast<std::uint64_t>(rows) * cols, source, widened);
  return pack(floats + columns.begin, cols, rows, columns.size(), int8_group, into);
}

PackedMatrix ShardWeights::pack(const float* w, std::size_t row_stride, int rows, int k, int int8_group,
                                std::byte* into) {
  PackedMatrix m{options_.dtype, rows, k, nullptr, options_.dtype == kernels::cpu::WeightDtype::kInt8 ? int8_group : 0};
  std::byte* dst = into != nullptr ? into : allocate_packed(m.size_bytes());
  kernels::cpu::pack_weights(m.dtype, w, row_stride, m.d, m.k, dst, m.int8_group);
  m.data = dst;
  repacked_bytes_ += m.size_bytes();
  load_progress(options_.load_watch);
  return m;
}

PackedMatrix ShardWeights::convert_wo(TensorRef matrix, partition::Range columns, const WoInput& input) {
  const int dim = shape_.dim;
  if (!input.padded()) return convert(matrix, dim, dim, columns, input.int8_group);
  SL_CHECK(columns.begin % input.segment == 0 && columns.size() % input.segment == 0);  // whole kv heads
  // Each row's slice spread to its padded segments in a temporary, then packed as a (dim, packed k) matrix.
  const int k = input.packed_k(columns.size());
  std::vector<float> spread(static_cast<std::size_t>(dim) * k);
  {
    std::optional<memory::MappedRegion> source;
    std::unique_ptr<float[]> widened;
    const float* floats = matrix_floats(matrix, static_cast<std::uint64_t>(dim) * dim, source, widened);
    for (int r = 0; r < dim; ++r) {
      float* row = spread.data() + static_cast<std::size_t>(r) * k;
      std::memcpy(row, floats + static_cast<std::size_t>(r) * dim + columns.begin, sizeof(float) * columns.size());
      input.spread(row, columns.size());
    }
  }
  return pack(spread.data(), k, dim, k, input.int8_group, nullptr);
}

std::vector<kernels::cpu::ReadRegion> ShardWeights::streamed_regions() const {
  std::vector<kernels::cpu::ReadRegion> regions;
  auto add = [&](const PackedMatrix& m) {
    if (m.data != nullptr) regions.push_back({m.data, m.size_bytes()});
  };
  for (const LayerWeights& w : layers_) {
    for (const PackedMatrix* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w1, &w.w3, &w.w2}) add(*m);
  }
  if (classifier_.data != nullptr) add(classifier_);
  return regions;
}

}  // namespace shardline::runtime
