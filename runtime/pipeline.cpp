#include "runtime/pipeline.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include "common/error.h"
#include "common/log.h"
#include "common/units.h"
#include "kernels/cpu/ops.h"

namespace shardline::runtime {

namespace {
constexpr int kTagHeader = 101;
constexpr int kTagActivations = 102;
constexpr int kTagReply = 103;
constexpr int kTagReleased = 104;
constexpr int kKindStop = 0;
constexpr int kKindWork = 1;
}  // namespace

struct Pipeline::Item {
  std::vector<int> seq;           // per row: sequence index
  std::vector<int> pos;           // per row: position
  std::vector<int> wants_logits;  // per row: 1 when this row's logits are sampled
  std::vector<int> token;         // per row: input token (stage 0 only)
  int n_rows() const { return static_cast<int>(seq.size()); }
  void clear() {
    seq.clear();
    pos.clear();
    wants_logits.clear();
    token.clear();
  }
  // Header wire format, fixed size for max_rows: kind, n_rows, n_released, seq[max_rows], pos[...],
  // wants[...]. n_released sequences follow in a message of their own when it is not zero.
  static std::size_t header_ints(int max_rows) { return 3 + 3 * static_cast<std::size_t>(max_rows); }
  void encode(int kind, int max_rows, int n_released, std::vector<int>& out) const {
    out.assign(header_ints(max_rows), 0);
    out[0] = kind;
    out[1] = n_rows();
    out[2] = n_released;
    std::copy(seq.begin(), seq.end(), out.begin() + 3);
    std::copy(pos.begin(), pos.end(), out.begin() + 3 + max_rows);
    std::copy(wants_logits.begin(), wants_logits.end(), out.begin() + 3 + 2 * max_rows);
  }
  // Returns the kind; n_released is set from the header.
  int decode(const std::vector<int>& in, int max_rows, int& n_released) {
    const int n = in[1];
    SL_CHECK(n >= 0 && n <= max_rows);
    n_released = in[2];
    SL_CHECK(n_released >= 0);
    seq.assign(in.begin() + 3, in.begin() + 3 + n);
    pos.assign(in.begin() + 3 + max_rows, in.begin() + 3 + max_rows + n);
    wants_logits.assign(in.begin() + 3 + 2 * max_rows, in.begin() + 3 + 2 * max_rows + n);
    return in[0];
  }
};

struct Pipeline::SeqState {
  const SequenceSpec* spec = nullptr;
  KvCache cache;
  int fed = 0;             // tokens fed to the model (prompt, then generated)
  int generated = 0;       // tokens sampled and kept
  int last_token = -1;
  bool awaiting = false;   // a token of this sequence is being sampled downstream
  bool done = false;
  bool admitted = false;   // stage 0: the sequence holds a share of the KV pools (see KV admission)
  int kv_blocks = 0;       // blocks it needs at its longest
  std::unique_ptr<Sampler> sampler;  // last stage only
  int n_prompt() const { return static_cast<int>(spec->prompt_ids.size()); }
};

Pipeline::Pipeline(StageBackend& stage, const partition::Mesh& mesh, comm::Communicator& world, const PipelineOptions& options)
    : stage_(stage), mesh_(mesh), world_(world), options_(options) {
  if (options.micro_batches < 1) throw ConfigError("--micro-batches must be >= 1");
}

int Pipeline::max_rows_for(const PipelineOptions& options, const std::vector<SequenceSpec>& sequences,
                           const std::vector<int>& kv_blocks, long kv_capacity) {
  // A forward call takes one chunk of every admitted sequence of a micro-batch (sequence i is in micro-batch
  // i % m). The admitted ones hold at most kv_capacity blocks together, so at most k of a micro-batch run at
  // once, k the most of its smallest needs that fit, and their rows are at most its k largest chunks.
  const int n = static_cast<int>(sequences.size());
  const int m = std::max(1, std::min(options.micro_batches, n));
  const bool bounded = kv_capacity > 0 && static_cast<int>(kv_blocks.size()) == n;
  int most = 1;
  for (int group = 0; group < m; ++group) {
    std::vector<int> chunks, needs;
    for (int i = group; i < n; i += m) {
      chunks.push_back(std::max(1, sequences[i].chunk_tokens));
      if (bounded) needs.push_back(kv_blocks[i]);
    }
    std::size_t k = chunks.size();
    if (bounded) {
      std::sort(needs.begin(), needs.end());
      long held = 0;
      k = 0;
      while (k < needs.size() && held + needs[k] <= kv_capacity) held += needs[k++];
      k = std::max<std::size_t>(k, 1);
    }
    std::sort(chunks.begin(), chunks.end(), std::greater<>());
    long rows = 0;
    for (std::size_t j = 0; j < k && j < chunks.size(); ++j) rows += chunks[j];
    most = static_cast<int>(std::max<long>(most, rows));
  }
  return most;
}

long Pipeline::agreed_kv_capacity() {
  const long mine = stage_.kv_pool().free_blocks();
  std::vector<long> all(world_.size());
  world_.all_gather_bytes(&mine, sizeof(mine), all.data());
  return *std::min_element(all.begin(), all.end());
}

int Pipeline::kv_blocks_needed(const SequenceSpec& spec) const {
  return stage_.kv_blocks_for(spec.positions());
}

std::vector<SequenceOutput> Pipeline::run(const std::vector<SequenceSpec>& sequences, const TokenCallback& on_token,
                                          bool callback_reads_logits) {
  start_s_ = now_s();
  callback_reads_logits_ = callback_reads_logits;
  stats_ = {};
  warned_not_finite_ = false;
  next_group_ = 0;
  admitted_ = 0;
  kv_capacity_ = agreed_kv_capacity();
  kv_reserved_ = 0;
  released_.clear();
  const int n = static_cast<int>(sequences.size());
  std::vector<int> needs(n);
  for (int i = 0; i < n; ++i) needs[i] = kv_blocks_needed(sequences[i]);
  max_rows_ = max_rows_for(options_, sequences, needs, kv_capacity_);
  if (max_rows_ > stage_.max_rows()) stage_.reserve_rows(max_rows_);
  std::vector<SeqState> seqs(n);
  for (int i = 0; i < n; ++i) {
    const SequenceSpec& spec = sequences[i];
    SL_CHECK(!spec.prompt_ids.empty() && spec.steps >= 1 && spec.chunk_tokens >= 1);
    seqs[i].spec = &spec;
    seqs[i].cache = stage_.make_kv_cache(spec.positions());  // takes blocks only as positions are reached
    seqs[i].kv_blocks = needs[i];
    SL_CHECK_MSG(seqs[i].kv_blocks <= kv_capacity_, "sequence {} needs {} KV blocks, the pool has {} free", i,
                 seqs[i].kv_blocks, kv_capacity_);
    if (mesh_.is_last_stage()) seqs[i].sampler = std::make_unique<Sampler>(stage_.shape().vocab_size, spec.sampler);
  }
  rows_.resize(max_rows_);
  // At most one logits row per sequence per item; the logits grow with the items (sample_item), so greedy
  // decoding on a backend that picks its own tokens never touches them.
  logit_rows_.resize(static_cast<std::size_t>(std::min(n, max_rows_)) * stage_.shape().dim);
  std::vector<SequenceOutput> outputs(mesh_.is_last_stage() ? n : 0);
  if (mesh_.is_first_stage()) {
    run_first_stage(seqs, outputs, on_token);
  } else {
    run_later_stage(seqs, outputs, on_token);
  }
  stats_.total_s = now_s() - start_s_;
  return outputs;
}

void Pipeline::admit(std::vector<SeqState>& seqs) {
  while (admitted_ < static_cast<int>(seqs.size()) && kv_reserved_ + seqs[admitted_].kv_blocks <= kv_capacity_) {
    seqs[admitted_].admitted = true;
    kv_reserved_ += seqs[admitted_].kv_blocks;
    ++admitted_;
  }
}

void Pipeline::release(std::vector<SeqState>& seqs, int sequence) {
  SeqState& s = seqs[sequence];
  s.cache = KvCache();  // its blocks go back to this rank's pool
  kv_reserved_ -= s.kv_blocks;
  if (!mesh_.is_last_stage()) released_.push_back(sequence);
}

void Pipeline::send_header(const std::vector<int>& header, const std::vector<int>& released, int next) {
  world_.send(header.data(), header.size() * sizeof(int), next, kTagHeader);
  if (!released.empty()) world_.send(released.data(), released.size() * sizeof(int), next, kTagReleased);
}

bool Pipeline::build_item(std::vector<SeqState>& seqs, Item& item) {
  item.clear();
  admit(seqs);
  const int n = static_cast<int>(seqs.size());
  const int m = std::max(1, std::min(options_.micro_batches, n));
  for (int tried = 0; tried < m; ++tried) {
    const int group = (next_group_ + tried) % m;
    for (int i = group; i < n; i += m) {
      SeqState& s = seqs[i];
      if (s.done || s.awaiting || !s.admitted) continue;
      if (s.fed < s.n_prompt()) {
        const int take = std::min(s.spec->chunk_tokens, s.n_prompt() - s.fed);
        for (int t = 0; t < take; ++t) {
          item.seq.push_back(i);
          item.pos.push_back(s.fed + t);
          item.token.push_back(s.spec->prompt_ids[s.fed + t]);
          item.wants_logits.push_back(s.fed + t + 1 == s.n_prompt() ? 1 : 0);
        }
        s.fed += take;
        s.awaiting = s.fed == s.n_prompt();
      } else {
        item.seq.push_back(i);
        item.pos.push_back(s.fed);
        item.token.push_back(s.last_token);
        item.wants_logits.push_back(1);
        s.fed += 1;
        s.awaiting = true;
      }
    }
    if (item.n_rows() > 0) {
      // max_rows_for()'s bound, which sized every rank's buffers and the items' headers.
      SL_CHECK_MSG(item.n_rows() <= max_rows_, "an item of {} rows, past the {} the run was sized for", item.n_rows(),
                   max_rows_);
      next_group_ = (group + 1) % m;
      return true;
    }
  }
  return false;
}

void Pipeline::forward_item(const Item& item, std::vector<SeqState>& seqs, float* x) {
  const double start_s = now_s();
  for (int r = 0; r < item.n_rows(); ++r) rows_[r] = {&seqs[item.seq[r]].cache, item.pos[r]};
  if (mesh_.is_first_stage()) stage_.embed(item.token.data(), item.n_rows(), x);
  if (stage_.moves_activations() && mesh_.pp_size() > 1) {
    // x: the first stage's embedded rows; null on later stages (the rows came through recv_activations).
    stage_.forward_resident(x, rows_.data(), item.n_rows());
  } else {
    stage_.forward(x, rows_.data(), item.n_rows());
  }
  stats_.items += 1;
  stats_.rows += item.n_rows();
  stats_.busy_s += now_s() - start_s;
}

namespace {

// Whether every value is a finite number. fabs(NaN) <= max is false, as is fabs(Inf) <= max; no branch in
// the loop, so it vectorises.
bool all_finite(const float* x, std::size_t n) {
  bool finite = true;
  for (std::size_t i = 0; i < n; ++i) finite &= std::fabs(x[i]) <= std::numeric_limits<float>::max();
  return finite;
}

}  // namespace

// A model whose weights hold NaN or Inf (a damaged or badly converted file), or whose activations overflow,
// turns the final hidden state into NaNs, and from there every logit: greedy decoding then picks token 0,
// as llama2.c's argmax does, and the text is silently meaningless. The check costs one pass over the rows
// about to meet the classifier (dim floats each, against the classifier's vocabulary x dim weights).
void Pipeline::warn_if_not_finite(const std::vector<SequenceOutput>& outputs, int n_logits) {
  const int dim = stage_.shape().dim;
  for (int i = 0; i < n_logits; ++i) {
    if (all_finite(logit_rows_.data() + static_cast<std::size_t>(i) * dim, dim)) continue;
    const int seq = logit_seqs_[i];
    log::warn("sequence {}'s hidden state holds NaN or Inf at its generated token {}: its text from here on is "
              "meaningless (NaN logits give token 0). The model's weights hold NaN or Inf values, or its activations "
              "overflow; warned once per run",
              seq, outputs[seq].ids.size() + 1);
    warned_not_finite_ = true;
    return;
  }
}

float* Pipeline::logits_for(int rows) {
  const std::size_t floats = static_cast<std::size_t>(rows) * stage_.shape().vocab_size;
  if (floats > logits_floats_) {
    logits_.reset(new float[floats]);  // default-initialised: no page is touched until a backend writes it
    logits_floats_ = floats;
  }
  return logits_.get();
}

void Pipeline::warn_logits_not_finite(const std::vector<SequenceOutput>& outputs, int seq, bool pick_sound) {
  const std::size_t token = outputs[seq].ids.size() + 1;
  if (pick_sound) {
    log::warn("sequence {}'s logits hold NaN at its generated token {}: greedy decoding skips them (as llama2.c's "
              "argmax does), so the tokens whose classifier rows give NaN are never picked. The model's classifier "
              "weights hold NaN or Inf values; warned once per run",
              seq, token);
  } else {
    log::warn("sequence {}'s logits hold NaN or Inf at its generated token {}: its text from here on is meaningless "
              "(NaN logits give token 0). The model's final norm or classifier weights hold NaN or Inf values; warned "
              "once per run",
              seq, token);
  }
  warned_not_finite_ = true;
}

void Pipeline::sample_item(const Item& item, std::vector<SeqState>& seqs, const float* x,
                           std::vector<SequenceOutput>& outputs, const TokenCallback& on_token,
                           std::vector<int>& tokens) {
  const double start_s = now_s();
  const int dim = stage_.shape().dim;
  const std::size_t vocab = stage_.shape().vocab_size;
  tokens.clear();
  // Every row that wants logits goes through the classifier in one batch: B sequences decoding together
  // share one pass over it, as they share one pass over the layers.
  logit_seqs_.clear();
  for (int r = 0; r < item.n_rows(); ++r) {
    if (!item.wants_logits[r]) continue;
    std::copy(x + static_cast<std::size_t>(r) * dim, x + static_cast<std::size_t>(r + 1) * dim,
              logit_rows_.begin() + logit_seqs_.size() * dim);
    logit_seqs_.push_back(item.seq[r]);
  }
  const int n_logits = static_cast<int>(logit_seqs_.size());
  if (!warned_not_finite_ && mesh_.tp_rank() == 0) warn_if_not_finite(outputs, n_logits);
  picked_tokens_.assign(n_logits, -1);
  // All rows greedy and no callback reading logits (the same on every TP rank: the specs and the flag
  // are): only the tokens are needed, which the backend may find without gathering the logits.
  bool tokens_only = !callback_reads_logits_;
  for (int i = 0; i < n_logits && tokens_only; ++i) tokens_only = seqs[logit_seqs_[i]].sampler->leaves_logits_unchanged();
  if (n_logits > 0 && tokens_only) {
    greedy_values_.resize(n_logits);
    if (n_logits > greedy_nan_rows_) {
      greedy_nan_.reset(new bool[n_logits]);
      greedy_nan_rows_ = n_logits;
    }
    stage_.greedy_tokens(logit_rows_.data(), n_logits, logits_for(n_logits), picked_tokens_.data(), greedy_values_.data(),
                         greedy_nan_.get());
    // The winner is NaN when the row's first logit is (argmax keeps it) or Inf when the final norm's or the
    // classifier's Inf made the logits overflow: the pick means nothing. A NaN elsewhere is skipped by argmax,
    // so the pick stands but that token can never win.
    for (int i = 0; i < n_logits && !warned_not_finite_ && mesh_.tp_rank() == 0; ++i) {
      const bool pick_sound = std::isfinite(greedy_values_[i]);
      if (!pick_sound || greedy_nan_[i]) warn_logits_not_finite(outputs, logit_seqs_[i], pick_sound);
    }
  } else if (n_logits > 0) {
    stage_.logits(logit_rows_.data(), n_logits, logits_for(n_logits));
    // Every row picks its token on the kernel threads: greedy rows read their logits (an argmax over the
    // vocabulary), sampled rows scale a copy in their thread's scratch row (callbacks get the raw logits).
    // Each sequence has its own sampler and random state, so the tokens do not depend on which thread drew
    // them. One by one on the calling thread, a batch of 16 sampled rows with top-p took longer than the
    // forward pass that made their logits.
    const std::size_t scratch_values = static_cast<std::size_t>(kernels::cpu::num_threads()) * vocab;
    if (probabilities_.size() < scratch_values) probabilities_.resize(scratch_values);
    kernels::cpu::parallel_for(n_logits, [&](int i, int thread) {
      Sampler& sampler = *seqs[logit_seqs_[i]].sampler;
      const float* logits = logits_.get() + static_cast<std::size_t>(i) * vocab;
      if (sampler.leaves_logits_unchanged()) {
        picked_tokens_[i] = sampler.greedy_token(logits);
        return;
      }
      float* probabilities = probabilities_.data() + static_cast<std::size_t>(thread) * vocab;
      std::copy(logits, logits + vocab, probabilities);
      picked_tokens_[i] = sampler.sample(probabilities);
    });
  }
  for (int i = 0; i < n_logits; ++i) {
    const int seq = logit_seqs_[i];
    SeqState& s = seqs[seq];
    float* logits = logits_.get() + static_cast<std::size_t>(i) * vocab;
    if (!tokens_only && !warned_not_finite_ && mesh_.tp_rank() == 0 && !all_finite(logits, vocab)) {
      // (the tokens-only path left logits_ unwritten: its values were checked.) A greedy pick stands when its
      // winner is finite; a sampled row's softmax takes every logit, so a NaN or a +Inf spoils it. A -Inf (a
      // token that can never win, probability 0) spoils neither, and is not warned of.
      const bool has_nan = std::any_of(logits, logits + vocab, [](float v) { return std::isnan(v); });
      const bool has_plus_inf =
          std::any_of(logits, logits + vocab, [](float v) { return v == std::numeric_limits<float>::infinity(); });
      const bool pick_sound = s.sampler->leaves_logits_unchanged() ? std::isfinite(logits[picked_tokens_[i]])
                                                                   : !has_nan && !has_plus_inf;
      if (!pick_sound || has_nan) warn_logits_not_finite(outputs, seq, pick_sound);
    }
    const int token = picked_tokens_[i];
    tokens.push_back(token);
    SequenceOutput& out = outputs[seq];
    if (out.ids.empty()) out.first_token_s = now_s() - start_s_;
    const bool ends = is_end(token);
    if (!ends) {
      out.ids.push_back(token);
      if (on_token) on_token(seq, token, tokens_only ? nullptr : logits);
    }
    if (ends || static_cast<int>(out.ids.size()) == s.spec->steps) out.done_s = now_s() - start_s_;
  }
  stats_.busy_s += now_s() - start_s;
}

void Pipeline::apply_tokens(const Item& item, const std::vector<int>& tokens, std::vector<SeqState>& seqs) {
  std::size_t next = 0;
  for (int r = 0; r < item.n_rows(); ++r) {
    if (!item.wants_logits[r]) continue;
    SL_CHECK(next < tokens.size());
    SeqState& s = seqs[item.seq[r]];
    const int token = tokens[next++];
    s.awaiting = false;
    if (is_end(token)) {  // llama2.c: BOS delimits sequences; Llama 3: EOS, EOT
      s.done = true;
      release(seqs, item.seq[r]);
      continue;
    }
    s.generated += 1;
    s.last_token = token;
    if (s.generated == s.spec->steps) {
      s.done = true;
      release(seqs, item.seq[r]);
    }
  }
  SL_CHECK(next == tokens.size());
}

void Pipeline::run_first_stage(std::vector<SeqState>& seqs, std::vector<SequenceOutput>& outputs,
                               const TokenCallback& on_token) {
  const int dim = stage_.shape().dim;
  Item item;
  std::vector<int> tokens;
  if (mesh_.is_last_stage()) {  // pp = 1: forward, sample, apply, in order
    std::vector<float> x(static_cast<std::size_t>(max_rows_) * dim);  // (max_rows, dim)
    while (build_item(seqs, item)) {
      forward_item(item, seqs, x.data());
      sample_item(item, seqs, x.data(), outputs, on_token, tokens);
      apply_tokens(item, tokens, seqs);
    }
    return;
  }

  // Up to `window` items in flight, each in its own slot (header, activations, sends in flight). Replies
  // come back in issue order, and a slot is reused only after its item's reply, so its sends are done.
  const int window = options_.micro_batches + mesh_.pp_size();
  struct Slot {
    Item item;
    std::vector<int> header;
    std::vector<int> released;  // finished sequences announced by this header
    std::vector<float> x;  // (max_rows, dim)
    std::unique_ptr<comm::PendingSend> header_send, released_send, x_send;
  };
  std::vector<Slot> slots(window);
  for (auto& slot : slots) slot.x.resize(static_cast<std::size_t>(max_rows_) * dim);
  std::deque<int> in_flight;  // slot indices, oldest first
  std::vector<int> reply(1 + static_cast<std::size_t>(max_rows_));
  const int next = mesh_.next_stage_rank();
  const int last = mesh_.rank_of(mesh_.pp_size() - 1, mesh_.tp_rank());
  long issued = 0;
  for (;;) {
    while (static_cast<int>(in_flight.size()) < window) {
      Slot& slot = slots[issued % window];
      if (!build_item(seqs, slot.item)) break;
      if (slot.header_send) slot.header_send->wait();
      if (slot.released_send) slot.released_send->wait();
      if (slot.x_send) slot.x_send->wait();
      forward_item(slot.item, seqs, slot.x.data());
      slot.released.swap(released_);
      released_.clear();
      slot.item.encode(kKindWork, max_rows_, static_cast<int>(slot.released.size()), slot.header);
      slot.header_send = world_.isend(slot.header.data(), slot.header.size() * sizeof(int), next, kTagHeader);
      slot.released_send.reset();
      if (!slot.released.empty()) {
        slot.released_send =
            world_.isend(slot.released.data(), slot.released.size() * sizeof(int), next, kTagReleased);
      }
      if (stage_.moves_activations()) {
        // After the header: the next stage posts its receive for the activations once it has read it.
        slot.x_send = stage_.isend_activations(slot.item.n_rows());
      } else {
        slot.x_send = world_.isend(slot.x.data(), static_cast<std::size_t>(slot.item.n_rows()) * dim * sizeof(float),
                                   next, kTagActivations);
      }
      in_flight.push_back(static_cast<int>(issued % window));
      ++issued;
    }
    if (in_flight.empty()) break;  // nothing to issue and nothing pending: every sequence is done
    world_.recv(reply.data(), reply.size() * sizeof(int), last, kTagReply);
    tokens.assign(reply.begin() + 1, reply.begin() + 1 + reply[0]);
    apply_tokens(slots[in_flight.front()].item, tokens, seqs);
    in_flight.pop_front();
  }
  std::vector<int> stop;
  Item().encode(kKindStop, max_rows_, 0, stop);
  world_.send(stop.data(), stop.size() * sizeof(int), next, kTagHeader);
  for (auto& slot : slots) {
    if (slot.header_send) slot.header_send->wait();
    if (slot.released_send) slot.released_send->wait();
    if (slot.x_send) slot.x_send->wait();
  }
}

void Pipeline::run_later_stage(std::vector<SeqState>& seqs, std::vector<SequenceOutput>& outputs,
                               const TokenCallback& on_token) {
  const int dim = stage_.shape().dim;
  const int prev = mesh_.prev_stage_rank();
  const int next = mesh_.next_stage_rank();
  const int first = mesh_.rank_of(0, mesh_.tp_rank());
  std::vector<int> header(Item::header_ints(max_rows_));
  std::vector<int> released;
  std::vector<float> x(static_cast<std::size_t>(max_rows_) * dim);  // (max_rows, dim)
  std::vector<int> tokens;
  std::vector<int> reply(1 + static_cast<std::size_t>(max_rows_));
  const bool resident = stage_.moves_activations();  // activations arrive and leave through the backend
  Item item;
  for (;;) {
    world_.recv(header.data(), header.size() * sizeof(int), prev, kTagHeader);
    int n_released = 0;
    if (item.decode(header, max_rows_, n_released) == kKindStop) {
      if (next >= 0) world_.send(header.data(), header.size() * sizeof(int), next, kTagHeader);
      return;
    }
    released.resize(n_released);
    if (n_released > 0) {
      // Finished sequences: free their blocks before this item's rows (maybe new sequences) take any.
      world_.recv(released.data(), released.size() * sizeof(int), prev, kTagReleased);
      for (int sequence : released) {
        SL_CHECK(sequence >= 0 && sequence < static_cast<int>(seqs.size()));
        seqs[sequence].cache = KvCache();
      }
    }
    if (resident) {
      stage_.recv_activations(item.n_rows());
    } else {
      world_.recv(x.data(), static_cast<std::size_t>(item.n_rows()) * dim * sizeof(float), prev, kTagActivations);
    }
    forward_item(item, seqs, resident ? nullptr : x.data());
    if (next >= 0) {
      send_header(header, released, next);
      if (resident) {
        stage_.isend_activations(item.n_rows())->wait();
      } else {
        world_.send(x.data(), static_cast<std::size_t>(item.n_rows()) * dim * sizeof(float), next, kTagActivations);
      }
      continue;
    }
    if (resident) stage_.download_activations(x.data(), item.n_rows());
    sample_item(item, seqs, x.data(), outputs, on_token, tokens);
    reply[0] = static_cast<int>(tokens.size());
    std::copy(tokens.begin(), tokens.end(), reply.begin() + 1);
    world_.send(reply.data(), reply.size() * sizeof(int), first, kTagReply);
  }
}

}  // namespace shardline::runtime
