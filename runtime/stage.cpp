#include "runtime/stage.h"

#include <algorithm>
#include <limits>
#include <cstring>

#include <fmt/format.h>

#include "common/error.h"
#include "common/units.h"
#include "kernels/cpu/ops.h"
#include "memory/system_memory.h"

namespace shardline::runtime {

namespace cpu = kernels::cpu;

int default_kv_blocks(long long blocks_per_context, std::uint64_t block_bytes, std::uint64_t memory_bytes,
                      long long floor_blocks) {
  std::uint64_t blocks = static_cast<std::uint64_t>(kDefaultKvContexts) * static_cast<std::uint64_t>(blocks_per_context);
  if (memory_bytes > 0 && block_bytes > 0) {
    blocks = std::min(blocks, std::max(memory_bytes / block_bytes, static_cast<std::uint64_t>(std::max(1ll, floor_blocks))));
  }
  return static_cast<int>(std::clamp<std::uint64_t>(blocks, 1, std::numeric_limits<int>::max()));
}

std::uint64_t kv_pool_memory_bound(int ranks_on_host) {
  std::uint64_t bound = 0;  // none known
  if (const auto usable = memory::usable_memory_bytes(); usable && *usable > 0) {
    // Three quarters: the rest is the run's other memory, which grows with the sequences too (200 sequences
    // of a 52 MB model at 854 MiB of cache peaked at 1.09 GiB resident), and a cgroup kills at its limit.
    bound = *usable / 4 * 3 / static_cast<std::uint64_t>(std::max(1, ranks_on_host));
  }
  if (const auto address_space = memory::address_space_left()) {
    bound = bound > 0 ? std::min(bound, *address_space / 2) : *address_space / 2;
  }
  return bound;
}

void check_kv_blocks_fit(long long kv_blocks, std::uint64_t block_bytes, int block_tokens, std::uint64_t memory_bytes,
                        const std::string& memory_what) {
  // The pool reserves address space and commits blocks as sequences fill them, so a pool past the memory
  // only fails later, when the kernel kills the rank (and its free list alone takes a byte a block: 2 GB for
  // 2^31 blocks). Refused at start-up instead.
  const double asked = static_cast<double>(kv_blocks) * static_cast<double>(block_bytes);
  if (asked <= static_cast<double>(memory_bytes)) return;
  const std::uint64_t most = memory_bytes / std::max<std::uint64_t>(1, block_bytes);
  throw ResourceError(fmt::format(
      "--kv-blocks {} asks for {} of KV cache on this rank ({} a block of {} tokens), more than {} ({}): {}", kv_blocks,
      format_bytes(asked), format_bytes(static_cast<double>(block_bytes)), block_tokens, memory_what,
      format_bytes(static_cast<double>(memory_bytes)),
      most > 0 ? fmt::format("pass at most {}, or 0 for the automatic size", most)
               : std::string("not one block fits; lower --kv-block-tokens or run fewer ranks on this host")));
}

void check_explicit_kv_blocks(long long kv_blocks, std::uint64_t block_bytes, int block_tokens, int ranks_on_host) {
  const auto usable = memory::usable_memory_bytes();
  if (!usable || *usable == 0) return;  // nothing known to compare with: the reservation itself may fail (exit 4)
  const int ranks = std::max(1, ranks_on_host);
  check_kv_blocks_fit(kv_blocks, block_bytes, block_tokens, *usable / static_cast<std::uint64_t>(ranks),
                      fmt::format("its share of this host's usable memory for {} rank{}", ranks, ranks == 1 ? "" : "s"));
}

Stage::Stage(const ShardWeights& weights, comm::Communicator& tp_comm, const StageOptions& options)
    : weights_(weights), tp_comm_(tp_comm), options_(options), arena_(options.arena) {
  const auto& s = weights.shape();
  const auto& shard = weights.shard();
  q_dim_ = shard.heads.size() * s.head_size();
  kv_dim_ = shard.kv_heads.size() * s.head_size();
  hidden_ = shard.hidden.size();
  wo_input_ = weights.wo_input();
  SL_CHECK(q_dim_ % wo_input_.segment == 0);  // whole kv heads (find_layout_problem: tp divides n_kv_heads)
  att_stride_ = wo_input_.packed_k(q_dim_);
  context_ = context_positions(s, options.context);
  attention_rows_ = attention_rows_at_once(shard, context_);
  wo_bounds_ = wo_input_.bounds(q_dim_);
  w2_bounds_ = partition::local_hidden_bounds(s, tp_comm.size(), tp_comm.rank());
  SL_CHECK(s.n_kv_heads % tp_comm.size() == 0);  // every rank holds as many whole segments
  // The segments cover this rank's slices (the shard was cut for this TP group).
  SL_CHECK(wo_bounds_.back() == att_stride_ && w2_bounds_.back() == hidden_);
  if (!arena_) {
    own_arena_ = std::make_unique<memory::Arena>(
        memory::ArenaOptions{.initial_bytes = scratch_bytes(s, shard, options.max_rows, context_)});
    arena_ = own_arena_.get();
  }
  SL_CHECK(options.kv_block_tokens >= 1 && options.kv_blocks >= 0);
  const int n_layers = weights.n_local_layers();
  const std::uint64_t block_bytes =
      KvCache::block_bytes(n_layers, kv_dim_, s.head_size(), options.kv_block_tokens, options.kv_dtype);
  const std::uint64_t paged_block_bytes = memory::round_up(block_bytes, memory::kSmallPageBytes);  // as the pool commits
  if (options.kv_blocks > 0) {
    check_explicit_kv_blocks(options.kv_blocks, paged_block_bytes, options.kv_block_tokens, options.ranks_on_host);
  }
  const int kv_blocks = options.kv_blocks > 0 ? options.kv_blocks
                                              : default_kv_blocks(kv_blocks_for(s.seq_len), paged_block_bytes,
                                                                  kv_pool_memory_bound(options.ranks_on_host),
                                                                  kv_blocks_for(context_));
  kv_pool_ = std::make_unique<memory::KvBlockPool>(
      memory::KvBlockPoolOptions{block_bytes, kv_blocks, options.numa_node, /*transparent_huge_pages=*/true});
  reserve_context(context_);  // scores_ for context_
  reserve_rows(options.max_rows);
  if (shard.has_classifier) {
    for (int t = 0; t < tp_comm.size(); ++t) {
      vocab_counts_.push_back(partition::split_evenly(s.vocab_size, tp_comm.size(), t).size());
      if (t < tp_comm.rank()) vocab_begin_ += vocab_counts_.back();
    }
    gather_counts_.resize(vocab_counts_.size());
  }
}

std::size_t Stage::scratch_bytes(const partition::ModelShape& s, const partition::RankShard& shard, int max_rows,
                                 int context) {
  context = context_positions(s, context);
  const std::size_t rows = static_cast<std::size_t>(max_rows);
  const std::size_t q_dim = shard.heads.size() * s.head_size(), kv_dim = shard.kv_heads.size() * s.head_size();
  // att_ as wo's k: int8's, padded where it pads, is the widest.
  const std::size_t att = wo_input(s, kernels::cpu::WeightDtype::kInt8).packed_k(static_cast<int>(q_dim));
  const std::size_t hidden = shard.hidden.size();
  // TP ranks after the first: their segment products (a rank holds whole kv heads, its segments).
  const bool first = shard.kv_heads.begin == 0;
  const std::size_t partials = first ? 0 : shard.kv_heads.size();
  const std::size_t partial_rows = std::min<std::size_t>(rows, kPartialRows);
  const std::size_t floats = rows * (3 * s.dim + q_dim + att + 2 * kv_dim + 2 * hidden + s.head_size()) +
                             partial_rows * partials * s.dim +
                             static_cast<std::size_t>(shard.heads.size()) * context * attention_rows_at_once(shard, context) *
                                 kernels::cpu::num_threads() +
                             (shard.has_classifier ? shard.vocab.size() : 0);
  return floats * sizeof(float) + rows * sizeof(Row) + 18 * 64;  // + one alignment pad per buffer
}

int Stage::context_positions(const partition::ModelShape& s, int context) {
  return context > 0 ? std::min(context, s.seq_len) : s.seq_len;
}

int Stage::attention_rows_at_once(const partition::RankShard& shard, int context) {
  const std::size_t row_bytes = shard.heads.size() * static_cast<std::size_t>(context) * sizeof(float);
  const std::size_t fit = row_bytes > 0 ? kScoresBudgetBytes / row_bytes : 1;
  return static_cast<int>(std::clamp<std::size_t>(fit, 1, cpu::attention_rows_at_once()));
}

void Stage::reserve_rows(int max_rows) {
  SL_CHECK(max_rows >= 1);
  options_.max_rows = max_rows;
  if (max_rows <= scratch_rows_) return;
  scratch_rows_ = max_rows;
  const std::size_t rows = static_cast<std::size_t>(max_rows);
  const int dim = shape().dim;
  rows_ = arena_->allocate_array<Row>(rows);
  xb_ = arena_->allocate_array<float>(rows * dim);
  q_ = arena_->allocate_array<float>(rows * q_dim_);
  k_ = arena_->allocate_array<float>(rows * kv_dim_);
  v_ = arena_->allocate_array<float>(rows * kv_dim_);
  att_ = arena_->allocate_array<float>(rows * att_stride_);
  rope_ = arena_->allocate_array<float>(rows * shape().head_size());
  hb_ = arena_->allocate_array<float>(rows * hidden_);
  out_ = arena_->allocate_array<float>(rows * dim);
  if (tp_comm_.rank() > 0) {
    const std::size_t segments = partition::n_reduction_segments(shape());
    partials_ = arena_->allocate_array<float>(segments / tp_comm_.size() * std::min<std::size_t>(rows, kPartialRows) * dim);
  }
  act_.reserve(max_rows, dim);
  act_inner_.reserve(max_rows, std::max(att_stride_, hidden_));
}

KvCache Stage::make_kv_cache(int n_positions) {
  SL_CHECK(n_positions >= 0 && n_positions <= shape().seq_len);
  return KvCache(*kv_pool_, weights_.n_local_layers(), kv_dim_, shape().head_size(), options_.kv_block_tokens,
                 n_positions > 0 ? n_positions : shape().seq_len, options_.kv_dtype);
}

void Stage::embed(const int* tokens, int n, float* x) {
  SL_CHECK(weights_.token_embedding() != nullptr);
  const int dim = shape().dim;
  for (int t = 0; t < n; ++t) {
    SL_CHECK(tokens[t] >= 0 && tokens[t] < shape().vocab_size);
    std::memcpy(x + static_cast<std::size_t>(t) * dim,
                weights_.token_embedding() + static_cast<std::size_t>(tokens[t]) * dim, sizeof(float) * dim);
  }
}

void Stage::forward(float* x, int n, int pos, KvCache& cache) {
  SL_CHECK(n >= 1 && n <= options_.max_rows);
  for (int t = 0; t < n; ++t) rows_[t] = {&cache, pos + t};
  forward(x, rows_.data(), n);
}

void Stage::forward(float* x, const Row* rows, int n) {
  SL_CHECK(n >= 1 && n <= options_.max_rows);
  // Blocks for every row's position first: an exhausted pool fails here, before any layer ran.
  for (int t = 0; t < n; ++t) rows[t].cache->reserve_through(rows[t].pos);
  for (int l = 0; l < weights_.n_local_layers(); ++l) {
    const LayerWeights& w = weights_.layer(l);
    attention_block(w, x, l > 0 ? out_.data() : nullptr, rows, n, l);
    mlp_block(w, x, n);
  }
  if (weights_.n_local_layers() > 0) cpu::add_inplace(x, out_.data(), n * shape().dim);  // the last layer's output
}

// Each half of a layer is one parallel pass of the kernel threads (cpu::run_team), its steps separated by
// barriers: a batch's step made nine passes a layer, each a fork and join of the threads, which cost the
// 15M shape's batch-16 step about a tenth of its time. The steps split their work as their own passes did,
// so the results are the same bits. The TP all-reduces run between the passes, on the calling thread.
void Stage::attention_block(const LayerWeights& w, float* x, const float* residual, const Row* rows, int n,
                            int local_layer) {
  const auto& s = shape();
  const int hs = s.head_size();
  const int n_local_heads = q_dim_ / hs;
  const int n_local_kv = kv_dim_ / hs;
  int longest = 0;
  for (int t = 0; t < n; ++t) longest = std::max(longest, rows[t].pos + 1);
  reserve_context(longest);
  // (threads, attention_rows_, n_local_heads, context_): the softmax weights of each thread's rows
  const std::size_t scores_per_row = static_cast<std::size_t>(n_local_heads) * context_;
  const std::size_t scores_per_thread = scores_per_row * attention_rows_;
  // Fewer rows than threads: each row's heads go to the threads instead, where its context is long enough.
  const bool split_heads =
      n < cpu::num_threads() && n_local_heads > 1 && longest > cpu::kMinParallelAttentionContext;
  // q, k and v read the same normalised rows: prepared once, one pass over the three matrices.
  act_.prepare_shape(xb_.data(), n, w.wq);
  act_inner_.prepare_shape(att_.data(), n, w.wo);
  const cpu::MatmulOutput qkv[] = {{q_.data(), &w.wq}, {k_.data(), &w.wk}, {v_.data(), &w.wv}};
  cpu::run_team([&](cpu::Team team) {
    const cpu::Band mine = team.share(n);  // this thread's rows
    if (local_layer == 0) {  // each row's rotary angles, once per forward
      for (int t = mine.begin; t < mine.end; ++t) {
        cpu::rope_angles(rope_.data() + static_cast<std::size_t>(t) * hs, hs, rows[t].pos, options_.rope_theta,
                         options_.rope_freq_divisors.empty() ? nullptr : options_.rope_freq_divisors.data());
      }
    }
    act_.normalise_rows(xb_.data(), x, residual, w.rms_att, options_.rms_eps, mine.begin, mine.end);
    cpu::team_barrier();
    cpu::matmul(act_, qkv, team);
    cpu::team_barrier();
    // Every row's key and value go into its cache first, so rows of one prefill chunk see each other.
    for (int t = mine.begin; t < mine.end; ++t) {
      const int pos = rows[t].pos;
      float* qt = q_.data() + static_cast<std::size_t>(t) * q_dim_;
      float* kt = k_.data() + static_cast<std::size_t>(t) * kv_dim_;
      const float* angles = rope_.data() + static_cast<std::size_t>(t) * hs;
      cpu::rope_rotate(qt, n_local_heads, hs, angles);
      cpu::rope_rotate(kt, n_local_kv, hs, angles);
      KvCache& cache = *rows[t].cache;
      cpu::store_kv_row(cache.key_row(local_layer, pos), kt, kv_dim_, hs, cache.kv_dtype());
      cpu::store_kv_row(cache.value_row(local_layer, pos), v_.data() + static_cast<std::size_t>(t) * kv_dim_,
                        kv_dim_, hs, cache.kv_dtype());
    }
    cpu::team_barrier();
    // Causal: the token at pos sees positions 0 .. pos of its own sequence. wo's input is prepared row by row
    // on the thread that just computed the row (after a barrier where the threads shared the rows' heads).
    float* scratch = scores_.data() + team.thread * scores_per_thread;
    auto attend = [&](int t, cpu::Team heads) {
      const KvCache& cache = *rows[t].cache;
      cpu::attention_paged(att_.data() + static_cast<std::size_t>(t) * att_stride_,
                           q_.data() + static_cast<std::size_t>(t) * q_dim_, cache.key_blocks(local_layer),
                           cache.value_blocks(local_layer), cache.kv_dtype(), cache.block_tokens(), scratch,
                           rows[t].pos + 1, n_local_heads, n_local_kv, hs, kv_dim_, heads);
    };
    if (split_heads) {
      for (int t = 0; t < n; ++t) attend(t, team);
      cpu::team_barrier();
      for (int t = mine.begin; t < mine.end; ++t) {
        wo_input_.spread(att_.data() + static_cast<std::size_t>(t) * att_stride_, q_dim_);
      }
      act_inner_.prepare_rows(att_.data(), mine.begin, mine.end);
    } else {
      // Rows in bands of about equal attention work (context lengths), not of equal counts: a prefill
      // chunk's later rows see more positions than its first, and a batch mixes long and short sequences.
      // A prefill chunk's rows (one sequence, consecutive positions) attend a few at a time, reading the
      // cache once for them (attention_rows_paged); a decode batch's rows, of different sequences, one by one.
      const cpu::Band attended = team.share_by_cost(n, [&](int t) { return rows[t].pos + 1; });
      for (int t = attended.begin; t < attended.end;) {
        int run = 1;
        while (run < attention_rows_ && t + run < attended.end && rows[t + run].cache == rows[t].cache &&
               rows[t + run].pos == rows[t].pos + run) {
          ++run;
        }
        const KvCache& cache = *rows[t].cache;
        cpu::attention_rows_paged(att_.data() + static_cast<std::size_t>(t) * att_stride_, att_stride_,
                                  q_.data() + static_cast<std::size_t>(t) * q_dim_, q_dim_,
                                  cache.key_blocks(local_layer), cache.value_blocks(local_layer), cache.kv_dtype(),
                                  cache.block_tokens(), scratch, scores_per_row, rows[t].pos + 1, run, n_local_heads,
                                  n_local_kv, hs, kv_dim_, cpu::Team{});
        for (int r = t; r < t + run; ++r) wo_input_.spread(att_.data() + static_cast<std::size_t>(r) * att_stride_, q_dim_);
        act_inner_.prepare_rows(att_.data(), t, t + run);
        t += run;
      }
    }
    cpu::team_barrier();
    // The kv heads' products added in order: in the tiles on one rank, passed from rank to rank on several.
    first_segment_products(w.wo, wo_bounds_, n, team);
  });
  if (tp_comm_.size() > 1) reduce_segments(w.wo, wo_bounds_, n);
}

void Stage::reserve_context(int positions) {
  SL_CHECK(positions <= shape().seq_len);
  if (positions > context_) {
    context_ = std::min(shape().seq_len, std::max(positions, 2 * context_));
    attention_rows_ = attention_rows_at_once(weights_.shard(), context_);
  }
  const std::size_t floats = static_cast<std::size_t>(q_dim_ / shape().head_size()) * context_ * attention_rows_ *
                             cpu::num_threads();
  if (scores_.size() < floats) scores_ = arena_->allocate_array<float>(floats);  // longer rows or more threads: rarely
}

void Stage::first_segment_products(const PackedMatrix& w, const std::vector<int>& bounds, int n, cpu::Team team) {
  // TP rank 0 and one rank: the products of their segments added in order, into out_ (rank 0's are the
  // start of the order). The other TP ranks: their products apart, the first kPartialRows rows.
  if (tp_comm_.rank() == 0) {
    cpu::matmul_segments(out_.data(), act_inner_, w, bounds, /*fold=*/true, team);
  } else {
    cpu::matmul_segments(partials_.data(), act_inner_, w, bounds, /*fold=*/false, 0, std::min(n, kPartialRows), team);
  }
}

void Stage::reduce_segments(const PackedMatrix& w, const std::vector<int>& bounds, int n) {
  const int dim = shape().dim;
  const int local_segments = static_cast<int>(bounds.size()) - 1;
  for (int r0 = 0; r0 < n; r0 += kPartialRows) {
    const int rows = std::min(kPartialRows, n - r0);
    const std::size_t count = static_cast<std::size_t>(rows) * dim;
    if (r0 > 0 && tp_comm_.rank() > 0 && local_segments > 0) {  // the first block's came with the layer's pass
      cpu::run_team([&](cpu::Team team) {
        cpu::matmul_segments(partials_.data(), act_inner_, w, bounds, /*fold=*/false, r0, rows, team);
      });
    }
    // Rank 0's sum goes in; each rank adds its products onto the sum of the segments before them, in order.
    tp_comm_.ordered_sum(out_.data() + static_cast<std::size_t>(r0) * dim, count,
                         [&](float* y, std::size_t offset, std::size_t values) {
                           for (int s = 0; s < local_segments; ++s) {
                             cpu::add_inplace(y, partials_.data() + static_cast<std::size_t>(s) * count + offset,
                                              static_cast<int>(values));
                           }
                         });
  }
}

void Stage::mlp_block(const LayerWeights& w, float* x, int n) {
  const int dim = shape().dim;
  if (hidden_ > 0) {
    act_.prepare_shape(xb_.data(), n, w.w1);
    act_inner_.prepare_shape(hb_.data(), n, w.w2);
  }
  cpu::run_team([&](cpu::Team team) {
    const cpu::Band mine = team.share(n);
    act_.normalise_rows(xb_.data(), x, out_.data(), w.rms_ffn, options_.rms_eps, mine.begin, mine.end);  // x += attention
    if (hidden_ == 0) {
      // A toy width left this TP rank no hidden features (partition::split_hidden). TP rank 0 starts the ordered
      // sum with -0.0, which adds to every float exactly (0.0 would turn a sum of -0.0 into +0.0).
      if (tp_comm_.rank() == 0) {
        std::fill(out_.data() + static_cast<std::size_t>(mine.begin) * dim,
                  out_.data() + static_cast<std::size_t>(mine.end) * dim, -0.0f);
      }
      return;
    }
    cpu::team_barrier();
    cpu::matmul_swiglu(hb_.data(), act_, w.w1, w.w3, team);  // silu(x W1ᵀ) * (x W3ᵀ), gate fused into the matmuls
    cpu::team_barrier();
    act_inner_.prepare_rows(hb_.data(), mine.begin, mine.end);
    cpu::team_barrier();
    // The hidden segments' products added in order, as wo's (always on one rank).
    first_segment_products(w.w2, w2_bounds_, n, team);
  });
  if (tp_comm_.size() > 1) reduce_segments(w.w2, w2_bounds_, n);
}

void Stage::prepare_classifier_input(const float* x, int n) {
  SL_CHECK(weights_.classifier().data != nullptr && n >= 1);
  const auto& s = shape();
  const std::size_t rows = static_cast<std::size_t>(n);
  if (logits_x_.size() < rows * s.dim) {
    logits_x_.resize(rows * s.dim);
    best_values_.resize(rows);
    best_nan_ = std::make_unique<bool[]>(rows);
    if (tp_comm_.size() > 1) {  // the greedy exchange's; one rank writes its indices into the caller's tokens
      best_indices_.resize(rows);
      best_.resize(rows);
      all_best_.resize(rows * tp_comm_.size());
    }
    act_.reserve(n, s.dim);
  }
  act_.prepare_normalised(logits_x_.data(), x, weights_.rms_final(), options_.rms_eps, n, weights_.classifier());
}

void Stage::classify(const float* x, int n, float* out) {
  prepare_classifier_input(x, n);
  const std::size_t rows = static_cast<std::size_t>(n);
  if (out == nullptr && local_logits_.size() < rows * weights_.classifier().d) {  // tp > 1: the gather's buffers
    local_logits_.resize(rows * weights_.classifier().d);
    gathered_.resize(rows * shape().vocab_size);
  }
  // With tp = 1 straight into the caller's rows (the whole vocabulary is here), else into local_logits_.
  cpu::matmul(out != nullptr ? out : local_logits_.data(), act_, weights_.classifier());  // n rows, one pass
}

void Stage::logits(const float* x, int n, float* logits) {
  const auto& s = shape();
  if (tp_comm_.size() == 1) {
    classify(x, n, logits);
    return;
  }
  classify(x, n, nullptr);
  // Each rank contributes its (n, slice) block; the gather stacks the blocks in rank order, and each row's
  // logits are the rank slices of that row side by side.
  for (std::size_t t = 0; t < vocab_counts_.size(); ++t) gather_counts_[t] = vocab_counts_[t] * n;
  tp_comm_.all_gather_v(local_logits_.data(), gathered_.data(), gather_counts_);
  std::size_t block = 0;  // start of rank t's block in gathered_
  int column = 0;         // rank t's first vocab entry
  for (int count : vocab_counts_) {
    for (int r = 0; r < n; ++r) {
      std::memcpy(logits + r * static_cast<std::size_t>(s.vocab_size) + column,
                  gathered_.data() + block + r * static_cast<std::size_t>(count), count * sizeof(float));
    }
    block += static_cast<std::size_t>(count) * n;
    column += count;
  }
}

void Stage::greedy_tokens(const float* x, int n, float*, int* tokens, float* values, bool* saw_nan) {
  prepare_classifier_input(x, n);
  // argmax keeps a NaN in the row's first place (nothing is greater), which only the first slice holds: a
  // later slice skips its NaNs as the scan over the whole row does (a slice of NaNs gets index -1).
  const bool alone = tp_comm_.size() == 1;
  cpu::matmul_argmax(act_, weights_.classifier(), alone ? values : best_values_.data(),
                     alone ? tokens : best_indices_.data(), vocab_begin_ == 0, alone ? saw_nan : best_nan_.get());
  if (alone) return;
  for (int r = 0; r < n; ++r) {
    const int index = best_indices_[r];
    best_[r] = {best_values_[r], vocab_begin_ + (index < 0 ? 0 : index), best_nan_[r] ? 1 : 0};  // a NaN value never wins below
  }
  tp_comm_.all_gather_bytes(best_.data(), sizeof(Best) * n, all_best_.data());
  // The slices are consecutive in rank order, so taking a later rank's best only when strictly greater
  // keeps the first of equal maxima, as one argmax over the whole row does; a NaN best (a slice of NaNs,
  // or the row's first entry) is never replaced by nor replaces another, as there.
  for (int r = 0; r < n; ++r) {
    Best best = all_best_[r];
    bool nan = best.has_nan != 0;
    for (int t = 1; t < tp_comm_.size(); ++t) {
      const Best& other = all_best_[static_cast<std::size_t>(t) * n + r];
      nan = nan || other.has_nan != 0;
      if (other.value > best.value) best = other;
    }
    tokens[r] = best.index;
    values[r] = best.value;
    saw_nan[r] = nan;
  }
}

}  // namespace shardline::runtime
