#include "runtime/cuda_stage.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "comm/nccl_communicator.h"
#include "common/error.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/ops.h"
#include "memory/mapped_file.h"
#include "runtime/checkpoint.h"

namespace shardline::runtime {

namespace {

namespace cuda = kernels::cuda;

// Share of the device's memory the KV pool may take when --kv-blocks is automatic: the CPU default
// (kDefaultKvContexts full contexts) is only address space on the host, but device memory is real.
constexpr double kKvDeviceShare = 0.4;

cuda::DeviceDtype device_dtype(kernels::cpu::WeightDtype dtype) {
  switch (dtype) {
    case kernels::cpu::WeightDtype::kF32: return cuda::DeviceDtype::kF32;
    case kernels::cpu::WeightDtype::kBf16: return cuda::DeviceDtype::kBf16;
    default: break;
  }
  throw ConfigError(fmt::format("--weights-dtype {} runs on the CPU only; use fp32 or bf16 with --device cuda",
                                kernels::cpu::weight_dtype_name(dtype)));
}

cuda::DeviceBuffer upload_floats(const float* host, std::size_t count) {
  cuda::DeviceBuffer buffer(count * sizeof(float));
  cuda::copy_to_device(buffer.data(), host, count * sizeof(float));
  return buffer;
}

struct DeviceLayer {
  cuda::DeviceBuffer rms_att;  // (dim)
  cuda::DeviceMatrix wq;       // (q_dim, dim)
  cuda::DeviceMatrix wk;       // (kv_dim, dim)
  cuda::DeviceMatrix wv;       // (kv_dim, dim)
  cuda::DeviceMatrix wo;       // (dim, q_dim)
  cuda::DeviceBuffer rms_ffn;  // (dim)
  cuda::DeviceMatrix w1;       // (hidden, dim)
  cuda::DeviceMatrix w2;       // (dim, hidden)
  cuda::DeviceMatrix w3;       // (hidden, dim)
};

class CudaStage final : public StageBackend {
 public:
  CudaStage(const std::string& model_path, const partition::ModelShape& shape, const partition::RankShard& shard,
            const partition::Mesh& mesh, const CudaStageOptions& options)
      : shape_(shape), shard_(shard), options_(options), file_(model_path) {
    cuda::select_device(options.device);
    device_name_ = cuda::device_properties(options.device).name;
    stream_ = cuda::Stream(cuda::StreamPriority::kNormal);
    if (mesh.tp_size() > 1) {
      std::vector<int> tp_ranks;
      for (int t = 0; t < mesh.tp_size(); ++t) tp_ranks.push_back(mesh.rank_of(mesh.pp_rank(), t));
      tp_comm_ = comm::make_nccl_group(tp_ranks, {options.device, options.comm_timeout_s, stream_.ref().raw});
      for (int t = 0; t < mesh.tp_size(); ++t) {
        vocab_counts_.push_back(partition::split_evenly(shape.vocab_size, mesh.tp_size(), t).size());
      }
    }
    const int hs = shape.head_size();
    q_dim_ = shard.heads.size() * hs;
    kv_dim_ = shard.kv_heads.size() * hs;
    hidden_ = shard.hidden.size();
    upload_weights();
    make_kv_pool();
    reserve_rows(options.stage.max_rows);
  }

  std::string describe() const override { return fmt::format("cuda:{} ({})", options_.device, device_name_); }
  const partition::ModelShape& shape() const override { return shape_; }

  KvCache make_kv_cache(int n_positions) override {
    // Bookkeeping only: one float of one layer per position in the host id pool; rows live on the device.
    return KvCache(*id_pool_, 1, 1, options_.stage.kv_block_tokens, n_positions > 0 ? n_positions : shape_.seq_len);
  }
  int kv_blocks_for(int n_positions) const override {
    return KvCache::blocks_for(n_positions, options_.stage.kv_block_tokens);
  }
  const memory::KvBlockPool& kv_pool() const override { return *id_pool_; }

  void embed(const int* tokens, int n, float* x) override {
    SL_CHECK(shard_.has_embedding);
    const std::size_t dim = shape_.dim;
    for (int t = 0; t < n; ++t) {
      SL_CHECK(tokens[t] >= 0 && tokens[t] < shape_.vocab_size);
      std::memcpy(x + t * dim, embedding_ + static_cast<std::size_t>(tokens[t]) * dim, dim * sizeof(float));
    }
  }

  void forward(float* x, const Row* rows, int n) override;
  void logits(const float* x, int n, float* logits) override;

  int max_rows() const override { return scratch_rows_; }
  void reserve_rows(int max_rows) override;

 private:
  const float* file_floats(std::uint64_t offset_bytes) const {
    return reinterpret_cast<const float*>(whole_file_.data() + offset_bytes);
  }
  void upload_weights();
  void make_kv_pool();
  // Uploads positions, block tables and context lengths of one call; returns the longest context.
  int upload_rows(const Row* rows, int n);
  void all_reduce(float* data, std::size_t count) {
    if (tp_comm_) tp_comm_->all_reduce_sum(data, count);
  }

  partition::ModelShape shape_;
  partition::RankShard shard_;
  CudaStageOptions options_;
  memory::MappedFile file_;
  // The whole checkpoint, mapped without populating: matrices are read once while uploading; the embedding
  // rows are read per token on the first stage.
  memory::MappedRegion whole_file_;
  const float* embedding_ = nullptr;  // (vocab, dim), host mapping
  std::string device_name_;
  cuda::Stream stream_;
  std::unique_ptr<comm::NcclCommunicator> tp_comm_;  // null for tp = 1
  std::vector<int> vocab_counts_;                    // classifier rows per TP rank
  int q_dim_ = 0, kv_dim_ = 0, hidden_ = 0;

  std::vector<DeviceLayer> layers_;
  cuda::DeviceBuffer rms_final_;    // (dim)
  cuda::DeviceMatrix classifier_;   // (vocab slice, dim)
  int max_k_ = 0;                   // widest matmul input (sizes the Blas bf16 copy of x)

  std::unique_ptr<memory::KvBlockPool> id_pool_;  // block ids for KvCache; its memory is not the cache
  cuda::DeviceBuffer kv_pool_;                    // (n_blocks, n_layers, 2, block_tokens, kv_dim)
  std::size_t block_floats_ = 0;
  int max_blocks_ = 0;                            // blocks of one full context: the block table stride

  int scratch_rows_ = 0;
  std::unique_ptr<cuda::Blas> blas_;
  cuda::DeviceBuffer x_, xb_, q_, k_, v_, att_, hb_, hb2_, out_;  // (rows, dim | q_dim | kv_dim | hidden)
  cuda::DeviceBuffer scores_;        // (rows, local heads, seq_len)
  cuda::DeviceBuffer row_ints_;      // positions (rows) | query table (rows) | n_ctx (rows) | tables (rows, max_blocks)
  std::vector<int> host_ints_;       // the same, staged on the host
  cuda::DeviceBuffer local_logits_;  // (rows, vocab slice)
  cuda::DeviceBuffer gathered_;      // (rows, vocab) in TP rank order, tp > 1 only
  std::vector<float> host_gathered_; // (rows, vocab)
  std::vector<const KvCache*> tables_;  // distinct caches of the current call, in table order
};

void CudaStage::upload_weights() {
  const CheckpointLayout layout = checkpoint_layout(shape_);
  whole_file_ = file_.map(0, layout.total_bytes, memory::MapOptions{false, -1});
  const auto dtype = device_dtype(options_.weights_dtype);
  const std::size_t dim = shape_.dim, kv_full = shape_.kv_dim(), hidden_full = shape_.hidden_dim;
  const int hs = shape_.head_size();
  const std::size_t q0 = static_cast<std::size_t>(shard_.heads.begin) * hs;
  const std::size_t kv0 = static_cast<std::size_t>(shard_.kv_heads.begin) * hs;
  const std::size_t h0 = shard_.hidden.begin;
  constexpr std::size_t f = sizeof(float);
  for (int g = shard_.layers.begin; g < shard_.layers.end; ++g) {
    DeviceLayer layer;
    layer.rms_att = upload_floats(file_floats(layout.rms_att + g * dim * f), dim);
    layer.rms_ffn = upload_floats(file_floats(layout.rms_ffn + g * dim * f), dim);
    // Row slices (output features) of q, k, v, w1, w3; column slices (input features) of wo and w2.
    layer.wq = cuda::DeviceMatrix::upload(file_floats(layout.wq + (g * dim + q0) * dim * f), dim, q_dim_, dim, dtype);
    layer.wk = cuda::DeviceMatrix::upload(file_floats(layout.wk + (g * kv_full + kv0) * dim * f), dim, kv_dim_, dim, dtype);
    layer.wv = cuda::DeviceMatrix::upload(file_floats(layout.wv + (g * kv_full + kv0) * dim * f), dim, kv_dim_, dim, dtype);
    layer.wo = cuda::DeviceMatrix::upload(file_floats(layout.wo + (g * dim * dim + q0) * f), dim, dim, q_dim_, dtype);
    layer.w1 = cuda::DeviceMatrix::upload(file_floats(layout.w1 + (g * hidden_full + h0) * dim * f), dim, hidden_, dim, dtype);
    layer.w3 = cuda::DeviceMatrix::upload(file_floats(layout.w3 + (g * hidden_full + h0) * dim * f), dim, hidden_, dim, dtype);
    layer.w2 = cuda::DeviceMatrix::upload(file_floats(layout.w2 + (g * dim * hidden_full + h0) * f), hidden_full, dim,
                                          hidden_, dtype);
    layers_.push_back(std::move(layer));
  }
  if (shard_.has_embedding) embedding_ = file_floats(layout.token_embedding);
  if (shard_.has_classifier) {
    rms_final_ = upload_floats(file_floats(layout.rms_final), dim);
    classifier_ = cuda::DeviceMatrix::upload(file_floats(layout.classifier + shard_.vocab.begin * dim * f), dim,
                                             shard_.vocab.size(), dim, dtype);
  }
  max_k_ = std::max({static_cast<int>(dim), q_dim_, hidden_});
}

void CudaStage::make_kv_pool() {
  const int bt = options_.stage.kv_block_tokens;
  const int n_layers = shard_.layers.size();
  block_floats_ = static_cast<std::size_t>(n_layers) * 2 * bt * kv_dim_;
  max_blocks_ = kv_blocks_for(shape_.seq_len);
  int n_blocks = options_.stage.kv_blocks;
  if (n_blocks == 0) {
    const double budget = kKvDeviceShare * static_cast<double>(cuda::device_properties(options_.device).memory_bytes);
    const int fit = static_cast<int>(budget / (block_floats_ * sizeof(float)));
    n_blocks = std::max(max_blocks_, std::min(kDefaultKvContexts * max_blocks_, fit));
  }
  id_pool_ = std::make_unique<memory::KvBlockPool>(
      memory::KvBlockPoolOptions{KvCache::block_bytes(1, 1, bt), n_blocks, options_.stage.numa_node});
  kv_pool_ = cuda::DeviceBuffer(static_cast<std::size_t>(n_blocks) * block_floats_ * sizeof(float));
}

void CudaStage::reserve_rows(int rows) {
  if (rows <= scratch_rows_) return;
  const std::size_t r = rows, dim = shape_.dim;
  constexpr std::size_t f = sizeof(float);
  blas_ = std::make_unique<cuda::Blas>(cuda::BlasOptions{rows, max_k_});
  x_ = cuda::DeviceBuffer(r * dim * f);
  xb_ = cuda::DeviceBuffer(r * dim * f);
  out_ = cuda::DeviceBuffer(r * dim * f);
  q_ = cuda::DeviceBuffer(r * q_dim_ * f);
  att_ = cuda::DeviceBuffer(r * q_dim_ * f);
  k_ = cuda::DeviceBuffer(r * kv_dim_ * f);
  v_ = cuda::DeviceBuffer(r * kv_dim_ * f);
  hb_ = cuda::DeviceBuffer(r * std::max(hidden_, 1) * f);
  hb2_ = cuda::DeviceBuffer(r * std::max(hidden_, 1) * f);
  scores_ = cuda::DeviceBuffer(r * shard_.heads.size() * shape_.seq_len * f);
  host_ints_.assign(r * (3 + max_blocks_), 0);
  row_ints_ = cuda::DeviceBuffer(host_ints_.size() * sizeof(int));
  if (shard_.has_classifier) {
    local_logits_ = cuda::DeviceBuffer(r * shard_.vocab.size() * f);
    if (tp_comm_) gathered_ = cuda::DeviceBuffer(r * shape_.vocab_size * f);
  }
  scratch_rows_ = rows;
}

int CudaStage::upload_rows(const Row* rows, int n) {
  const int stride = scratch_rows_;
  int* positions = host_ints_.data();
  int* query_table = positions + stride;
  int* n_ctx = query_table + stride;
  int* tables = n_ctx + stride;
  tables_.clear();
  int longest = 1;
  for (int r = 0; r < n; ++r) {
    KvCache& cache = *rows[r].cache;
    cache.reserve_through(rows[r].pos);
    const auto found = std::find(tables_.begin(), tables_.end(), &cache);
    const int table = static_cast<int>(found - tables_.begin());
    if (found == tables_.end()) tables_.push_back(&cache);
    positions[r] = rows[r].pos;
    query_table[r] = table;
    n_ctx[r] = rows[r].pos + 1;
    longest = std::max(longest, n_ctx[r]);
  }
  // A cache's table is written after its last row reserved, so it covers every row of the call.
  for (std::size_t t = 0; t < tables_.size(); ++t) {
    const auto& ids = tables_[t]->block_table();
    std::copy(ids.begin(), ids.end(), tables + t * max_blocks_);
  }
  const std::size_t used = 3 * static_cast<std::size_t>(stride) + tables_.size() * max_blocks_;
  cuda::copy_to_device_async(row_ints_.data(), host_ints_.data(), used * sizeof(int), stream_.ref());
  return longest;
}

void CudaStage::forward(float* x, const Row* rows, int n) {
  SL_CHECK_MSG(n >= 1 && n <= scratch_rows_, "{} rows for a stage sized for {}", n, scratch_rows_);
  const auto s = stream_.ref();
  const int dim = shape_.dim, hs = shape_.head_size(), bt = options_.stage.kv_block_tokens;
  const int n_heads = shard_.heads.size(), n_kv_heads = shard_.kv_heads.size();
  const float eps = options_.stage.rms_eps, theta = options_.stage.rope_theta;
  const int longest = upload_rows(rows, n);
  const int* d_positions = row_ints_.as<int>();
  float* xd = x_.as<float>();
  float* xb = xb_.as<float>();
  float* out = out_.as<float>();
  float* q = q_.as<float>();
  float* k = k_.as<float>();
  float* v = v_.as<float>();
  float* pool = kv_pool_.as<float>();
  cuda::copy_to_device_async(xd, x, static_cast<std::size_t>(n) * dim * sizeof(float), s);
  for (int l = 0; l < static_cast<int>(layers_.size()); ++l) {
    const DeviceLayer& w = layers_[l];
    cuda::rmsnorm(xb, xd, w.rms_att.as<float>(), n, dim, eps, s);
    blas_->matmul(q, xb, w.wq.view(), n, s);
    blas_->matmul(k, xb, w.wk.view(), n, s);
    blas_->matmul(v, xb, w.wv.view(), n, s);
    cuda::rope(q, d_positions, n, n_heads, hs, theta, s);
    cuda::rope(k, d_positions, n, n_kv_heads, hs, theta, s);
    // Each row's key and value into its block: row p % bt of block table[p / bt], this layer's halves.
    for (int r = 0; r < n; ++r) {
      const int pos = rows[r].pos;
      const std::size_t block = rows[r].cache->block_table()[pos / bt];
      float* base = pool + block * block_floats_ + static_cast<std::size_t>(pos % bt) * kv_dim_;
      const std::size_t half = static_cast<std::size_t>(bt) * kv_dim_;
      const std::size_t row_bytes = static_cast<std::size_t>(kv_dim_) * sizeof(float);
      cuda::copy_device_to_device_async(base + (2 * l) * half, k + static_cast<std::size_t>(r) * kv_dim_, row_bytes, s);
      cuda::copy_device_to_device_async(base + (2 * l + 1) * half, v + static_cast<std::size_t>(r) * kv_dim_, row_bytes, s);
    }
    cuda::PagedAttention a;
    a.out = att_.as<float>();
    a.q = q;
    a.kv_pool = pool;
    a.block_floats = block_floats_;
    a.layer = l;
    a.block_tokens = bt;
    a.block_tables = d_positions + 3 * scratch_rows_;
    a.max_blocks_per_table = max_blocks_;
    a.query_table = d_positions + scratch_rows_;
    a.query_n_ctx = d_positions + 2 * scratch_rows_;
    a.n_queries = n;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.head_size = hs;
    a.kv_stride = kv_dim_;
    a.max_ctx = longest;
    a.scratch = scores_.as<float>();
    cuda::attention_paged(a, s);
    blas_->matmul(out, att_.as<float>(), w.wo.view(), n, s);
    all_reduce(out, static_cast<std::size_t>(n) * dim);  // TP: partial sums over heads
    cuda::add_inplace(xd, out, static_cast<std::size_t>(n) * dim, s);

    cuda::rmsnorm(xb, xd, w.rms_ffn.as<float>(), n, dim, eps, s);
    blas_->matmul(hb_.as<float>(), xb, w.w1.view(), n, s);
    blas_->matmul(hb2_.as<float>(), xb, w.w3.view(), n, s);
    cuda::swiglu(hb_.as<float>(), hb2_.as<float>(), static_cast<std::size_t>(n) * hidden_, s);
    blas_->matmul(out, hb_.as<float>(), w.w2.view(), n, s);
    all_reduce(out, static_cast<std::size_t>(n) * dim);  // TP: partial sums over hidden features
    cuda::add_inplace(xd, out, static_cast<std::size_t>(n) * dim, s);
  }
  cuda::copy_to_host_async(x, xd, static_cast<std::size_t>(n) * dim * sizeof(float), s);
  stream_.synchronize();
}

void CudaStage::logits(const float* x, int n, float* logits) {
  SL_CHECK(shard_.has_classifier && n >= 1);
  if (n > scratch_rows_) reserve_rows(n);
  const auto s = stream_.ref();
  const std::size_t dim = shape_.dim, vocab = shape_.vocab_size, slice = shard_.vocab.size();
  cuda::copy_to_device_async(x_.data(), x, n * dim * sizeof(float), s);
  cuda::rmsnorm(xb_.as<float>(), x_.as<float>(), rms_final_.as<float>(), n, shape_.dim, options_.stage.rms_eps, s);
  blas_->matmul(local_logits_.as<float>(), xb_.as<float>(), classifier_.view(), n, s);
  if (!tp_comm_) {
    cuda::copy_to_host_async(logits, local_logits_.data(), n * slice * sizeof(float), s);
    stream_.synchronize();
    return;
  }
  // As the CPU stage: the gather stacks each rank's (n, slice) block in rank order; each row's logits are
  // the rank slices of that row side by side.
  std::vector<int> counts(vocab_counts_);
  for (int& c : counts) c *= n;
  tp_comm_->all_gather_v(local_logits_.as<float>(), gathered_.as<float>(), counts);
  host_gathered_.resize(n * vocab);
  cuda::copy_to_host_async(host_gathered_.data(), gathered_.data(), n * vocab * sizeof(float), s);
  stream_.synchronize();
  std::size_t block = 0;
  std::size_t column = 0;
  for (int count : vocab_counts_) {
    for (int r = 0; r < n; ++r) {
      std::memcpy(logits + r * vocab + column, host_gathered_.data() + block + static_cast<std::size_t>(r) * count,
                  count * sizeof(float));
    }
    block += static_cast<std::size_t>(count) * n;
    column += count;
  }
}

}  // namespace

std::unique_ptr<StageBackend> make_cuda_stage(const std::string& model_path, const partition::ModelShape& shape,
                                              const partition::RankShard& shard, const partition::Mesh& mesh,
                                              const CudaStageOptions& options) {
  return std::make_unique<CudaStage>(model_path, shape, shard, mesh, options);
}

}  // namespace shardline::runtime
