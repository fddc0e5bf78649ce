// The pipeline schedule: sequences in micro-batches flowing through the stages.
//
// Stage 0 (every TP rank of it alike) owns the schedule. It cuts each sequence's prompt into chunks of
// chunk_tokens, groups the sequences into m micro-batches (sequence i in micro-batch i % m), and keeps
// up to `window` work items in flight: while stage s works on item i, stage s+1 works on item i-1.
// A sequence waits only for its own sampled token; prefill chunks never wait, so one long prompt also
// overlaps across stages.
//
// KV admission (continuous batching): a sequence enters the schedule only when every stage's KV pool can
// hold it at its longest, next to the sequences already running; the others wait, in order, and enter as
// finished sequences give their blocks back. Stage 0 decides, by the least any rank's pool has free (the
// pools may differ: a CUDA pool is sized from its GPU's memory), and a sequence needs the same number of
// blocks on each stage; a finished sequence's release travels
// with the next header, ahead of that header's rows, so a later stage frees before it allocates.
//
// Messages, all point to point between ranks of equal tp_rank:
//   stage s -> s+1:        header (kind, rows: sequence, position, wants-logits; released count), the
//                          released sequences when there are any, then activations (rows, dim)
//   last stage -> stage 0: reply (the tokens sampled for the item's wants-logits rows)
// Stage 0 sends activations without blocking and only reuses a buffer whose item has been answered, and
// replies are received only by stage 0, so the ring of stages cannot deadlock.
// A backend that moves activations itself (StageBackend::moves_activations: the CUDA stage over NCCL)
// sends them right after the header, the same way: without blocking on stage 0 (isend_activations), with
// blocking sends on later stages, so the argument above still holds.
// The last stage samples (every TP rank of it identically, from the same gathered logits; greedy-only items
// take the backend's greedy tokens, which gather none).
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "partition/mesh.h"
#include "runtime/sampler.h"
#include "runtime/stage_backend.h"
#include "runtime/tokenizer.h"

namespace shardline::runtime {

struct SequenceSpec {
  std::vector<int> prompt_ids;  // BOS first; at least one token
  int steps = 1;                // tokens to generate (fewer if BOS is sampled)
  SamplerOptions sampler;
  int chunk_tokens = 64;        // prefill split granularity for this sequence (chosen per prompt length)

  // Positions the sequence uses at its longest: the prompt, then every generated token but the last (which
  // is never fed back).
  int positions() const { return static_cast<int>(prompt_ids.size()) + steps - 1; }
};

struct PipelineOptions {
  int micro_batches = 1;   // m
  // A sequence ends when it picks one of these (not output): the tokenizer's end_ids(), llama2.c's BOS by default.
  std::vector<int> end_ids = {kBosId};
};

// What one sequence produced; filled on the last stage only.
struct SequenceOutput {
  std::vector<int> ids;
  double first_token_s = 0.0;  // since the start of run()
  double done_s = 0.0;
};

// Per-rank statistics for --verbose.
struct PipelineStats {
  int items = 0;
  long rows = 0;
  double busy_s = 0.0;   // in this stage's forward pass (collectives inside it included)
  double total_s = 0.0;
};

// Called on the last stage for each sampled token: (sequence, token). The logits are those the token was
// sampled from (before temperature), for --dump-logits; null where run() was told the callback does not
// read them and the token was greedy (see run()). The logits are valid only during the call.
using TokenCallback = std::function<void(int sequence, int token, const float* logits)>;

class Pipeline {
 public:
  // world: the world communicator (point-to-point between stages uses world ranks from mesh).
  Pipeline(StageBackend& stage, const partition::Mesh& mesh, comm::Communicator& world, const PipelineOptions& options);

  // The most rows one forward call can take for these options and sequences. With kv_blocks (each
  // sequence's blocks at its longest) and the kv_capacity blocks admission goes by, only the sequences the
  // pools hold at once count: a file of thousands of prompts once sized every buffer for all of them
  // decoding together (about 1 MB a sequence on the 15M shape), however few the pool let in.
  static int max_rows_for(const PipelineOptions& options, const std::vector<SequenceSpec>& sequences,
                          const std::vector<int>& kv_blocks = {}, long kv_capacity = 0);

  // Runs every sequence to completion; every rank of the job calls it with the same specs. Returns the
  // outputs on the last stage, an empty vector elsewhere. callback_reads_logits: whether on_token reads
  // its logits argument; it must be the same on every rank (a rank without a callback passes what the
  // output rank passes), since without it items whose rows all decode greedily skip gathering the
  // logits over the TP group (StageBackend::greedy_tokens).
  std::vector<SequenceOutput> run(const std::vector<SequenceSpec>& sequences, const TokenCallback& on_token = {},
                                  bool callback_reads_logits = true);

  // Blocks one sequence holds at its longest (spec.positions()) on every stage.
  int kv_blocks_needed(const SequenceSpec& spec) const;

  const PipelineStats& stats() const { return stats_; }

 private:
  struct Item;
  struct SeqState;
  void run_first_stage(std::vector<SeqState>& seqs, std::vector<SequenceOutput>& outputs, const TokenCallback& on_token);
  void run_later_stage(std::vector<SeqState>& seqs, std::vector<SequenceOutput>& outputs, const TokenCallback& on_token);
  bool build_item(std::vector<SeqState>& seqs, Item& item);
  bool is_end(int token) const {
    return std::find(options_.end_ids.begin(), options_.end_ids.end(), token) != options_.end_ids.end();
  }
  // x: (rows, dim) host activations in and out; with a backend that moves activations, x is only the first
  // stage's embedded input (null on later stages) and the output stays with the backend.
  void forward_item(const Item& item, std::vector<SeqState>& seqs, float* x);
  // Warns (once per run) when a row about to meet the classifier holds NaN or Inf. outputs count each
  // sequence's tokens so far, which every layout's output rank knows alike.
  void warn_if_not_finite(const std::vector<SequenceOutput>& outputs, int n_logits);
  // The same warning when a row's logits hold NaN or Inf: the final norm's or the classifier's weights do
  // (the layers' would have shown in the hidden state). seq is the row's sequence; pick_sound says its token
  // is still the right one (a greedy pick whose winner is finite: argmax skips the NaNs of a few classifier
  // rows, whose tokens are then never picked), else the text from here on is meaningless.
  void warn_logits_not_finite(const std::vector<SequenceOutput>& outputs, int seq, bool pick_sound);
  float* logits_for(int rows);
  // The KV blocks every rank's pool can give (a collective: the least free on any rank). The first stage
  // admits sequences by it and every rank sizes its buffers and the items' headers from it, so all agree
  // byte for byte; CUDA pools sized from each GPU's memory may differ, and a stage with a smaller pool no
  // longer runs out mid-run.
  long agreed_kv_capacity();
  // Last stage: samples every wants-logits row of the item; fills tokens (one per such row).
  void sample_item(const Item& item, std::vector<SeqState>& seqs, const float* x, std::vector<SequenceOutput>& outputs,
                   const TokenCallback& on_token, std::vector<int>& tokens);
  void apply_tokens(const Item& item, const std::vector<int>& tokens, std::vector<SeqState>& seqs);
  // Stage 0: admits waiting sequences, in order, while the KV pools hold them.
  void admit(std::vector<SeqState>& seqs);
  // Stage 0: a finished sequence gives its blocks back here and, with the next header, on the later stages.
  void release(std::vector<SeqState>& seqs, int sequence);
  // Sends a header to the next stage, and the released sequences after it when it announces any.
  void send_header(const std::vector<int>& header, const std::vector<int>& released, int next);

  StageBackend& stage_;
  partition::Mesh mesh_;
  comm::Communicator& world_;
  PipelineOptions options_;
  PipelineStats stats_;
  int max_rows_ = 0;
  // KV admission on stage 0 (see above).
  int admitted_ = 0;          // sequences [0, admitted_) have entered the schedule
  long kv_capacity_ = 0;      // blocks every rank's pool had free when the run started (agreed_kv_capacity)
  long kv_reserved_ = 0;      // blocks the admitted, unreleased sequences need at their longest
  std::vector<int> released_;  // finished sequences the later stages have not been told about yet
  int next_group_ = 0;
  double start_s_ = 0.0;
  std::vector<Row> rows_;             // (max_rows) the rows of the item being forwarded
  std::vector<float> logit_rows_;     // (rows that want logits, dim): an item's rows to sample
  // (rows that want logits, vocab), grown by logits_for() and never initialised: pages a backend that picks
  // greedy tokens itself never writes are never touched.
  std::unique_ptr<float[]> logits_;
  std::size_t logits_floats_ = 0;
  std::vector<float> probabilities_;  // (kernel threads, vocab): each thread's copy of a row its sampler scales
  std::vector<int> logit_seqs_;       // the sequence of each row that wants logits, in order
  std::vector<int> picked_tokens_;    // their tokens, greedy or sampled
  std::vector<float> greedy_values_;  // the winning logit of each greedy row picked without the logits
  std::unique_ptr<bool[]> greedy_nan_;  // whether each such row's logits held a NaN
  int greedy_nan_rows_ = 0;
  bool callback_reads_logits_ = true; // run()'s
  bool warned_not_finite_ = false;    // run() warns once about a hidden state or logits of NaN or Inf
};

}  // namespace shardline::runtime
