// Matmul against packed weights (weight_format.h) in fp32, bf16 or int8, for n rows at once: n = 1 is a
// decode GEMV, n = B rows of B sequences is batched decode, n = a prompt chunk is prefill. Every loaded
// weight vector is used for all n rows before the next is loaded, so B sequences share one pass over W.
//
// Activations are prepared once per input and reused by every matrix that reads it (wq, wk and wv share
// the normalised x; w1 and w3 share it too). fp32 and bf16 weights multiply fp32 activations as they are
// (bf16 weights are widened to fp32 in registers: exact, and no rounding of x); int8 weights need x
// quantised to int8 in the weights' groups of 32, 64, 96 or 128 k (scale and sum per group), for vpdpbusd
// and TDPBSUD. Where the CPU has bf16 dot products (AVX512_BF16's vdpbf16ps, AMX's TDPBF16PS), bf16
// weights multiply x split into two bf16 halves (hi + lo keeps 16 significant bits of x, and each product
// of two bf16 values is exact in fp32), so those kernels do not round the activations to bf16 either.
//
// Threads (set_num_threads) split the output panels into contiguous bands, so each thread streams its own
// part of W, and a thread done with its band takes tiles from the back of a slower thread's
// (StealingBands, ops.h). Each output is computed by one thread in a fixed order along k, so results do
// not depend on the thread count, on which thread took a tile, nor on n or on the other rows of the batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/weight_format.h"

namespace shardline::kernels::cpu {

// x prepared for one weight dtype. Owns its storage: reserve() allocates (once, at set-up), prepare()
// never does.
class Activations {
 public:
  void reserve(int max_rows, int max_k);
  // x: (n, k). For fp32 and bf16 weights the pointer is kept as is: x must stay valid and unchanged while
  // it is used. int8 quantises in groups of int8_group k values, the group of the weights it will meet
  // (PackedMatrix::int8_group_size(); 0: default_int8_group(k)).
  void prepare(const float* x, int n, int k, WeightDtype dtype, int int8_group = 0);
  // The same for the matrix w (its dtype, k and int8 group).
  void prepare(const float* x, int n, const PackedMatrix& w) { prepare(x, n, w.k, w.dtype, w.int8_group_size()); }
  // A layer's input for w in one parallel pass over its n rows: x += residual (unless null), out =
  // rmsnorm(x, weight, eps), then prepare(out, n, w). Each thread adds, normalises and prepares its own band
  // of rows while they are in its cache: one fork and join where the three calls took three, and no row
  // written on one core and read on another. The same bits as add_inplace(), rmsnorm() and prepare() (ops.h)
  // one after the other. x and out are (n, w.k); out stays in use for fp32 and bf16 weights, as prepare()'s x.
  void prepare_normalised(float* out, float* x, const float* residual, const float* weight, float eps, int n,
                          const PackedMatrix& w) {
    normalise_and_prepare(out, x, x, residual, weight, eps, n, w);
  }
  // The same without a residual (x is only read).
  void prepare_normalised(float* out, const float* x, const float* weight, float eps, int n, const PackedMatrix& w) {
    normalise_and_prepare(out, x, nullptr, nullptr, weight, eps, n, w);
  }
  // prepare(x, n, w) in two halves, for a caller whose threads write x's rows themselves: prepare_shape()
  // once, then prepare_rows() on each thread for the rows it has just written (disjoint ranges, any
  // thread), so no row is written on one core and read on another and no parallel pass of its own is
  // needed. The same bits as prepare().
  void prepare_shape(const float* x, int n, const PackedMatrix& w) { set_shape(x, n, w.k, w.dtype, w.int8_group_size()); }
  void prepare_rows(const float* x, int r0, int r1);
  // prepare_normalised(out, x, residual, ...) in the same two halves: prepare_shape(out, n, w) once, then
  // normalise_rows() on each thread for its rows [r0, r1) (x += residual unless null, out = rmsnorm(x),
  // prepared). The same bits as prepare_normalised().
  void normalise_rows(float* out, float* x, const float* residual, const float* weight, float eps, int r0, int r1) {
    normalise_rows(out, x, x, residual, weight, eps, r0, r1);
  }

  WeightDtype dtype() const { return dtype_; }
  int n() const { return n_; }
  int k() const { return k_; }
  int row_stride() const { return padded_k_; }  // elements between rows of the prepared data

  const float* f32() const { return f32_; }                       // (n, k): fp32 and bf16 weights
  const std::int8_t* int8() const { return int8_.data(); }        // (n, padded k)
  const float* int8_scales() const { return scales_.data(); }     // (n, int8_groups())
  const std::int32_t* int8_sums() const { return sums_.data(); }  // (n, int8_groups()): sum of q per group
  int int8_group() const { return int8_group_; }                  // k values per group (0 unless int8)
  int int8_groups() const { return int8_group_ > 0 ? padded_k_ / int8_group_ : 0; }
  // bf16 weights where the CPU has bf16 dots (avx512-bf16 or AMX; empty otherwise): x split into bf16 halves
  // hi = bf16(x), lo = bf16(x - hi), rows of bf16_stride() elements (k padded to kBf16Block with zeros).
  // Prepared whenever the CPU has them, so a kernel choice made after prepare() (tests step the ISA down)
  // finds what it needs.
  const std::uint16_t* bf16_hi() const { return bf16_hi_.empty() ? nullptr : bf16_hi_.data(); }
  const std::uint16_t* bf16_lo() const { return bf16_lo_.empty() ? nullptr : bf16_lo_.data(); }
  int bf16_stride() const { return padded_k(WeightDtype::kBf16, k_); }

 private:
  // prepare() in two halves: the shape and dtype, then each row (rows are independent; any thread).
  void set_shape(const float* x, int n, int k, WeightDtype dtype, int int8_group);
  // prepare_normalised(): x_add (x itself, or null without a residual) += residual.
  void normalise_and_prepare(float* out, const float* x, float* x_add, const float* residual, const float* weight,
                             float eps, int n, const PackedMatrix& w);
  void normalise_rows(float* out, const float* x, float* x_add, const float* residual, const float* weight, float eps,
                      int r0, int r1);

  WeightDtype dtype_ = WeightDtype::kF32;
  int n_ = 0;
  int k_ = 0;
  int padded_k_ = 0;
  int int8_group_ = 0;
  int max_rows_ = 0;
  int max_k_ = 0;
  const float* f32_ = nullptr;
  std::vector<std::int8_t> int8_;
  std::vector<float> scales_;
  std::vector<std::int32_t> sums_;
  std::vector<std::uint16_t> bf16_hi_;
  std::vector<std::uint16_t> bf16_lo_;
};

// One output of a grouped matmul: y (n, w.d) = x · Wᵀ.
struct MatmulOutput {
  float* y = nullptr;
  const PackedMatrix* w = nullptr;
};

// y (n, w.d) = x · Wᵀ, x prepared for w.dtype with x.k() == w.k.
void matmul(float* y, const Activations& x, const PackedMatrix& w);

// Several matrices of the same input in one parallel pass (wq, wk, wv). Matrices packed one after the other
// (as ShardWeights packs q, k and v) are split as one matrix of all their panels, which balances better
// than one small matmul after another; others one matrix at a time.
void matmul(const Activations& x, std::span<const MatmulOutput> outputs);

// The team's share of either (ops.h Team): this thread's tiles (its band of the panels and what it takes
// from slower threads' bands), no parallel pass of its own. Every thread of the team must call it.
void matmul(float* y, const Activations& x, const PackedMatrix& w, Team team);
void matmul(const Activations& x, std::span<const MatmulOutput> outputs, Team team);

// A row-parallel matmul (wo, w2: tensor parallelism splits their k) in reduction segments, so that every
// layout adds the same partial sums in the same order and gets one rank's bits. k_bounds: the segments'
// S + 1 borders along w's k (0 first, w.k last; each segment's start on an int8 group, a bf16 block of 32,
// anywhere for fp32). Each segment's product p_s (n, w.d) = x[:, segment] · W[:, segment]ᵀ is computed as a
// matmul of its own (its sums start at zero). fold: y (n, w.d) = ((p_0 + p_1) + p_2) + ... + p_(S-1), as the
// tiles are computed (one add per element and product: any code that adds them in that order gets the same
// bits); else y (S, n, w.d) holds each p_s, for a TP rank to add onto the sum of the segments before its own.
void matmul_segments(float* y, const Activations& x, const PackedMatrix& w, std::span<const int> k_bounds, bool fold);
void matmul_segments(float* y, const Activations& x, const PackedMatrix& w, std::span<const int> k_bounds, bool fold,
                     Team team);
// The same for rows [row0, row0 + n_rows) of x only (y's rows counted from row0): a caller bounds its
// buffers of products this way (a prefill chunk in blocks of rows).
void matmul_segments(float* y, const Activations& x, const PackedMatrix& w, std::span<const int> k_bounds, bool fold,
                     int row0, int n_rows, Team team);

// Per row r of x, the index of the largest of the w.d values x · Wᵀ holds and that value, without writing
// them: greedy decoding's pick from the classifier, which saves storing the (n, vocabulary) logits and a
// second pass to find their maxima. With first_nan_wins the index is what argmax() returns for the row:
// the first of equal maxima, NaNs skipped except a NaN first value, which wins (argmax() returns 0 then).
// Without it a NaN first value is skipped like any other, and a row of NaNs gets index -1 (value NaN): how a
// vocabulary slice after the first compares its best with the others'. The values are matmul()'s, bit for bit.
// has_nan (n, or null) says which rows held a NaN anywhere (argmax skips them, so the winner does not show it).
void matmul_argmax(const Activations& x, const PackedMatrix& w, float* values, int* indices, bool first_nan_wins,
                   bool* has_nan = nullptr);

// The SwiGLU gate fused into its two matmuls: h (n, d) = silu(x · W1ᵀ) * (x · W3ᵀ), elementwise, with the
// same arithmetic as swiglu() in ops.h. Saves writing and re-reading x · W3ᵀ and runs the gate on every
// thread. w1 and w3 have the same shape and dtype.
void matmul_swiglu(float* h, const Activations& x, const PackedMatrix& w1, const PackedMatrix& w3);
void matmul_swiglu(float* h, const Activations& x, const PackedMatrix& w1, const PackedMatrix& w3, Team team);

}  // namespace shardline::kernels::cpu
