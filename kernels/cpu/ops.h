// CPU kernels: one signature per op, plain float pointers with shape comments. Kernels never throw and
// never allocate; callers own every buffer. Multi-threaded with OpenMP inside the rank (set_num_threads);
// the inner loops are compiled for several ISAs (AVX-512, AVX2+FMA, portable) and picked at run time.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

namespace shardline::kernels::cpu {

// Threads used by every kernel of this process (the rank's --threads). Returns the previous value.
int set_num_threads(int n_threads);
int num_threads();
// Whether a kernel that splits its own work should open an OpenMP region for it: more than one kernel
// thread, enough work (the caller's test), and not already inside a region (a run_team() pass or another
// kernel's). Otherwise the kernel runs on its caller without entering OpenMP: a pragma whose if() is false
// still enters libgomp, which allocates a team when the last region had another size (a 1-row decode step's
// 1-row kernels between 2-thread passes) and on every call inside a region (session 29: a fold in the
// tiles made a 110M int8 batch-16 decode step 3x slower). tests/unit/runtime/decode_allocation_test.cpp
// counts the allocations.
bool open_parallel_region(bool enough_work);
// Calls fn(thread, context) once on each of the num_threads() kernel threads (thread 0 is the caller), so
// the runtime can pin each worker to a core (runtime/rank_binding.h owns that). Every kernel's parallel
// region reuses these threads.
void run_on_each_thread(void (*fn)(int thread, void* context), void* context);

// The contiguous band [begin, end) of n_items that thread `thread` of n_threads takes: bands in thread order,
// sizes differing by at most one. The split of parallel_for, and of the matmuls' panels before any stealing
// (StealingBands).
struct Band {
  int begin;
  int end;
};
inline Band thread_band(int n_items, int thread, int n_threads) {
  return {static_cast<int>(static_cast<long>(n_items) * thread / n_threads),
          static_cast<int>(static_cast<long>(n_items) * (thread + 1) / n_threads)};
}

// The kernel threads of one parallel pass, as one of them sees it. A kernel given a Team does this thread's
// share of its work (the same split its own parallel pass would make) and opens no pass of its own, so a
// caller runs several steps in one pass, team_barrier() between them: one fork and join (0.7-1.3 us of
// both threads' time on the project VMs, 3 us on one with slow system calls) where each step took one, and
// a barrier (0.05-0.5 us; threads.cpp) instead. kernels_bench --benchmark_filter=Team measures both.
struct Team {
  int thread = 0;
  int n_threads = 1;
  Band share(int n_items) const { return thread_band(n_items, thread, n_threads); }
  // This thread's contiguous band of n_items whose costs differ (cost(i) >= 0, e.g. attention's context
  // length per row): item i goes to the thread whose equal share of the total cost holds the middle of its
  // own cost, so the bands cost about the same. Every thread computes every boundary the same way, so the
  // bands tile [0, n_items) in thread order. O(n_items).
  template <typename Cost>
  Band share_by_cost(int n_items, Cost&& cost) const {
    long total = 0;
    for (int i = 0; i < n_items; ++i) total += cost(i);
    if (total <= 0 || n_threads <= 1) return share(n_items);
    // Item i (costs before it: before) belongs to thread floor((before + cost / 2) * n_threads / total):
    // doubled to stay in integers (2 x total x n_threads must fit a long: attention's int context lengths
    // over int rows do, with room to spare).
    Band band{n_items, n_items};
    long before = 0;
    for (int i = 0; i < n_items; ++i) {
      const long c = cost(i);
      const long owner = std::min<long>(((2 * before + c) * n_threads) / (2 * total), n_threads - 1);
      if (owner >= thread && band.begin == n_items) band.begin = i;
      if (owner > thread) {
        band.end = i;
        break;
      }
      before += c;
    }
    return band;
  }
};
// Runs body(team) once on each of the num_threads() kernel threads, in one parallel pass (on the caller
// alone with one thread). Every thread must reach the same team_barrier() calls.
void run_team_impl(void (*body)(void* context, Team team), void* context);
template <typename Body>
void run_team(Body&& body) {
  run_team_impl([](void* context, Team team) { (*static_cast<std::remove_reference_t<Body>*>(context))(team); }, &body);
}
// Waits until every thread of the running run_team() pass has reached it: what one thread wrote before is
// then visible to all. Outside a pass (one thread) it returns at once.
void team_barrier();

// Items [0, n_items) of one loop in the team's bands (Team::share), taken a run at a time: each thread first takes its
// own band's runs from the front, each a quarter of what is left of the band in whole grains (at least one grain), and
// then, its band done, other bands' runs of one grain from the back. A thread whose core is busy with something else
// for a while (the host's other work on a VM, an interrupt) falls behind: with fixed bands the others then wait for it
// at the next barrier, 5-15% of each thread's time in 16-row matmuls on a 2-vCPU Emerald Rapids VM (issue #7, session
// 26). Each band stays one stream from the front, and a thread claims its own runs on a cache line nobody else touches
// until it is stolen from. Every thread of the team must construct one for the same loops in the same order (as with
// team_barrier()); outside a run_team() pass, on one thread, or past kTeamLoops loops in one pass, each thread takes
// its own band alone, as one run.
inline constexpr int kTeamLoops = 32;
class StealingBands {
 public:
  StealingBands(int n_items, int grain, Team team);
  // The next run [begin, end) of this thread's items, or {-1, -1} when none is left. Runs from the own band
  // (Team::share) come first, in order.
  Band next();
  // The first item of the run next() most likely returns, for a prefetch: -1 when next() steals or ends.
  int likely_next() const;

 private:
  int n_items_;
  int grain_;
  Team team_;
  std::atomic<std::uint64_t>* words_;  // the pass's claims on each band for this loop (threads.cpp), or null
  int own_next_;                       // without words: the next item of this thread's band
  int victim_ = 0;                     // the band this thread steals from next (offset from its own)
};

// Runs body(item, thread) for item in [0, n) on the kernel threads, each thread a contiguous band of items
// (thread < num_threads()). For independent per-row work (the greedy picks of a batch's rows); a kernel
// called from the body runs on its caller's thread alone. n = 1 runs on the calling thread, so a single
// row keeps its own inner parallelism. No allocation.
void parallel_for_impl(int n, void (*body)(void* context, int item, int thread), void* context);
template <typename Body>
void parallel_for(int n, Body&& body) {
  parallel_for_impl(
      n, [](void* context, int item, int thread) { (*static_cast<std::remove_reference_t<Body>*>(context))(item, thread); },
      &body);
}

// RMSNorm of n rows: out[r] = x[r] / sqrt(mean(x[r]²) + eps) * weight. out may alias x.
//   out, x: (n, dim)   weight: (dim)
void rmsnorm(float* out, const float* x, const float* weight, int n, int dim, float eps);
// The same on the calling thread alone, for callers that run it inside their own parallel pass.
void rmsnorm_serial(float* out, const float* x, const float* weight, int n, int dim, float eps);

// Rotary embedding on adjacent pairs within each head, for one token at position pos.
//   vec: (n_heads, head_size); theta_base = 10000 for Llama.
void rope(float* vec, int n_heads, int head_size, int pos, float theta_base);
// The same in two halves, for a batch: the rotation depends on (pos, pair) only, so a forward pass computes
// each row's angles once (a pow, a cos and a sin per pair) and rotates q and k of every layer with them.
// rope() is exactly rope_angles() then rope_rotate().
//   cos_sin: (head_size / 2, 2): cos and sin of pair i at 2i and 2i + 1.
//   freq_divisors: null, or (head_size / 2): pair i's angle is divided by freq_divisors[i] (Llama 3.1's RoPE
//   scaling, which a GGUF file stores as the tensor rope_freqs.weight and ggml applies the same way).
void rope_angles(float* cos_sin, int head_size, int pos, float theta_base, const float* freq_divisors = nullptr);
void rope_rotate(float* vec, int n_heads, int head_size, const float* cos_sin);

// In-place numerically stable softmax over size values.
void softmax(float* x, int size);

// SwiGLU gate: h1 = silu(h1) * h3, elementwise over size values.
void swiglu(float* h1, const float* h3, int size);

// y += x, elementwise over size values (y and x do not overlap).
void add_inplace(float* y, const float* x, int size);

// The element of a KV cache's rows: fp32; fp16 (IEEE binary16, rounded to nearest even when stored), which
// halves the bytes attention streams per position, with a relative rounding error of at most 2^-11 for
// |x| >= 2^-14 (below, an absolute 2^-25), and values from 65520 on rounding to infinity (the largest half
// is 65504); or int8, a quarter of fp32's bytes plus a float per head: each head's values of a row as codes
// round(x * 127 / max|x|) with the scale max|x| / 127 (an absolute error of at most half a scale, max|x| /
// 254, per value) (the run's --kv-dtype; see docs/kv-cache.md).
enum class KvDtype { kF32, kF16, kInt8 };
// "fp32", "fp16", "int8": what --kv-dtype takes.
const char* kv_dtype_name(KvDtype dtype);
std::optional<KvDtype> parse_kv_dtype(std::string_view name);
// Bytes of one cache row of n values (n / head_size whole heads): n values of fp32 or fp16, or n int8 codes
// followed by n / head_size float scales (unaligned).
std::size_t kv_row_bytes(KvDtype dtype, int n, int head_size);
// The same per value, for cost models: kv_row_bytes(dtype, head_size, head_size) / head_size.
double kv_bytes_per_value(KvDtype dtype, int head_size);

// Stores n floats (n / head_size heads) as one cache row of dtype (dst: kv_row_bytes of it). The same bits
// on every ISA.
void store_kv_row(void* dst, const float* x, int n, int head_size, KvDtype dtype);
// Reads a cache row of dtype back as n floats: fp32 and fp16 exactly, int8 as code * its head's scale.
void load_kv_row(float* x, const void* src, int n, int head_size, KvDtype dtype);

// Causal grouped-query attention for one query token over n_ctx cached positions.
//   out: (n_heads, head_size)    q: (n_heads, head_size)
//   k_cache, v_cache: (n_ctx, kv_stride); head h reads kv head h / (n_heads / n_kv_heads) at column
//   offset (kv head index) * head_size.    scratch: (n_heads, n_ctx)
void attention(float* out, const float* q, const float* k_cache, const float* v_cache, float* scratch,
               int n_ctx, int n_heads, int n_kv_heads, int head_size, int kv_stride);

// Contexts longer than this split one row's heads over the kernel threads; shorter ones are not worth
// waking them for (a batch's rows already run on different threads).
inline constexpr int kMinParallelAttentionContext = 64;

// The same over a paged cache: position t's key row is k_blocks[t / block_tokens] + (t % block_tokens) *
// kv_stride (values alike), so a sequence's positions may live in blocks anywhere in memory.
//   k_blocks, v_blocks: (ceil(n_ctx / block_tokens)) pointers to (block_tokens, kv_stride) blocks.
// Same arithmetic in the same order as the contiguous form: both give bit-identical results.
// The blocks hold rows of dtype (kv_stride counts values; a row takes kv_row_bytes(dtype, kv_stride,
// head_size)): an fp16 cache's values are converted to fp32 exactly as they are read, and the arithmetic
// is the fp32 cache's, so attention over fp16 rows equals fp32 attention over those rows' rounded values,
// bit for bit. An int8 cache's codes are converted exactly too; a head's score is its dot product with the
// codes times the key row's scale, and a position's softmax weight is multiplied by the value row's scale
// before the weighted sum (one multiply per head and position, not per value). Every ISA gives the same bits.
void attention_paged(float* out, const float* q, const void* const* k_blocks, const void* const* v_blocks,
                     KvDtype dtype, int block_tokens, float* scratch, int n_ctx, int n_heads, int n_kv_heads,
                     int head_size, int kv_stride);
// The team's share of the same: this thread's band of the heads (Team), no parallel pass of its own.
void attention_paged(float* out, const float* q, const void* const* k_blocks, const void* const* v_blocks,
                     KvDtype dtype, int block_tokens, float* scratch, int n_ctx, int n_heads, int n_kv_heads,
                     int head_size, int kv_stride, Team team);

// Query rows attention_rows_paged takes at once.
inline constexpr int kAttentionRowsAtOnce = 16;
// The rows worth passing to attention_rows_paged at once with the active ISA's kernels: kAttentionRowsAtOnce
// where they have a kernel for several rows (AVX2), 1 where they go row by row anyway.
int attention_rows_at_once();

// Query tokens of one sequence at consecutive positions at once (a prefill chunk's rows): row r of `rows`
// (1 to kAttentionRowsAtOnce) attends over n_ctx + r positions, with q + r q_stride, out + r out_stride and
// scratch + r scratch_stride (each (n_heads, n_ctx + r)); this thread's band of the heads (Team). What
// attention_paged gives each row, bit for bit. Where the build has a kernel for it (AVX2, heads of 16 to
// 128 values in multiples of 16), the rows take each key from L1 in turn and walk each kv head's values a
// tile at a time, 4 sums a walk, from L2: a long prompt's cache comes from L3 once for the rows instead of
// once per row.
void attention_rows_paged(float* out, std::size_t out_stride, const float* q, std::size_t q_stride,
                          const void* const* k_blocks, const void* const* v_blocks, KvDtype dtype, int block_tokens,
                          float* scratch, std::size_t scratch_stride, int n_ctx, int rows, int n_heads,
                          int n_kv_heads, int head_size, int kv_stride, Team team);

// Index of the largest value (first on ties), as llama2.c's argmax.
int argmax(const float* x, int size);

}  // namespace shardline::kernels::cpu
