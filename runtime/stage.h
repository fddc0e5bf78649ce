// One rank's forward pass: its layers, its heads, its slice of the MLP and of the classifier.
// The communication points of the forward pass are all here, and only here:
//   after attention's wo:  the sum of the ranks' segment products (partial sums over kv heads) passed from
//                          rank to rank in segment order, then broadcast (partition::n_reduction_segments:
//                          one rank's bits)
//   after the MLP's w2:    the same over hidden segments (an all-reduce where hidden has fewer blocks of 32 than ranks)
//   after the classifier:  tp all-gather of the vocab slices (last stage)
// Activations between stages are moved by the pipeline (pipeline.h), not here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "memory/arena.h"
#include "memory/kv_block_pool.h"
#include "kernels/cpu/packed_matmul.h"
#include "runtime/kv_cache.h"
#include "runtime/shard_weights.h"
#include "runtime/stage_backend.h"

namespace shardline::runtime {

// KV pool size when StageOptions::kv_blocks is 0: this many full-context sequences. Only address space is
// reserved up front; blocks are committed as sequences reach them.
inline constexpr int kDefaultKvContexts = 64;
// The automatic pool's blocks: kDefaultKvContexts contexts of blocks_per_context, but no more than
// memory_bytes hold (memory the blocks could ever be committed in; 0: no such bound), and never fewer than
// floor_blocks (the Stage's: one context of its initial scratch, min(seq_len, 4096) positions, so that a
// misread memory figure cannot leave a pool no ordinary sequence fits in) or one.
// Why the bound: a GGUF with a 16M-token context made 64 contexts 128 TiB of address space, which no process
// may map, and its run was refused at start-up although its sequences were short; and a pool larger than
// the memory admits sequences the kernel then kills the rank for, where a bounded one queues them.
int default_kv_blocks(long long blocks_per_context, std::uint64_t block_bytes, std::uint64_t memory_bytes,
                      long long floor_blocks = 1);
// The memory bound the Stage gives default_kv_blocks: three quarters of this host's usable memory
// (MemAvailable within the cgroup's limit) shared by its ranks_on_host ranks, and half the address space
// RLIMIT_AS leaves; 0 when neither is known.
std::uint64_t kv_pool_memory_bound(int ranks_on_host);
// An explicit --kv-blocks: ResourceError (exit 4) naming the largest that fits when kv_blocks blocks of
// block_bytes are more than memory_bytes, which memory_what names ("the GPU's memory").
void check_kv_blocks_fit(long long kv_blocks, std::uint64_t block_bytes, int block_tokens, std::uint64_t memory_bytes,
                         const std::string& memory_what);
// check_kv_blocks_fit against this rank's share (ranks_on_host) of the host's usable memory; nothing when
// that memory is unknown.
void check_explicit_kv_blocks(long long kv_blocks, std::uint64_t block_bytes, int block_tokens, int ranks_on_host);
// Rows of segment products a TP rank sums at once (Stage::reduce_segments; partition/shard.h).
inline constexpr int kPartialRows = partition::kSegmentSumRows;
// A kernel thread's softmax weights for the rows it attends at once: 16 rows of a 110M shape's 12 heads at
// 1024 positions take 768 KiB, a 7B shape's 32 heads at 4096 positions take 8 rows, and a 128K context's
// one row alone takes more (Stage::attention_rows_at_once).
inline constexpr std::size_t kScoresBudgetBytes = std::size_t{4} << 20;

struct StageOptions {
  int max_rows = 64;  // most rows one forward call takes; sizes the scratch buffers
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  std::vector<float> rope_freq_divisors = {};  // ModelFile's: empty or (head_size / 2)
  int kv_block_tokens = 16;        // positions per KV cache block
  int kv_blocks = 0;               // blocks in this rank's KV pool; 0: default_kv_blocks
  int ranks_on_host = 1;           // ranks sharing this host's memory, for the automatic pool's bound
  // Positions the attention scratch is first sized for (0: the model's seq_len); a row at a later position
  // grows it. The scratch holds a thread's softmax weights (local heads x positions floats a row), so sized
  // for a GGUF's context_length of 128K or 1M it took gigabytes on a many-core rank however short the run.
  int context = 0;
  kernels::cpu::KvDtype kv_dtype = kernels::cpu::KvDtype::kF32;  // the KV cache's values (run --kv-dtype)
  int numa_node = -1;              // the KV pool's node (-1: unbound)
  memory::Arena* arena = nullptr;  // scratch comes from it (it must outlive the Stage); nullptr: a private one
};

// The CPU backend.
class Stage : public StageBackend {
 public:
  // tp_comm: this rank's TP group (solo for tp=1). Both must outlive the Stage.
  Stage(const ShardWeights& weights, comm::Communicator& tp_comm, const StageOptions& options = {});

  // A KV cache for this stage's layers and kv heads, holding positions [0, n_positions) (default seq_len).
  // It takes blocks from this stage's pool as positions are reached and returns them when destroyed.
  KvCache make_kv_cache(int n_positions = 0) override;
  // Pool blocks a sequence of n_positions positions will hold at its longest.
  int kv_blocks_for(int n_positions) const override { return KvCache::blocks_for(n_positions, options_.kv_block_tokens); }
  const memory::KvBlockPool& kv_pool() const override { return *kv_pool_; }

  // Arena bytes the scratch buffers take for max_rows rows and contexts of `context` positions (for sizing
  // an arena up front; 0: seq_len).
  static std::size_t scratch_bytes(const partition::ModelShape& shape, const partition::RankShard& shard, int max_rows,
                                   int context = 0);
  // Rows of one sequence a kernel thread attends at once (a prefill chunk's, reading the cache once for
  // them): up to kernels::cpu::attention_rows_at_once() (1 where the ISA has no kernel for several rows),
  // as many as kScoresBudgetBytes of softmax weights (local heads x context floats a row) hold, at least one.
  static int attention_rows_at_once(const partition::RankShard& shard, int context);
  // The positions a scratch for `context` holds: StageOptions::context's rule (0: seq_len; at most seq_len).
  static int context_positions(const partition::ModelShape& shape, int context);

  // First stage: x[t] = embedding[tokens[t]].   x: (n, dim)
  void embed(const int* tokens, int n, float* x) override;

  // Runs n rows through this stage's layers, reading and extending each row's KV cache.
  // x: (n, dim), updated in place. n <= max_rows.
  void forward(float* x, const Row* rows, int n) override;
  // The common case: n consecutive tokens (positions pos .. pos+n-1) of one sequence.
  void forward(float* x, int n, int pos, KvCache& cache);

  // Last stage: logits of n activation rows in one pass over the classifier, gathered over the TP group.
  //   x: (n, dim)  logits: (n, vocab)
  void logits(const float* x, int n, float* logits) override;
  // One row.   x: (dim)  logits: (vocab)
  void logits(const float* x, float* logits) { this->logits(x, 1, logits); }
  // The classifier's argmax per row without writing the logits (cpu::matmul_argmax); with tp > 1 each rank's
  // best of its vocabulary slice per row, exchanged as (value, index) pairs instead of the logits
  // themselves (a batch-16 step of the 110M shape at tp=2 gathered 2 MiB of logits for 16 tokens, about
  // 0.45 ms of a 6.5 ms step). logits_scratch is not used.
  void greedy_tokens(const float* x, int n, float* logits_scratch, int* tokens, float* values, bool* saw_nan) override;

  std::string describe() const override { return "cpu"; }
  const partition::ModelShape& shape() const override { return weights_.shape(); }
  int max_rows() const override { return options_.max_rows; }
  // Grows the scratch buffers to take max_rows rows per forward call.
  void reserve_rows(int max_rows) override;
  const ShardWeights& weights() const { return weights_; }

 private:
  // A layer's two halves. Each leaves its output in out_, and the next half adds it to x as it normalises x
  // (Activations::prepare_normalised): residual is the previous layer's output, or null for the first.
  void attention_block(const LayerWeights& w, float* x, const float* residual, const Row* rows, int n, int local_layer);
  void mlp_block(const LayerWeights& w, float* x, int n);
  // The half layer's row-parallel products (wo's or w2's): TP rank 0 (and one rank) adds its segments' in
  // order into out_; the other TP ranks keep theirs apart in partials_ (the first kPartialRows rows).
  void first_segment_products(const PackedMatrix& w, const std::vector<int>& bounds, int n, kernels::cpu::Team team);
  // tp > 1, after first_segment_products: the sum of every rank's products in segment order, in a chain: each
  // TP rank receives the sum of the segments before its own from the rank before, adds its own in order and
  // passes it on; the last broadcasts the whole sum into every rank's out_. kPartialRows rows at a time (the
  // later blocks' products computed here). Each rank sends one vector of rows x dim, as an all-reduce does.
  void reduce_segments(const PackedMatrix& w, const std::vector<int>& bounds, int n);
  // The final RMSNorm of n activation rows, prepared as the classifier's input in act_ (growing the
  // buffers of the logits calls to n rows).
  void prepare_classifier_input(const float* x, int n);
  // Sizes scores_ for rows up to `positions` of context on every kernel thread: grows context_ (at least
  // doubling it, at most seq_len) and attention_rows_ with it. The old scratch stays in the arena.
  void reserve_context(int positions);
  // The final RMSNorm and this rank's classifier rows for n activation rows: into out (n, vocab) with
  // tp = 1, into local_logits_ (n, vocab slice) when out is null.
  void classify(const float* x, int n, float* out);

  const ShardWeights& weights_;
  comm::Communicator& tp_comm_;
  StageOptions options_;
  int q_dim_;       // local query heads * head_size
  int kv_dim_;      // local kv heads * head_size
  int hidden_;      // local hidden features
  WoInput wo_input_;  // how wo's packed k holds the heads' output (bf16 and int8 may pad it: shard_weights.h)
  int att_stride_;    // floats per row of att_: wo's k
  int context_;         // positions a row of scores_ holds (StageOptions::context, grown by reserve_context)
  int attention_rows_;  // rows a kernel thread attends at once (attention_rows_at_once for context_)
  std::vector<int> wo_bounds_;  // wo's reduction segments along att_'s k (WoInput::bounds)
  std::vector<int> w2_bounds_;  // w2's along this rank's hidden slice (partition::local_hidden_bounds)
  std::vector<int> vocab_counts_;  // classifier rows per TP rank, for the logits gather
  std::vector<int> gather_counts_; // vocab_counts_ * rows of the current logits call

  std::unique_ptr<memory::Arena> own_arena_;  // only when StageOptions::arena was null
  memory::Arena* arena_;
  std::unique_ptr<memory::KvBlockPool> kv_pool_;

  // Scratch in the arena, sized for scratch_rows_ rows: no allocation per token. Growing (reserve_rows)
  // takes new arena space; the old buffers are not reused.
  int scratch_rows_ = 0;
  memory::ArenaArray<float> xb_;     // (max_rows, dim)
  memory::ArenaArray<float> q_;      // (max_rows, q_dim)
  memory::ArenaArray<float> k_;      // (max_rows, kv_dim)
  memory::ArenaArray<float> v_;      // (max_rows, kv_dim)
  memory::ArenaArray<float> att_;    // (max_rows, att_stride_): the heads' output, spread as wo reads it
  memory::ArenaArray<float> rope_;   // (max_rows, head_size): each row's rotary cos/sin, once per forward
  memory::ArenaArray<float> scores_; // (kernel threads, attention_rows_, local heads, context_): softmax weights
  memory::ArenaArray<float> hb_;     // (max_rows, hidden)
  memory::ArenaArray<float> out_;    // (max_rows, dim)
  // TP ranks after the first: their segment products, of up to kPartialRows rows (a prefill chunk goes in
  // blocks: they would hold n_kv_heads / tp times its rows otherwise)
  memory::ArenaArray<float> partials_;  // (local segments, kPartialRows, dim)
  memory::ArenaArray<Row> rows_;     // (max_rows) for the single-sequence forward
  // The matmuls' inputs, prepared for the weight dtype. Two, so that each half layer's parallel pass has
  // both its shapes set before it starts: the normalised rows (q/k/v's, w1/w3's and the classifier's) and
  // the inner ones (wo's input, the heads' output; w2's, the SwiGLU gate's).
  kernels::cpu::Activations act_;        // (max_rows, dim)
  kernels::cpu::Activations act_inner_;  // (max_rows, max(att_stride_, hidden))
  // Grown to the most rows one logits or greedy_tokens call has seen (batched decode: one per sequence of a
  // micro-batch); the logits' own buffers only by logits() with tp > 1.
  std::vector<float> logits_x_;       // (rows, dim)
  std::vector<float> local_logits_;   // (rows, vocab slice)
  std::vector<float> gathered_;       // (rows, vocab) in rank order of the TP group
  struct Best {                       // a row's largest logit in a rank's slice, and its vocabulary index
    float value;
    int index;
    int has_nan;                      // whether the slice's logits held a NaN (an int: no padding bytes to send)
  };
  std::vector<float> best_values_;    // (rows): matmul_argmax's answer for this rank's slice
  std::unique_ptr<bool[]> best_nan_;  // (rows): matmul_argmax's NaN flags for this rank's slice
  std::vector<int> best_indices_;     // (rows), tp > 1 (one rank's go straight into the caller's tokens)
  std::vector<Best> best_;            // (rows): this rank's
  std::vector<Best> all_best_;        // (tp, rows): every rank's, in rank order
  int vocab_begin_ = 0;               // this rank's first vocabulary entry
};

}  // namespace shardline::runtime
