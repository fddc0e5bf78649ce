// The seam between the pipeline and a backend: one rank's forward pass, whatever runs it (the CPU Stage in
// stage.h, the CUDA stage in cuda_stage.h). Activations cross it in host memory, (rows, dim) floats, because
// the pipeline moves them between stages over MPI; a device backend copies them in and out. Sampling stays
// on the host (runtime/sampler.h), so a backend hands back logits, except for greedy rows, whose tokens it
// may pick itself (greedy_tokens).
//
// The KV cache bookkeeping (block ids, the block table of each sequence) is the host's KvCache on every
// backend; where the cached rows live is the backend's business (host blocks of kv_pool(), or device blocks
// with the same ids).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"

#include "memory/kv_block_pool.h"
#include "partition/model_shape.h"
#include "runtime/kv_cache.h"

namespace shardline::runtime {

// One row of a forward call: a token of some sequence at some position. A call may mix rows of several
// sequences (a micro-batch: one decode token each, or prefill chunks); rows of one sequence come in
// increasing position order.
struct Row {
  KvCache* cache = nullptr;  // the row's sequence's cache on this stage
  int pos = 0;               // the row's position in its sequence
};

class StageBackend {
 public:
  virtual ~StageBackend() = default;

  // "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3)": for logs.
  virtual std::string describe() const = 0;
  virtual const partition::ModelShape& shape() const = 0;

  // A KV cache for this stage's layers and kv heads, holding positions [0, n_positions) (default seq_len).
  virtual KvCache make_kv_cache(int n_positions = 0) = 0;
  // Pool blocks a sequence of n_positions positions will hold at its longest.
  virtual int kv_blocks_for(int n_positions) const = 0;
  // The pool whose block ids the caches hold (its counts are the backend's KV capacity).
  virtual const memory::KvBlockPool& kv_pool() const = 0;

  // First stage: x[t] = embedding[tokens[t]].   x: (n, dim), host
  virtual void embed(const int* tokens, int n, float* x) = 0;
  // Runs n rows through this stage's layers, reading and extending each row's KV cache.
  // x: (n, dim), host, updated in place. n <= max_rows().
  virtual void forward(float* x, const Row* rows, int n) = 0;
  // Last stage: logits of n activation rows, gathered over the TP group.   x: (n, dim)  logits: (n, vocab)
  virtual void logits(const float* x, int n, float* logits) = 0;
  // Last stage: each row's greedy token, the argmax of its logits (llama2.c's: the first of equal maxima),
  // on every rank of the TP group. logits_scratch (n, vocab) is the caller's, for backends that gather the
  // logits to pick them (the default: logits(), then the argmax of each row); a backend whose TP ranks each
  // hold a slice of the vocabulary may instead reduce each rank's best (value, index) and leave it unused.
  // values (n) receives each row's winning logit, and saw_nan (n) whether any of the row's logits is NaN
  // (argmax skips a NaN after the first, so neither the token nor its value would show a NaN classifier row).
  virtual void greedy_tokens(const float* x, int n, float* logits_scratch, int* tokens, float* values, bool* saw_nan);

  virtual int max_rows() const = 0;
  // Grows the scratch buffers to take max_rows rows per forward call.
  virtual void reserve_rows(int max_rows) = 0;

  // Activations between pipeline stages. A backend that keeps them on its device may move them itself, so
  // they never visit the host between stages (the CUDA stage: NCCL send/recv between the same-tp ranks of
  // neighbouring stages). The pipeline then sends each item's header first, over its own communicator, and
  // calls, per item: recv_activations (stages after the first), forward_resident, then isend_activations
  // (stages before the last) or download_activations (the last stage, which samples on the host).
  // The default backend moves nothing: the pipeline sends forward()'s host rows itself.
  virtual bool moves_activations() const { return false; }
  // Receives n rows from the previous stage into the input of the next forward_resident. Blocks until
  // they have arrived (bounded by --comm-timeout).
  virtual void recv_activations(int n);
  // forward() on the input the backend holds: x (n, dim) from the host when x is not null, else the rows
  // recv_activations received. The output stays with the backend.
  virtual void forward_resident(const float* x, const Row* rows, int n);
  // Starts sending the last forward_resident's n output rows to the next stage and returns at once: the
  // rows are copied aside first, so later forward calls may run while the send is in flight. wait() on the
  // result returns once they are delivered (bounded by --comm-timeout).
  virtual std::unique_ptr<comm::PendingSend> isend_activations(int n);
  // Copies the last forward_resident's n output rows to the host.   x: (n, dim)
  virtual void download_activations(float* x, int n);
};

}  // namespace shardline::runtime
