#include "runtime/cuda_stage.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "comm/nccl_communicator.h"
#include "common/error.h"
#include "common/log.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/ops.h"
#include "memory/mapped_file.h"
#include "runtime/checkpoint.h"
#include "runtime/load_watch.h"
#include "runtime/tensor_decode.h"

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
    if (mesh.pp_size() > 1) {
      // The ranks of equal tp_rank over all stages, in stage order: group rank = pp_rank. Made after the TP
      // groups on every rank, so the collective set-ups line up.
      std::vector<int> pp_ranks;
      for (int p = 0; p < mesh.pp_size(); ++p) pp_ranks.push_back(mesh.rank_of(p, mesh.tp_rank()));
      pp_comm_ = comm::make_nccl_group(pp_ranks, {options.device, options.comm_timeout_s, stream_.ref().raw});
      pp_rank_ = mesh.pp_rank();
    }
    const int hs = shape.head_size();
    q_dim_ = shard.heads.size() * hs;
    kv_dim_ = shard.kv_heads.size() * hs;
    hidden_ = shard.hidden.size();
    upload_weights();
    // The scores scratch holds StageOptions::context positions (the engine's initial context, not seq_len: a
    // GGUF's 128K context_length made it gigabytes for a prefill chunk); a longer row grows it (reserve_context).
    ctx_capacity_ = Stage::context_positions(shape, options.stage.context);
    make_kv_pool();
    reserve_rows(options.stage.max_rows);
  }

  std::string describe() const override { return fmt::format("cuda:{} ({})", options_.device, device_name_); }
  const partition::ModelShape& shape() const override { return shape_; }

  KvCache make_kv_cache(int n_positions) override {
    // Bookkeeping only: one float of one layer per position in the host id pool; rows live on the device.
    return KvCache(*id_pool_, 1, 1, 1, options_.stage.kv_block_tokens, n_positions > 0 ? n_positions : shape_.seq_len);
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

  bool moves_activations() const override { return pp_comm_ != nullptr; }
  void recv_activations(int n) override;
  void forward_resident(const float* x, const Row* rows, int n) override;
  std::unique_ptr<comm::PendingSend> isend_activations(int n) override;
  void download_activations(float* x, int n) override;

 private:
  const float* file_floats(std::uint64_t offset_bytes) const {
    return reinterpret_cast<const float*>(whole_file_.data() + offset_bytes);
  }
  void upload_weights();
  void make_kv_pool();
  // Sizes scores_ for rows of up to `positions` of context: grows ctx_capacity_ (at least doubling, at most
  // seq_len) and drops the captured graphs, which hold the old buffer and its stride.
  void reserve_context(int positions);
  // Uploads positions, query tables, context lengths and block tables of one call.
  void upload_rows(const Row* rows, int n);
  // Queues every layer for rows [0, n) on the compute stream: device data only, so it can be captured.
  void queue_layers(int n);
  // One layer's attention block or feed-forward block for rows [r0, r1): reads x_, leaves the block's
  // output, before the TP sum, in out_'s rows [r0, r1).
  void queue_attention(int l, int r0, int r1);
  void queue_ffn(int l, int r0, int r1);
  // Runs queue_layers(n) as a CUDA graph when the policy above allows, else eagerly.
  void run_layers(int n);
  // Waits for the compute stream, bounded by --comm-timeout while NCCL work may be in it.
  void wait(const char* what);

  partition::ModelShape shape_;
  partition::RankShard shard_;
  CudaStageOptions options_;
  memory::MappedFile file_;
  // The whole checkpoint, mapped without populating: matrices are read once while uploading; the embedding
  // rows are read per token on the first stage.
  memory::MappedRegion whole_file_;
  const float* embedding_ = nullptr;  // (vocab, dim): the host mapping, or decoded_embedding_
  std::unique_ptr<float[]> decoded_embedding_;  // a file's F16, BF16 or quantised embedding as fp32
  cuda::DeviceBuffer rope_divisors_;      // empty, or (head_size / 2): the file's RoPE frequency factors
  std::string device_name_;
  cuda::Stream stream_;
  std::unique_ptr<comm::NcclCommunicator> tp_comm_;  // null for tp = 1
  std::unique_ptr<comm::NcclCommunicator> pp_comm_;  // null for pp = 1: activations to and from neighbour stages
  int pp_rank_ = 0;
  // Copies of sent activations, (max_rows, dim) each, while their sends are in flight: x_ is the next item's.
  std::vector<cuda::DeviceBuffer> send_buffers_;
  std::vector<int> free_send_buffers_;
  friend struct ActivationSend;
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
  cuda::DeviceBuffer scores_;        // (rows, local heads, ctx_capacity_)
  int ctx_capacity_ = 0;             // positions a (row, head) of scores_ holds
  cuda::DeviceBuffer row_ints_;      // positions (rows) | query table (rows) | n_ctx (rows) | tables (rows, max_blocks)
  std::vector<int> host_ints_;       // the same, staged on the host
  cuda::DeviceBuffer local_logits_;  // (rows, vocab slice)
  cuda::DeviceBuffer gathered_;      // (rows, vocab) in TP rank order, tp > 1 only
  std::vector<float> host_gathered_; // (rows, vocab)
  std::vector<const KvCache*> tables_;  // distinct caches of the current call, in table order

  std::map<int, cuda::Graph> graphs_;  // captured layers by row count
  std::map<int, int> eager_calls_;     // calls per row count before its capture
  bool graphs_failed_ = false;         // a capture failed: eager launches from then on
};

void CudaStage::upload_weights() {
  const LoadWatch::Armed armed(options_.load_watch);
  const ModelFile model = read_model_file(file_.path());
  const CheckpointLayout& layout = model.layout;
  if (!model.rope_freq_divisors.empty()) {  // Llama 3.1's RoPE factors
    rope_divisors_ = upload_floats(model.rope_freq_divisors.data(), model.rope_freq_divisors.size());
  }
  // F32 tensors are uploaded straight from the mapped file; others (a GGUF file's F16, BF16 and block formats,
  // llama2.c's Q8_0) are decoded to fp32 on the host first, as the CPU stage's loader decodes them
  // (runtime/tensor_decode.h), one layer's at a time.
  whole_file_ = file_.map(0, file_.size_bytes(), memory::MapOptions{false, -1});
  const auto dtype = device_dtype(options_.weights_dtype);
  const std::size_t dim = shape_.dim, hidden_full = shape_.hidden_dim;
  const int hs = shape_.head_size();
  const std::size_t q0 = static_cast<std::size_t>(shard_.heads.begin) * hs;
  const std::size_t kv0 = static_cast<std::size_t>(shard_.kv_heads.begin) * hs;
  const std::size_t h0 = shard_.hidden.begin;
  // n values of a tensor as fp32 host memory: the mapping itself for F32, else decoded into `buffer`, which
  // the caller frees once the (synchronous) upload has read it. Not value-initialised: the decode writes
  // every value (a zeroing pass would be a serial write of every byte first).
  auto host_floats = [&](TensorRef tensor, std::uint64_t n, std::unique_ptr<float[]>& buffer) -> const float* {
    load_progress(options_.load_watch);  // (per tensor: the previous one is uploaded)
    if (tensor.element == TensorElement::kF32) return file_floats(tensor.offset);
    buffer.reset(new float[n]);
    decode_tensor(file_, tensor, n, buffer.get(), options_.load_watch);
    return buffer.get();
  };
  std::unique_ptr<float[]> buffer;
  auto upload_vector = [&](TensorRef tensor, std::size_t n) { return upload_floats(host_floats(tensor, n, buffer), n); };
  // Rows [0, rows) x columns [column0, column0 + cols) of a matrix of row_stride columns, whose first row is at
  // `tensor` (decoded whole rows: a column slice's rows are read in full).
  auto upload_matrix = [&](TensorRef tensor, std::size_t row_stride, int rows, std::size_t column0, int cols) {
    return cuda::DeviceMatrix::upload(host_floats(tensor, rows * row_stride, buffer) + column0, row_stride, rows, cols,
                                      dtype);
  };
  for (int g = shard_.layers.begin; g < shard_.layers.end; ++g) {
    DeviceLayer layer;
    const LayerTensors& t = layout.layers[g];
    layer.rms_att = upload_vector(t.rms_att, dim);
    layer.rms_ffn = upload_vector(t.rms_ffn, dim);
    // Row slices (output features) of q, k, v, w1, w3; column slices (input features) of wo and w2.
    layer.wq = upload_matrix(t.wq.at(q0 * dim), dim, q_dim_, 0, dim);
    layer.wk = upload_matrix(t.wk.at(kv0 * dim), dim, kv_dim_, 0, dim);
    layer.wv = upload_matrix(t.wv.at(kv0 * dim), dim, kv_dim_, 0, dim);
    layer.wo = upload_matrix(t.wo, dim, dim, q0, q_dim_);
    layer.w1 = upload_matrix(t.w1.at(h0 * dim), dim, hidden_, 0, dim);
    layer.w3 = upload_matrix(t.w3.at(h0 * dim), dim, hidden_, 0, dim);
    layer.w2 = upload_matrix(t.w2, hidden_full, dim, h0, hidden_);
    layers_.push_back(std::move(layer));
  }
  if (shard_.has_embedding) {
    // Looked up per token on the host: mapped in place, or decoded whole once.
    const std::size_t values = static_cast<std::size_t>(shape_.vocab_size) * dim;
    embedding_ = host_floats(layout.token_embedding, values, decoded_embedding_);
  }
  if (shard_.has_classifier) {
    rms_final_ = upload_vector(layout.rms_final, dim);
    classifier_ = upload_matrix(layout.classifier.at(shard_.vocab.begin * dim), dim, shard_.vocab.size(), 0, dim);
  }
  buffer.reset();
  max_k_ = std::max({static_cast<int>(dim), q_dim_, hidden_});
}

void CudaStage::make_kv_pool() {
  const int bt = options_.stage.kv_block_tokens;
  const int n_layers = shard_.layers.size();
  block_floats_ = static_cast<std::size_t>(n_layers) * 2 * bt * kv_dim_;
  max_blocks_ = kv_blocks_for(shape_.seq_len);
  int n_blocks = options_.stage.kv_blocks;
  const std::uint64_t device_bytes = cuda::device_properties(options_.device).memory_bytes;
  const std::uint64_t block_bytes = block_floats_ * sizeof(float);
  if (n_blocks == 0) {
    const double budget = kKvDeviceShare * static_cast<double>(device_bytes);
    // At least one full context (in 64 bits: 64 contexts of a 2^31-token context overflowed an int): a single
    // long sequence the device can hold is never refused for the 40% share.
    n_blocks = default_kv_blocks(max_blocks_, block_bytes, static_cast<std::uint64_t>(budget), /*floor_blocks=*/max_blocks_);
  } else {
    // Before the host id pool, whose free list alone takes a byte a block.
    check_kv_blocks_fit(n_blocks, block_bytes, bt, device_bytes, "the GPU's memory");
  }
  id_pool_ = std::make_unique<memory::KvBlockPool>(
      memory::KvBlockPoolOptions{KvCache::block_bytes(1, 1, 1, bt), n_blocks, options_.stage.numa_node});
  kv_pool_ = cuda::DeviceBuffer(static_cast<std::size_t>(n_blocks) * block_floats_ * sizeof(float));
}

void CudaStage::reserve_rows(int rows) {
  if (rows <= scratch_rows_) return;
  // Captured graphs hold the old buffers' addresses and row stride.
  graphs_.clear();
  eager_calls_.clear();
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
  scores_ = cuda::DeviceBuffer(r * shard_.heads.size() * ctx_capacity_ * f);
  host_ints_.assign(r * (3 + max_blocks_), 0);
  row_ints_ = cuda::DeviceBuffer(host_ints_.size() * sizeof(int));
  if (shard_.has_classifier) {
    local_logits_ = cuda::DeviceBuffer(r * shard_.vocab.size() * f);
    if (tp_comm_) gathered_ = cuda::DeviceBuffer(r * shape_.vocab_size * f);
  }
  scratch_rows_ = rows;
}

void CudaStage::reserve_context(int positions) {
  if (positions <= ctx_capacity_) return;
  const int grown = std::min(shape_.seq_len, std::max(positions, 2 * ctx_capacity_));
  graphs_.clear();
  eager_calls_.clear();
  scores_ = cuda::DeviceBuffer();  // freed first: the old and the new scratch need not fit together
  scores_ = cuda::DeviceBuffer(static_cast<std::size_t>(scratch_rows_) * shard_.heads.size() * grown * sizeof(float));
  ctx_capacity_ = grown;  // once the scratch holds it
}

void CudaStage::upload_rows(const Row* rows, int n) {
  int longest = 0;
  for (int r = 0; r < n; ++r) longest = std::max(longest, rows[r].pos + 1);
  reserve_context(longest);  // before anything is queued: a grown scratch drops the captured graphs
  const int stride = scratch_rows_;
  int* positions = host_ints_.data();
  int* query_table = positions + stride;
  int* n_ctx = query_table + stride;
  int* tables = n_ctx + stride;
  tables_.clear();
  for (int r = 0; r < n; ++r) {
    KvCache& cache = *rows[r].cache;
    cache.reserve_through(rows[r].pos);
    const auto found = std::find(tables_.begin(), tables_.end(), &cache);
    const int table = static_cast<int>(found - tables_.begin());
    if (found == tables_.end()) tables_.push_back(&cache);
    positions[r] = rows[r].pos;
    query_table[r] = table;
    n_ctx[r] = rows[r].pos + 1;
  }
  // A cache's table is written after its last row reserved, so it covers every row of the call.
  for (std::size_t t = 0; t < tables_.size(); ++t) {
    const auto& ids = tables_[t]->block_table();
    std::copy(ids.begin(), ids.end(), tables + t * max_blocks_);
  }
  const std::size_t used = 3 * static_cast<std::size_t>(stride) + tables_.size() * max_blocks_;
  cuda::copy_to_device_async(row_ints_.data(), host_ints_.data(), used * sizeof(int), stream_.ref());
}

void CudaStage::queue_attention(int l, int r0, int r1) {
  const DeviceLayer& w = layers_[l];
  const auto s = stream_.ref();
  const int n = r1 - r0, dim = shape_.dim, hs = shape_.head_size();
  const int n_heads = shard_.heads.size(), n_kv_heads = shard_.kv_heads.size();
  const int* d_positions = row_ints_.as<int>() + r0;
  const int* d_query_table = row_ints_.as<int>() + scratch_rows_ + r0;
  const int* d_n_ctx = row_ints_.as<int>() + 2 * scratch_rows_ + r0;
  const int* d_tables = row_ints_.as<int>() + 3 * scratch_rows_;
  const std::size_t x0 = static_cast<std::size_t>(r0) * dim;
  float* xb = xb_.as<float>() + x0;
  float* q = q_.as<float>() + static_cast<std::size_t>(r0) * q_dim_;
  float* k = k_.as<float>() + static_cast<std::size_t>(r0) * kv_dim_;
  float* v = v_.as<float>() + static_cast<std::size_t>(r0) * kv_dim_;
  float* att = att_.as<float>() + static_cast<std::size_t>(r0) * q_dim_;
  cuda::rmsnorm(xb, x_.as<float>() + x0, w.rms_att.as<float>(), n, dim, options_.stage.rms_eps, s);
  blas_->matmul(q, xb, w.wq.view(), n, s);
  blas_->matmul(k, xb, w.wk.view(), n, s);
  blas_->matmul(v, xb, w.wv.view(), n, s);
  const float* divisors = rope_divisors_.bytes() > 0 ? rope_divisors_.as<float>() : nullptr;
  cuda::rope(q, d_positions, n, n_heads, hs, options_.stage.rope_theta, divisors, s);
  cuda::rope(k, d_positions, n, n_kv_heads, hs, options_.stage.rope_theta, divisors, s);
  // Each row's key and value into its block, addressed on the device (a replayed graph's rows move on).
  cuda::PagedKvWrite kw;
  kw.kv_pool = kv_pool_.as<float>();
  kw.block_floats = block_floats_;
  kw.layer = l;
  kw.block_tokens = options_.stage.kv_block_tokens;
  kw.block_tables = d_tables;
  kw.max_blocks_per_table = max_blocks_;
  kw.query_table = d_query_table;
  kw.positions = d_positions;
  kw.k = k;
  kw.v = v;
  kw.n_queries = n;
  kw.kv_stride = kv_dim_;
  cuda::kv_write_paged(kw, s);
  cuda::PagedAttention a;
  a.out = att;
  a.q = q;
  a.kv_pool = kv_pool_.as<float>();
  a.block_floats = block_floats_;
  a.layer = l;
  a.block_tokens = options_.stage.kv_block_tokens;
  a.block_tables = d_tables;
  a.max_blocks_per_table = max_blocks_;
  a.query_table = d_query_table;
  a.query_n_ctx = d_n_ctx;
  a.n_queries = n;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.head_size = hs;
  a.kv_stride = kv_dim_;
  a.max_ctx = ctx_capacity_;  // the scratch stride: constant between growths, so a captured step fits every context
  a.scratch = scores_.as<float>();
  cuda::attention_paged(a, s);
  blas_->matmul(out_.as<float>() + x0, att, w.wo.view(), n, s);  // TP: partial sums over heads
}

void CudaStage::queue_ffn(int l, int r0, int r1) {
  const DeviceLayer& w = layers_[l];
  const auto s = stream_.ref();
  const int n = r1 - r0, dim = shape_.dim;
  const std::size_t x0 = static_cast<std::size_t>(r0) * dim;
  float* xb = xb_.as<float>() + x0;
  float* hb = hb_.as<float>() + static_cast<std::size_t>(r0) * hidden_;
  float* hb2 = hb2_.as<float>() + static_cast<std::size_t>(r0) * hidden_;
  cuda::rmsnorm(xb, x_.as<float>() + x0, w.rms_ffn.as<float>(), n, dim, options_.stage.rms_eps, s);
  blas_->matmul(hb, xb, w.w1.view(), n, s);
  blas_->matmul(hb2, xb, w.w3.view(), n, s);
  cuda::swiglu(hb, hb2, static_cast<std::size_t>(n) * hidden_, s);
  blas_->matmul(out_.as<float>() + x0, hb, w.w2.view(), n, s);  // TP: partial sums over hidden features
}

void CudaStage::queue_layers(int n) {
  const auto s = stream_.ref();
  const int dim = shape_.dim;
  // Row ranges ("halves") pipelined against their all-reduces: block b of half h is computed while the
  // all-reduce of block b of the other half (or block b-1 of h's successor) is in flight; h's residual add
  // waits only for h's own all-reduce. Without TP there is nothing to overlap; decode steps stay whole.
  const bool split = tp_comm_ && n >= std::max(2, options_.overlap_min_rows);
  const int bounds[3] = {0, split ? n / 2 : n, n};
  const int n_halves = split ? 2 : 1;
  int pending[2] = {-1, -1};  // each half's all-reduce ticket not yet added into x
  auto finish = [&](int h) {  // the residual add of h's last block, after its TP sum
    const std::size_t x0 = static_cast<std::size_t>(bounds[h]) * dim;
    const std::size_t count = static_cast<std::size_t>(bounds[h + 1] - bounds[h]) * dim;
    if (pending[h] >= 0) tp_comm_->all_reduce_join(pending[h], s.raw);
    pending[h] = -1;
    cuda::add_inplace(x_.as<float>() + x0, out_.as<float>() + x0, count, s);
  };
  bool first = true;
  for (int l = 0; l < static_cast<int>(layers_.size()); ++l) {
    for (int block = 0; block < 2; ++block) {
      for (int h = 0; h < n_halves; ++h) {
        if (!first) finish(h);
        if (block == 0) {
          queue_attention(l, bounds[h], bounds[h + 1]);
        } else {
          queue_ffn(l, bounds[h], bounds[h + 1]);
        }
        if (tp_comm_) {
          pending[h] = tp_comm_->all_reduce_sum_start(out_.as<float>() + static_cast<std::size_t>(bounds[h]) * dim,
                                                      static_cast<std::size_t>(bounds[h + 1] - bounds[h]) * dim, s.raw);
        }
      }
      first = false;
    }
  }
  for (int h = 0; h < n_halves; ++h) finish(h);
}

void CudaStage::run_layers(int n) {
  if (!options_.graphs || graphs_failed_ || n > options_.graph_max_rows) return queue_layers(n);
  const auto found = graphs_.find(n);
  if (found != graphs_.end()) return found->second.launch(stream_.ref());
  if (eager_calls_[n]++ == 0) return queue_layers(n);  // lazy library set-up happens outside any capture
  try {
    cuda::Graph graph = cuda::Graph::capture(stream_, [&] { queue_layers(n); });
    graph.launch(stream_.ref());
    graphs_.emplace(n, std::move(graph));
  } catch (const ResourceError& e) {
    // Nothing ran during the failed capture: run this call eagerly, and every later one.
    graphs_failed_ = true;
    log::warn("CUDA graph capture of a {}-row step failed ({}); launching kernels one by one from now on", n, e.what());
    queue_layers(n);
  } catch (const CommError& e) {
    // NCCL refused the capture and its communicator is aborted: no eager fallback is possible in this run.
    throw CommError(fmt::format("{} (while capturing a CUDA graph; rerun with --cuda-graphs off)", e.what()));
  }
}

void CudaStage::wait(const char* what) {
  if (tp_comm_) {
    tp_comm_->synchronize(stream_.ref().raw, what);
  } else {
    stream_.synchronize();
  }
}

void CudaStage::forward(float* x, const Row* rows, int n) {
  SL_CHECK_MSG(n >= 1 && n <= scratch_rows_, "{} rows for a stage sized for {}", n, scratch_rows_);
  const auto s = stream_.ref();
  upload_rows(rows, n);
  const std::size_t bytes = static_cast<std::size_t>(n) * shape_.dim * sizeof(float);
  // Host copies stay outside the captured part: x is the caller's pageable memory.
  cuda::copy_to_device_async(x_.data(), x, bytes, s);
  run_layers(n);
  cuda::copy_to_host_async(x, x_.data(), bytes, s);
  wait("forward");
}

void CudaStage::recv_activations(int n) {
  SL_CHECK(pp_comm_ && pp_rank_ > 0 && n >= 1 && n <= scratch_rows_);
  // Into x_, the input of the next forward_resident; recv returns once the rows are there.
  pp_comm_->recv(x_.data(), static_cast<std::size_t>(n) * shape_.dim * sizeof(float), pp_rank_ - 1, 0);
}

void CudaStage::forward_resident(const float* x, const Row* rows, int n) {
  SL_CHECK_MSG(n >= 1 && n <= scratch_rows_, "{} rows for a stage sized for {}", n, scratch_rows_);
  const auto s = stream_.ref();
  upload_rows(rows, n);
  if (x) cuda::copy_to_device_async(x_.data(), x, static_cast<std::size_t>(n) * shape_.dim * sizeof(float), s);
  run_layers(n);
  wait("forward");
}

// A send of a copy of the activations; wait() hands the copy's buffer back to the stage.
struct ActivationSend final : comm::PendingSend {
  ActivationSend(CudaStage* stage, int buffer, std::unique_ptr<comm::PendingSend> send)
      : stage(stage), buffer(buffer), send(std::move(send)) {}
  void wait() override {
    if (!send) return;
    send->wait();
    send.reset();
    stage->free_send_buffers_.push_back(buffer);
  }
  CudaStage* stage;
  int buffer;
  std::unique_ptr<comm::PendingSend> send;  // null once waited
};

std::unique_ptr<comm::PendingSend> CudaStage::isend_activations(int n) {
  SL_CHECK(pp_comm_ && n >= 1 && n <= scratch_rows_);
  const std::size_t bytes = static_cast<std::size_t>(n) * shape_.dim * sizeof(float);
  if (free_send_buffers_.empty()) {
    // One per send in flight: at most the pipeline's window on stage 0, one on later stages.
    send_buffers_.emplace_back(static_cast<std::size_t>(scratch_rows_) * shape_.dim * sizeof(float));
    free_send_buffers_.push_back(static_cast<int>(send_buffers_.size()) - 1);
  }
  int buffer = free_send_buffers_.back();
  if (send_buffers_[buffer].bytes() < bytes) {  // sized before reserve_rows grew the stage
    send_buffers_[buffer] = cuda::DeviceBuffer(static_cast<std::size_t>(scratch_rows_) * shape_.dim * sizeof(float));
  }
  free_send_buffers_.pop_back();
  cuda::copy_device_to_device_async(send_buffers_[buffer].data(), x_.data(), bytes, stream_.ref());
  // The communicator's send waits (on the device) for the compute stream, so for the copy too.
  auto send = pp_comm_->isend(send_buffers_[buffer].data(), bytes, pp_rank_ + 1, 0);
  return std::make_unique<ActivationSend>(this, buffer, std::move(send));
}

void CudaStage::download_activations(float* x, int n) {
  SL_CHECK(n >= 1 && n <= scratch_rows_);
  cuda::copy_to_host_async(x, x_.data(), static_cast<std::size_t>(n) * shape_.dim * sizeof(float), stream_.ref());
  wait("activations download");
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
