// Micro-benchmarks of the CPU kernels on real model shapes. Decode is bandwidth-bound, so matmul and
// attention report bytes processed: the GB/s column is what to compare against the machine's memory
// bandwidth (STREAM triad) and across thread counts. Note that the 110M shapes' weights (2.4-6.3 MB) may
// sit in L2/L3 when run in a loop, TinyLlama's w1 (46 MB) does not.
//
//   kernels_bench --benchmark_filter=Matmul --benchmark_min_time=0.5
#include <algorithm>
#include <cstddef>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "kernels/cpu/bandwidth_probe.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/packed_matmul.h"
#include "tests/support/kernel_fixtures.h"

namespace shardline::kernels::cpu {
namespace {

using test::random_floats;
using test::ScopedThreads;

// Packed weights (the engine's path) in each dtype. Args: dtype (0 fp32, 1 bf16, 2 int8), n, k, d, threads.
// bytes_per_second counts the packed weight bytes (what a decode step streams); the read_GBps counter is
// the bandwidth probe on the same buffer with the same threads, measured in the same benchmark, and
// roofline_fraction = achieved / probe. GFLOPS counts 2 n k d per call.
void BM_PackedMatmul(benchmark::State& state) {
  const auto dtype = static_cast<WeightDtype>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const int k = static_cast<int>(state.range(2));
  const int d = static_cast<int>(state.range(3));
  ScopedThreads threads(static_cast<int>(state.range(4)));
  const std::vector<float> w = random_floats(static_cast<std::size_t>(d) * k, 1);  // (d, k)
  const std::vector<float> x = random_floats(static_cast<std::size_t>(n) * k, 2);  // (n, k)
  std::vector<float> y(static_cast<std::size_t>(n) * d);                           // (n, d)
  const std::size_t bytes = packed_size_bytes(dtype, d, k);
  std::unique_ptr<std::byte, decltype(&std::free)> packed(
      static_cast<std::byte*>(std::aligned_alloc(kPackedAlignment, bytes)), &std::free);
  pack_weights(dtype, w.data(), k, d, k, packed.get());
  const PackedMatrix matrix{dtype, d, k, packed.get()};
  Activations activations;
  activations.reserve(n, k);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    activations.prepare(x.data(), n, k, dtype);
    matmul(y.data(), activations, matrix);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double per_call_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / std::max<double>(1, state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes));
  state.counters["GFLOPS"] = benchmark::Counter(2.0 * n * k * d, benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1000);
  // The probe streams the same buffer with the same threads right after the timed loop.
  const ReadRegion region{packed.get(), bytes};
  double probe_s = 1e30;
  for (int i = 0; i < 5; ++i) probe_s = std::min(probe_s, time_stream_read(std::span(&region, 1)));
  state.counters["read_GBps"] = bytes / probe_s / 1e9;
  state.counters["roofline_fraction"] = probe_s / per_call_s;
  state.SetLabel(weight_dtype_name(dtype));
}

void packed_matmul_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"dtype", "n", "k", "d", "threads"});
  // 110M w1 (768 -> 2048) stays in L2/L3; TinyLlama 1.1B w1 (2048 -> 5632, 46 MB fp32) streams from DRAM.
  const int shapes[][2] = {{768, 2048}, {2048, 5632}};
  for (int dtype : {0, 1, 2}) {
    for (int n : {1, 4, 16, 64}) {
      for (const auto& s : shapes) {
        for (int threads : {1, 2}) b->Args({dtype, n, s[0], s[1], threads});
      }
    }
  }
  // The 15M shape's matrices (q/k/v as one, wo, w1 and w3 as one 1536-row matrix, w2, the classifier), fp32
  // at batch 1 and 16 on two threads: what its batch-16 step spends in the matmuls alone (BENCHMARKS.md,
  // session 36).
  const int small_shapes[][2] = {{288, 864}, {288, 288}, {288, 1536}, {768, 288}, {288, 32000}};
  for (int n : {1, 16}) {
    for (const auto& s : small_shapes) b->Args({0, n, s[0], s[1], 2});
  }
}
BENCHMARK(BM_PackedMatmul)->Apply(packed_matmul_args)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The same matmul in reduction segments (matmul_segments, folded in the tiles: how wo and w2 run on every
// layout since session 28) against one matmul over the whole k, in one process, so the segments' cost reads
// without the machine's swings. Args: dtype, n, k, d, segments (0: plain matmul()), int8 group, threads.
// Segments are equal runs of whole blocks of `group` k (partition::hidden_segment's split).
void BM_SegmentedMatmul(benchmark::State& state) {
  const auto dtype = static_cast<WeightDtype>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const int k = static_cast<int>(state.range(2));
  const int d = static_cast<int>(state.range(3));
  const int segments = static_cast<int>(state.range(4));
  const int group = static_cast<int>(state.range(5));
  ScopedThreads threads(static_cast<int>(state.range(6)));
  const std::vector<float> w = random_floats(static_cast<std::size_t>(d) * k, 1);
  const std::vector<float> x = random_floats(static_cast<std::size_t>(n) * k, 2);
  std::vector<float> y(static_cast<std::size_t>(n) * d);
  const int int8_group = dtype == WeightDtype::kInt8 ? group : 0;
  const std::size_t bytes = packed_size_bytes(dtype, d, k, int8_group);
  std::unique_ptr<std::byte, decltype(&std::free)> packed(
      static_cast<std::byte*>(std::aligned_alloc(kPackedAlignment, bytes)), &std::free);
  pack_weights(dtype, w.data(), k, d, k, packed.get(), int8_group);
  const PackedMatrix matrix{dtype, d, k, packed.get(), int8_group};
  std::vector<int> bounds;
  for (int s = 0; s <= segments; ++s) bounds.push_back(k / group * s / std::max(segments, 1) * group);
  Activations activations;
  activations.reserve(n, k);
  activations.prepare(x.data(), n, matrix);
  for (auto _ : state) {
    if (segments == 0) {
      matmul(y.data(), activations, matrix);
    } else {
      matmul_segments(y.data(), activations, matrix, bounds, /*fold=*/true);
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPS"] = benchmark::Counter(2.0 * n * k * d, benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1000);
  state.SetLabel(weight_dtype_name(dtype));
}

void segmented_matmul_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"dtype", "n", "k", "d", "segments", "group", "threads"});
  // wo and w2 of the 15M shape (6 kv heads: wo's int8 heads padded to 64, the shape int8 runs; fp32 and bf16
  // run 288 -> 288 in segments of 48) and of the 110M one (12 kv heads).
  const int shapes[][4] = {{384, 288, 6, 64}, {768, 288, 6, 128}, {768, 768, 12, 64}, {2048, 768, 12, 128}};
  for (int dtype : {0, 1, 2}) {
    for (int n : {1, 16, 64}) {
      for (const auto& s : shapes) {
        for (int segments : {0, s[2]}) b->Args({dtype, n, s[0], s[1], segments, s[3], 2});
      }
    }
  }
}
BENCHMARK(BM_SegmentedMatmul)->Apply(segmented_matmul_args)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Args: n_ctx, n_heads, n_kv_heads, threads. head_size 64 for both models.
// The greedy pick from the classifier: n rows x a 32000-entry vocabulary, either the logits written and
// each row's argmax() after (fused 0, what sampling needs) or matmul_argmax (fused 1, what greedy decoding
// runs). Args: dtype, n, k (288: the 15M shape's dim, 768: 110M's), fused, threads.
void BM_ClassifierPick(benchmark::State& state) {
  const auto dtype = static_cast<WeightDtype>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const int k = static_cast<int>(state.range(2));
  const bool fused = state.range(3) != 0;
  ScopedThreads threads(static_cast<int>(state.range(4)));
  constexpr int kVocab = 32000;
  const std::vector<float> w = random_floats(static_cast<std::size_t>(kVocab) * k, 1);
  const std::vector<float> x = random_floats(static_cast<std::size_t>(n) * k, 2);
  std::vector<float> logits(static_cast<std::size_t>(n) * kVocab), values(n);
  std::vector<int> tokens(n);
  const int group = default_int8_group(k);
  const std::size_t bytes = packed_size_bytes(dtype, kVocab, k, group);
  std::unique_ptr<std::byte, decltype(&std::free)> packed(
      static_cast<std::byte*>(std::aligned_alloc(kPackedAlignment, bytes)), &std::free);
  pack_weights(dtype, w.data(), k, kVocab, k, packed.get(), group);
  const PackedMatrix matrix{dtype, kVocab, k, packed.get(), group};
  Activations activations;
  activations.reserve(n, k);
  activations.prepare(x.data(), n, k, dtype);
  for (auto _ : state) {
    if (fused) {
      matmul_argmax(activations, matrix, values.data(), tokens.data(), true);
    } else {
      matmul(logits.data(), activations, matrix);
      parallel_for(n, [&](int r, int) { tokens[r] = argmax(logits.data() + static_cast<std::size_t>(r) * kVocab, kVocab); });
    }
    benchmark::DoNotOptimize(tokens.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes));
  state.SetLabel(std::string(weight_dtype_name(dtype)) + (fused ? " fused" : " logits+argmax"));
}
BENCHMARK(BM_ClassifierPick)
    ->ArgNames({"dtype", "n", "k", "fused", "threads"})
    ->ArgsProduct({{0, 1, 2}, {1, 16}, {288, 768}, {0, 1}, {2}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_Attention(benchmark::State& state) {
  const int n_ctx = static_cast<int>(state.range(0));
  const int n_heads = static_cast<int>(state.range(1));
  const int n_kv_heads = static_cast<int>(state.range(2));
  ScopedThreads threads(static_cast<int>(state.range(3)));
  const int head_size = 64;
  const int kv_stride = n_kv_heads * head_size;
  const std::vector<float> q = random_floats(static_cast<std::size_t>(n_heads) * head_size, 3);        // (n_heads, head_size)
  const std::vector<float> k_cache = random_floats(static_cast<std::size_t>(n_ctx) * kv_stride, 4);    // (n_ctx, kv_stride)
  const std::vector<float> v_cache = random_floats(static_cast<std::size_t>(n_ctx) * kv_stride, 5);    // (n_ctx, kv_stride)
  std::vector<float> out(static_cast<std::size_t>(n_heads) * head_size);                               // (n_heads, head_size)
  std::vector<float> scratch(static_cast<std::size_t>(n_heads) * n_ctx);                               // (n_heads, n_ctx)
  for (auto _ : state) {
    attention(out.data(), q.data(), k_cache.data(), v_cache.data(), scratch.data(), n_ctx, n_heads, n_kv_heads,
              head_size, kv_stride);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  // The K and V caches of one layer, each read once per call (GQA heads of a group share the same rows).
  const auto kv_bytes = 2 * static_cast<std::int64_t>(n_ctx) * kv_stride * static_cast<std::int64_t>(sizeof(float));
  state.SetBytesProcessed(state.iterations() * kv_bytes);
}

void attention_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n_ctx", "n_heads", "n_kv_heads", "threads"});
  b->Args({32, 12, 12, 1});  // a decode's short context (shardline bench's: 8-40 positions), one thread: no team
  for (int n_ctx : {256, 1024}) {
    for (int threads : {1, 2}) {
      b->Args({n_ctx, 12, 12, threads});  // 110M: multi-head
      b->Args({n_ctx, 32, 4, threads});   // TinyLlama: 8 query heads per kv head
    }
  }
}
BENCHMARK(BM_Attention)->Apply(attention_args)->Unit(benchmark::kMicrosecond)->UseRealTime();

// A prefill chunk's rows attending over a long context, one thread: kAttentionRowsAtOnce rows of one
// sequence at consecutive positions (the last at n_ctx), at once (attention_rows_paged) or row by row. The
// cache in blocks of 16 positions laid out as a 12-layer KvCache lays them out (a block holds every layer's
// keys and values), so that the rows of one layer are as far apart, and fall into the same cache sets, as in
// a real cache.
void BM_AttentionRows(benchmark::State& state) {
  const int n_ctx = static_cast<int>(state.range(0));
  const int n_heads = static_cast<int>(state.range(1));
  const int n_kv_heads = static_cast<int>(state.range(2));
  const bool at_once = state.range(3) != 0;
  constexpr int kRows = kAttentionRowsAtOnce, kBlockTokens = 16, kLayers = 12, head_size = 64;
  const int kv_stride = n_kv_heads * head_size, first_ctx = n_ctx - kRows + 1;
  const std::size_t q_dim = static_cast<std::size_t>(n_heads) * head_size;
  const std::size_t block_floats = static_cast<std::size_t>(kBlockTokens) * kv_stride;  // one layer's keys
  const int n_blocks = (n_ctx + kBlockTokens - 1) / kBlockTokens;
  // (n_blocks, kLayers, 2, kBlockTokens, kv_stride): layer 0's keys and values of each block
  std::vector<float> pool = random_floats(static_cast<std::size_t>(n_blocks) * kLayers * 2 * block_floats, 4);
  std::vector<const void*> k_blocks(n_blocks), v_blocks(n_blocks);
  for (int b = 0; b < n_blocks; ++b) {
    k_blocks[b] = pool.data() + static_cast<std::size_t>(b) * kLayers * 2 * block_floats;
    v_blocks[b] = pool.data() + (static_cast<std::size_t>(b) * kLayers * 2 + 1) * block_floats;
  }
  const std::vector<float> q = random_floats(kRows * q_dim, 3);  // (kRows, n_heads, head_size)
  std::vector<float> out(kRows * q_dim);                         // (kRows, n_heads, head_size)
  const std::size_t scratch_stride = static_cast<std::size_t>(n_heads) * n_ctx;
  std::vector<float> scratch(kRows * scratch_stride);  // (kRows, n_heads, n_ctx)
  for (auto _ : state) {
    if (at_once) {
      attention_rows_paged(out.data(), q_dim, q.data(), q_dim, k_blocks.data(), v_blocks.data(), KvDtype::kF32,
                           kBlockTokens, scratch.data(), scratch_stride, first_ctx, kRows, n_heads, n_kv_heads,
                           head_size, kv_stride, Team{});
    } else {
      for (int r = 0; r < kRows; ++r) {
        attention_paged(out.data() + r * q_dim, q.data() + r * q_dim, k_blocks.data(), v_blocks.data(), KvDtype::kF32,
                        kBlockTokens, scratch.data(), first_ctx + r, n_heads, n_kv_heads, head_size, kv_stride, Team{});
      }
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kRows);
  state.SetLabel(at_once ? "rows at once" : "row by row");
}
BENCHMARK(BM_AttentionRows)
    ->ArgNames({"n_ctx", "n_heads", "n_kv_heads", "at_once"})
    ->ArgsProduct({{256, 1024}, {12}, {12}, {0, 1}})
    ->Args({1024, 32, 4, 0})
    ->Args({1024, 32, 4, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Args: dim. rmsnorm is single-threaded; one token row as in decode.
void BM_Rmsnorm(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  const std::vector<float> x = random_floats(dim, 6);       // (1, dim)
  const std::vector<float> weight = random_floats(dim, 7);  // (dim)
  std::vector<float> out(dim);                              // (1, dim)
  for (auto _ : state) {
    rmsnorm(out.data(), x.data(), weight.data(), 1, dim, 1e-5f);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  // x and weight read, out written.
  state.SetBytesProcessed(state.iterations() * 3 * static_cast<std::int64_t>(dim) *
                          static_cast<std::int64_t>(sizeof(float)));
}
BENCHMARK(BM_Rmsnorm)->ArgName("dim")->Arg(768)->Arg(2048);

// Args: n. The row kernels with an exp in them, single-threaded: SwiGLU's gate over one token's hidden
// row (2048 for 110M, 5632 for 1.1B), softmax over one head's scores at a context of n positions.
// items_per_second: values a second.
// Times kernel(x, n) on a fresh copy of n random values each iteration (both kernels work in place).
template <typename Kernel>
void time_in_place(benchmark::State& state, std::uint32_t seed, const Kernel& kernel) {
  const int n = static_cast<int>(state.range(0));
  const std::vector<float> input = random_floats(n, seed);
  std::vector<float> x = input;
  for (auto _ : state) {
    std::copy(input.begin(), input.end(), x.begin());
    kernel(x.data(), n);
    benchmark::DoNotOptimize(x.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_Swiglu(benchmark::State& state) {
  const std::vector<float> up = random_floats(static_cast<int>(state.range(0)), 9);
  time_in_place(state, 8, [&](float* gate, int n) { swiglu(gate, up.data(), n); });
}
BENCHMARK(BM_Swiglu)->ArgName("n")->Arg(2048)->Arg(5632);

void BM_Softmax(benchmark::State& state) {
  time_in_place(state, 10, [](float* scores, int n) { softmax(scores, n); });
}
BENCHMARK(BM_Softmax)->ArgName("n")->Arg(40)->Arg(512);

// Args: k. One decode row quantised for int8 weights (groups of 32, a scale and a sum each): what every
// int8 matmul's input costs before the kernel runs, on one thread while the others wait at b=1.
void BM_QuantizeRow(benchmark::State& state) {
  const int k = static_cast<int>(state.range(0));
  const std::vector<float> x = random_floats(k, 11);
  Activations act;
  act.reserve(1, k);
  for (auto _ : state) {
    act.prepare(x.data(), 1, k, WeightDtype::kInt8, 32);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * k);
}
BENCHMARK(BM_QuantizeRow)->ArgName("k")->Arg(768)->Arg(2048);

// The fixed costs a decode step pays per parallel step (what kernels/cpu/ops.h's Team comment cites).
// Args: threads. BM_TeamPass: one empty run_team() pass (fork and join); BM_TeamBarrier: one team_barrier()
// inside a pass, the pass's own cost spread over kBarriersPerPass barriers.
void BM_TeamPass(benchmark::State& state) {
  ScopedThreads threads(static_cast<int>(state.range(0)));
  for (auto _ : state) run_team([](Team team) { benchmark::DoNotOptimize(team.thread); });
}
BENCHMARK(BM_TeamPass)->ArgName("threads")->Arg(2)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_TeamBarrier(benchmark::State& state) {
  constexpr int kBarriersPerPass = 1000;
  ScopedThreads threads(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    run_team([](Team) {
      for (int i = 0; i < kBarriersPerPass; ++i) team_barrier();
    });
  }
  state.SetItemsProcessed(state.iterations() * kBarriersPerPass);  // items_per_second: barriers a second
}
BENCHMARK(BM_TeamBarrier)->ArgName("threads")->Arg(2)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace shardline::kernels::cpu

BENCHMARK_MAIN();
