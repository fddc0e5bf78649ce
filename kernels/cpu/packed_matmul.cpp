#include "kernels/cpu/packed_matmul.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/row_kernels.h"
#include "kernels/cpu/tile_kernels.h"

namespace shardline::kernels::cpu {

namespace {

// Below this many multiply-adds a matmul stays on one thread: waking the others costs more.
constexpr long kMinParallelWork = 32768;

// body(team) for `work` multiply-adds: in one pass of the kernel threads (run_team) where it is worth waking
// them, else on this thread alone.
template <typename Body>
void run_team_for(long work, Body&& body) {
  if (num_threads() > 1 && work > kMinParallelWork) {
    run_team(body);
  } else {
    body(Team{});
  }
}

tile::TileKernels tile_kernels_for(Isa isa) {
  tile::TileKernels kernels = isa >= Isa::kAvx2 ? tile::avx2_tile_kernels() : tile::portable_tile_kernels();
  if (isa >= Isa::kAvx512) {
    kernels.f32 = tile::avx512_f32_tile_kernel();
    kernels.bf16 = tile::avx512_bf16_tile_kernel();
  }
  if (isa >= Isa::kAvx512Vnni) kernels.int8 = kernels.int8_segments = tile::avx512_vnni_int8_tile_kernel();
  if (isa >= Isa::kAvx512Bf16) kernels.bf16 = tile::avx512_bf16_dot_tile_kernel();
#if SHARDLINE_HAVE_AMX_KERNELS
  if (isa >= Isa::kAmx) {
    kernels.bf16 = tile::amx_bf16_tile_kernel();
    kernels.int8 = tile::amx_int8_tile_kernel();
    kernels.int8_segments = nullptr;
  }
#endif
  return kernels;
}

const tile::TileKernels& active_tile_kernels() {
  // Only the levels this CPU has (set_isa never goes above best_isa()): each ISA file's factory is compiled
  // with that ISA's flags, and the compiler fills the table it returns with its instructions (the AVX2
  // table's vmovq raised SIGILL on the x86-64 baseline, session 30).
  static const auto by_isa = [] {
    std::array<tile::TileKernels, static_cast<int>(Isa::kAmx) + 1> kernels{};
    for (int level = 0; level <= static_cast<int>(best_isa()); ++level) {
      kernels[level] = tile_kernels_for(static_cast<Isa>(level));
    }
    return kernels;
  }();
  return by_isa[static_cast<int>(active_isa())];
}

tile::TileKernel tile_kernel(WeightDtype dtype) {
  const tile::TileKernels& kernels = active_tile_kernels();
  switch (dtype) {
    case WeightDtype::kF32: return kernels.f32;
    case WeightDtype::kBf16: return kernels.bf16;
    case WeightDtype::kInt8: return kernels.int8;
  }
  return nullptr;
}

// The tile for panels [panel, panel + n_panels) of w and rows [row, row + n_rows) of x.
tile::Tile make_tile(const Activations& x, const PackedMatrix& w, int panel, int n_panels, int row, int n_rows,
                     float* out) {
  tile::Tile t;
  t.panel_stride = panel_bytes(w.dtype, w.k, w.int8_group);
  t.panels = w.data + panel * t.panel_stride;
  t.n_panels = n_panels;
  // fp32 activations have exactly k columns; int8 ones are padded to 32 (kInt8Block) like the weights.
  t.k = w.dtype == WeightDtype::kInt8 ? padded_k(w.dtype, w.k) : w.k;
  t.x_stride = x.row_stride();
  const std::size_t row_offset = static_cast<std::size_t>(row) * x.row_stride();
  switch (w.dtype) {
    case WeightDtype::kF32: t.x = x.f32() + row_offset; break;
    case WeightDtype::kBf16: {
      t.x = x.f32() + row_offset;
      if (x.bf16_hi() != nullptr) {
        const std::size_t bf16_offset = static_cast<std::size_t>(row) * x.bf16_stride();
        t.x_bf16_hi = x.bf16_hi() + bf16_offset;
        t.x_bf16_lo = x.bf16_lo() + bf16_offset;
        t.x_bf16_stride = x.bf16_stride();
      }
      break;
    }
    case WeightDtype::kInt8: {
      const std::size_t group_offset = static_cast<std::size_t>(row) * x.int8_groups();
      t.int8_group = x.int8_group();
      t.x = x.int8() + row_offset;
      t.x_scales = x.int8_scales() + group_offset;
      t.x_sums = x.int8_sums() + group_offset;
      t.x_groups = x.int8_groups();
      t.int8_scales_offset = static_cast<std::size_t>(t.k) * kPanelWidth;  // after the panel's k quads of 16
      break;
    }
  }
  t.n_rows = n_rows;
  t.out = out;
  return t;
}

void check_operands(const Activations& x, const PackedMatrix& w) {
  SL_CHECK_MSG(w.dtype == x.dtype(), "activations prepared for {} used with {} weights", weight_dtype_name(x.dtype()),
               weight_dtype_name(w.dtype));
  SL_CHECK_MSG(w.k == x.k(), "matrix k {} != activations k {}", w.k, x.k());
  SL_CHECK_MSG(w.dtype != WeightDtype::kInt8 || w.int8_group_size() == x.int8_group(),
               "int8 activations in groups of {} used with weights in groups of {}", x.int8_group(), w.int8_group_size());
  SL_CHECK(w.data != nullptr && x.n() >= 1);
}

// Copies a tile's valid features (the last panel of a matrix may be padding) into y (n, d): the tile's
// panels are consecutive features, so each row is one contiguous copy.
void store_tile(const float* tile, float* y, int d, int row, int n_rows, int panel, int n_panels) {
  const int f0 = panel * kPanelWidth;
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(std::min(n_panels * kPanelWidth, d - f0));
  for (int r = 0; r < n_rows; ++r) {
    std::memcpy(y + static_cast<std::size_t>(row + r) * d + f0, tile + r * tile::kTileStride, bytes);
  }
}

// A claim covers at least this many weight bytes per row (a run of several tiles where the tiles are
// small): each claim is a locked compare-and-swap, which waits for the core's loads in flight, and a
// matmul of few rows streams its weights with many in flight. The bandwidth probe read 10% slower with
// claims of 16 KiB than with one band a thread, and as fast with claims of 256 KiB (session 26).
constexpr std::size_t kRunBytes = 256 << 10;

// The tiles of w a team's thread computes, for n_rows rows: its band of the panels and what it takes from
// slower threads' bands (StealingBands in ops.h), in runs of whole tiles. Whoever computes a tile computes
// it the same way, so stealing changes no result.
class TileRuns {
 public:
  TileRuns(const PackedMatrix& w, int n_rows, Team team)
      : w_(w),
        panel_bytes_(panel_bytes(w.dtype, w.k, w.int8_group)),
        runs_(panel_count(w.d), run_panels(n_rows), team) {}
  // The next tile: its first panel and panel count; false when none is left.
  bool next(int& panel, int& n_panels) {
    if (next_ >= run_.end) {
      run_ = runs_.next();
      if (run_.begin < 0) return false;
      next_ = run_.begin;
    }
    panel = next_;
    n_panels = std::min(tile::kTilePanels, run_.end - next_);
    next_ += n_panels;
    return true;
  }
  // The panels of the tile likely to follow, for the kernel to prefetch while it computes the last k
  // chunk of this one (PrefetchPlan in tile_kernels.h): the run's next tile, or the start of the run
  // StealingBands::likely_next() names; null where there is none or it is shorter than this one.
  const std::byte* likely_next_panels(int n_panels) const {
    const int next = next_ < run_.end ? next_ : runs_.likely_next();
    return next >= 0 && next + n_panels <= panel_count(w_.d) ? w_.data + next * panel_bytes_ : nullptr;
  }

 private:
  int run_panels(int n_rows) const {
    const std::size_t tile_bytes = tile::kTilePanels * panel_bytes_ * static_cast<std::size_t>(std::max(n_rows, 1));
    return tile::kTilePanels * static_cast<int>(std::max<std::size_t>(1, kRunBytes / tile_bytes));
  }

  const PackedMatrix& w_;
  std::size_t panel_bytes_;
  StealingBands runs_;
  Band run_{0, 0};
  int next_ = 0;
};

// No maximum yet (fold_max's start).
constexpr row::RowMax kNoMax{std::numeric_limits<float>::quiet_NaN(), -1};

// The tiles of w a team's thread takes, for every row of x: take(tile_out, row, n_rows, panel, n_panels)
// gets each tile's results.
template <typename Take>
void for_each_tile(const Activations& x, const PackedMatrix& w, Team team, tile::TileKernel kernel, Take&& take) {
  alignas(64) float tile_out[tile::kTileRows * tile::kTileStride];
  TileRuns tiles(w, x.n(), team);
  for (int p, n_panels; tiles.next(p, n_panels);) {
    for (int r = 0; r < x.n(); r += tile::kTileRows) {
      const int n_rows = std::min(tile::kTileRows, x.n() - r);
      tile::Tile t = make_tile(x, w, p, n_panels, r, n_rows, tile_out);
      if (r + n_rows == x.n()) t.prefetch = tiles.likely_next_panels(n_panels);
      kernel(t);
      take(static_cast<const float*>(tile_out), r, n_rows, p, n_panels);
    }
  }
}

// The tiles of w a team's thread takes, for every row of x, into y.
void matmul_tiles(float* y, const Activations& x, const PackedMatrix& w, Team team, tile::TileKernel kernel) {
  for_each_tile(x, w, team, kernel, [&](const float* tile_out, int r, int n_rows, int p, int n_panels) {
    store_tile(tile_out, y, w.d, r, n_rows, p, n_panels);
  });
}

// The tile t (make_tile's, of the whole k of w) narrowed to w's k range [k0, k1): the panels, x and, for
// int8, the scales from k0 on (matmul_segments).
tile::Tile k_range_view(tile::Tile t, const PackedMatrix& w, int k0, int k1) {
  const bool last = k1 == w.k;
  switch (w.dtype) {
    case WeightDtype::kF32:
      t.panels += static_cast<std::size_t>(k0) * kPanelWidth * sizeof(float);
      t.x = static_cast<const float*>(t.x) + k0;
      t.k = k1 - k0;
      break;
    case WeightDtype::kBf16:
      t.panels += static_cast<std::size_t>(k0) * kPanelWidth * sizeof(std::uint16_t);
      t.x = static_cast<const float*>(t.x) + k0;
      if (t.x_bf16_hi != nullptr) {
        t.x_bf16_hi += k0;
        t.x_bf16_lo += k0;
      }
      t.k = k1 - k0;
      break;
    case WeightDtype::kInt8: {
      const int group = t.int8_group;
      t.panels += static_cast<std::size_t>(k0) * kPanelWidth;
      t.x = static_cast<const std::int8_t*>(t.x) + k0;
      t.x_scales += k0 / group;
      t.x_sums += k0 / group;
      // The scales stay where they are, after the whole k's quads: their offset from the view's first quad.
      t.int8_scales_offset = t.int8_scales_offset - static_cast<std::size_t>(k0) * kPanelWidth +
                             static_cast<std::size_t>(k0 / group) * kPanelWidth * sizeof(std::uint16_t);
      t.k = (last ? padded_k(w.dtype, w.k) : k1) - k0;  // the last range takes the zero padding
      break;
    }
  }
  return t;
}

// This OpenMP thread's band of n_items (ops.h thread_band).
Band my_band(int n_items) { return thread_band(n_items, omp_get_thread_num(), omp_get_num_threads()); }

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Activations

void Activations::reserve(int max_rows, int max_k) {
  SL_CHECK(max_rows >= 1 && max_k >= 1);
  max_rows_ = std::max(max_rows_, max_rows);
  max_k_ = std::max(max_k_, max_k);
  const std::size_t kp = padded_k(WeightDtype::kInt8, max_k_);  // the largest padding of any dtype
  const std::size_t rows = max_rows_;
  int8_.resize(rows * kp);
  scales_.resize(rows * kp / kInt8Block);  // the most groups any k up to max_k has (groups of 32)
  sums_.resize(rows * kp / kInt8Block);
  if (best_isa() >= Isa::kAvx512Bf16) {
    const std::size_t bf16_kp = padded_k(WeightDtype::kBf16, max_k_);
    bf16_hi_.resize(rows * bf16_kp);
    bf16_lo_.resize(rows * bf16_kp);
  }
}

void Activations::set_shape(const float* x, int n, int k, WeightDtype dtype, int int8_group) {
  SL_CHECK_MSG(n >= 1 && n <= max_rows_ && k >= 1 && k <= max_k_, "activations ({}, {}) exceed the reserved ({}, {})",
               n, k, max_rows_, max_k_);
  dtype_ = dtype;
  n_ = n;
  k_ = k;
  padded_k_ = padded_k(dtype, k);
  f32_ = nullptr;
  int8_group_ = 0;
  switch (dtype) {
    case WeightDtype::kF32:
    case WeightDtype::kBf16:
      // fp32 activations, used in place. The widening kernels (portable, AVX2, AVX-512) turn bf16 weights into
      // fp32, so the odd k of a pair past the end (padding) meets zero weights and is never read from x; the
      // bf16-dot kernels read the split rows prepare_rows() adds, zero past k.
      f32_ = x;
      padded_k_ = k;
      return;
    case WeightDtype::kInt8:
      // Per row and group (the weights' groups, int8_group(k)): scale = max|x| / 127, q = round(x / scale);
      // the sum of q lets the int8 kernels undo the +128 offset of the unsigned weights.
      int8_group_ = int8_group > 0 ? int8_group : default_int8_group(k);
      cpu::int8_groups(k, int8_group_);  // checks the group divides the padded k
      return;
  }
}

void Activations::prepare_rows(const float* x, int r0, int r1) {
  const int k = k_;
  if (dtype_ == WeightDtype::kBf16 && !bf16_hi_.empty()) {
    // x as bf16 halves for the bf16-dot kernels (avx512-bf16, AMX), in rows of bf16_stride() with zeros past k.
    const row::SplitBf16Row split = row::active_row_kernels().split_bf16;
    const int bf16_kp = padded_k(WeightDtype::kBf16, k);
    for (int r = r0; r < r1; ++r) {
      const std::size_t offset = static_cast<std::size_t>(r) * bf16_kp;
      split(x + static_cast<std::size_t>(r) * k, k, bf16_kp, bf16_hi_.data() + offset, bf16_lo_.data() + offset);
    }
  } else if (dtype_ == WeightDtype::kInt8) {
    const int kp = padded_k_, groups = int8_groups();
    const row::QuantizeInt8Row quantize = row::active_row_kernels().quantize_int8;
    for (int r = r0; r < r1; ++r) {
      const std::size_t at = static_cast<std::size_t>(r) * groups;
      quantize(x + static_cast<std::size_t>(r) * k, k, kp, int8_group_, int8_.data() + static_cast<std::size_t>(r) * kp,
               scales_.data() + at, sums_.data() + at);
    }
  }
}

void Activations::prepare(const float* x, int n, int k, WeightDtype dtype, int int8_group) {
  set_shape(x, n, k, dtype, int8_group);
  if (dtype == WeightDtype::kF32 || (dtype == WeightDtype::kBf16 && bf16_hi_.empty())) return;  // x as it is
  // Rows go to the threads from two on (the others would only wait for this one at the next matmul).
  if (!open_parallel_region(n > 1)) {
    prepare_rows(x, 0, n);
    return;
  }
#pragma omp parallel num_threads(num_threads())
  {
    const auto [begin, end] = my_band(n);
    prepare_rows(x, begin, end);
  }
}

void Activations::normalise_and_prepare(float* out, const float* x, float* x_add, const float* residual,
                                        const float* weight, float eps, int n, const PackedMatrix& w) {
  set_shape(out, n, w.k, w.dtype, w.int8_group_size());
  if (!open_parallel_region(n > 1)) {
    normalise_rows(out, x, x_add, residual, weight, eps, 0, n);
    return;
  }
#pragma omp parallel num_threads(num_threads())
  {
    const auto [begin, end] = my_band(n);
    normalise_rows(out, x, x_add, residual, weight, eps, begin, end);
  }
}

void Activations::normalise_rows(float* out, const float* x, float* x_add, const float* residual, const float* weight,
                                 float eps, int r0, int r1) {
  if (r0 >= r1) return;
  const int dim = k_;
  const std::size_t at = static_cast<std::size_t>(r0) * dim, values = static_cast<std::size_t>(r1 - r0) * dim;
  if (residual != nullptr) row::active_row_kernels().add(x_add + at, residual + at, static_cast<int>(values));
  rmsnorm_serial(out + at, x + at, weight, r1 - r0, dim, eps);
  prepare_rows(out, r0, r1);
}

// ---------------------------------------------------------------------------------------------------------
// matmul

void matmul(float* y, const Activations& x, const PackedMatrix& w) {
  const MatmulOutput output{y, &w};
  matmul(x, std::span<const MatmulOutput>(&output, 1));
}

void matmul(const Activations& x, std::span<const MatmulOutput> outputs) {
  long work = 0;
  for (const MatmulOutput& o : outputs) {
    check_operands(x, *o.w);  // here, where an exception can leave (not from inside the parallel pass)
    work += static_cast<long>(x.n()) * o.w->d * o.w->k;
  }
  run_team_for(work, [&](Team team) { matmul(x, outputs, team); });
}

void matmul(float* y, const Activations& x, const PackedMatrix& w, Team team) {
  const MatmulOutput output{y, &w};
  matmul(x, std::span<const MatmulOutput>(&output, 1), team);
}

void matmul(const Activations& x, std::span<const MatmulOutput> outputs, Team team) {
  int total_panels = 0;
  bool adjacent = true;  // each matrix's panels right after the previous one's
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const PackedMatrix& w = *outputs[i].w;
    check_operands(x, w);
    total_panels += panel_count(w.d);
    if (i > 0) {
      const PackedMatrix& before = *outputs[i - 1].w;
      adjacent = adjacent && w.data == before.data + before.size_bytes() && w.int8_group_size() == before.int8_group_size();
    }
  }
  const tile::TileKernel kernel = tile_kernel(x.dtype());
  if (adjacent && outputs.size() > 1) {
    // Adjacent matrices (ShardWeights packs q, k and v so) are one matrix of all their panels to the tiles,
    // which span and prefetch across the borders; each tile's results go to the outputs its panels belong
    // to. Matrices apart end each in a part tile and start unprefetched: the 15M shape's q, k and v (288
    // features each) for 16 rows took 15 us on two threads apart and 10 us as one matrix.
    PackedMatrix all = *outputs[0].w;
    all.d = total_panels * kPanelWidth;
    for_each_tile(x, all, team, kernel, [&](const float* tile_out, int r, int n_rows, int p, int n_panels) {
      int first = 0;  // the first panel of the current output in the concatenation
      for (const MatmulOutput& o : outputs) {
        const int panels = panel_count(o.w->d);
        const int lo = std::max(p, first), hi = std::min(p + n_panels, first + panels);
        if (lo < hi) store_tile(tile_out + (lo - p) * kPanelWidth, o.y, o.w->d, r, n_rows, lo - first, hi - lo);
        first += panels;
      }
    });
    return;
  }
  for (const MatmulOutput& o : outputs) matmul_tiles(o.y, x, *o.w, team, kernel);
}

namespace {

void check_segments(const Activations& x, const PackedMatrix& w, std::span<const int> k_bounds) {
  check_operands(x, w);
  SL_CHECK_MSG(k_bounds.size() >= 2 && k_bounds.front() == 0 && k_bounds.back() == w.k, "k segments must run from 0 "
               "to k = {}", w.k);
  // A range starts where the kernels can start one: on an int8 group, on a whole AMX block of 32 for bf16
  // (the bf16-dot kernels read x and W in blocks of 32 k), anywhere for fp32.
  const int unit = w.dtype == WeightDtype::kInt8 ? w.int8_group_size() : w.dtype == WeightDtype::kBf16 ? kBf16Block : 1;
  for (std::size_t s = 1; s < k_bounds.size(); ++s) {
    SL_CHECK_MSG(k_bounds[s] > k_bounds[s - 1], "k segment {} is empty ({} to {})", s - 1, k_bounds[s - 1], k_bounds[s]);
    SL_CHECK_MSG(k_bounds[s - 1] % unit == 0, "k segment {} starts at {}, not on a multiple of {}", s - 1,
                 k_bounds[s - 1], unit);
  }
}

}  // namespace

void matmul_segments(float* y, const Activations& x, const PackedMatrix& w, std::span<const int> k_bounds, bool fold,
                     int row0, int rows, Team team) {
  check_segments(x, w, k_bounds);
  SL_CHECK(row0 >= 0 && rows >= 1 && row0 + rows <= x.n());
  const tile::TileKernel kernel = tile_kernel(x.dtype());
  const int n_segments = static_cast<int>(k_bounds.size()) - 1;
  const std::size_t partial_floats = static_cast<std::size_t>(rows) * w.d;
  const row::AddRow add_row = row::active_row_kernels().add;
  // A kernel that takes the segments computes them in one call per tile (tile::Tile::k_segments), its
  // segment sums in tile_out, and folds them into tile_sum or leaves them apart (in `apart`, grown once per
  // thread). The others take a call per segment: the first segment's products land in tile_sum and every
  // later one's in tile_out, added onto tile_sum (one contiguous add of the tile, in L1), which is stored
  // once after the last. (Folding each segment into y row by row, a call per row, was slower still.)
  const tile::TileKernel in_one_call = x.dtype() == WeightDtype::kInt8 ? active_tile_kernels().int8_segments : nullptr;
  alignas(64) float tile_out[tile::kSegmentTileFloats];
  alignas(64) float tile_sum[tile::kSegmentTileFloats];
  thread_local std::vector<float> apart_storage;
  float* apart = nullptr;  // 64-byte aligned, as the tiles on the stack: the kernel's stores split no line
  if (in_one_call != nullptr && !fold) {
    const std::size_t floats = static_cast<std::size_t>(n_segments) * tile::kSegmentTileFloats + 16;
    if (apart_storage.size() < floats) apart_storage.resize(floats);
    apart = reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(apart_storage.data()) + 63) & ~std::uintptr_t{63});
  }
  TileRuns tiles(w, rows, team);
  for (int p, n_panels; tiles.next(p, n_panels);) {
    for (int r = 0; r < rows; r += tile::kTileRows) {
      const int n_rows = std::min(tile::kTileRows, rows - r);
      const tile::Tile whole = make_tile(x, w, p, n_panels, row0 + r, n_rows, tile_out);
      if (in_one_call != nullptr) {
        tile::Tile t = whole;
        t.out = tile_sum;
        t.k_segments = k_bounds.data();
        t.n_k_segments = n_segments;
        t.segment_scratch = tile_out;
        if (!fold) t.segments_apart = apart;
        if (r + n_rows == rows) t.prefetch = tiles.likely_next_panels(n_panels);
        in_one_call(t);
        if (fold) {
          store_tile(tile_sum, y, w.d, r, n_rows, p, n_panels);
        } else {
          for (int s = 0; s < n_segments; ++s) {
            store_tile(apart + static_cast<std::size_t>(s) * tile::kSegmentTileFloats, y + s * partial_floats, w.d, r,
                       n_rows, p, n_panels);
          }
        }
        continue;
      }
      for (int s = 0; s < n_segments; ++s) {
        tile::Tile t = k_range_view(whole, w, k_bounds[s], k_bounds[s + 1]);
        if (fold && s == 0) t.out = tile_sum;
        // Each range's call prefetches what follows it: the tile's next range, or after the last range of
        // the last rows the next tile.
        if (s + 1 < n_segments) {
          t.prefetch = k_range_view(whole, w, k_bounds[s + 1], k_bounds[s + 2]).panels;
        } else if (r + n_rows == rows) {
          t.prefetch = tiles.likely_next_panels(n_panels);
        }
        kernel(t);
        if (!fold) {
          store_tile(tile_out, y + s * partial_floats, w.d, r, n_rows, p, n_panels);
        } else if (s > 0 && n_panels == tile::kTilePanels) {
          add_row(tile_sum, tile_out, n_rows * tile::kTileStride);  // one add per element, in segment order
        } else if (s > 0) {  // only the panels the kernel wrote (the rest of a row is stale)
          for (int row = 0; row < n_rows; ++row) {
            add_row(tile_sum + row * tile::kTileStride, tile_out + row * tile::kTileStride, n_panels * kPanelWidth);
          }
        }
      }
      if (fold) store_tile(tile_sum, y, w.d, r, n_rows, p, n_panels);
    }
  }
}

void matmul_segments(float* y, const Activations& x, const PackedMatrix& w, std::span<const int> k_bounds, bool fold) {
  check_segments(x, w, k_bounds);  // here, where an exception can leave (not from inside the parallel pass)
  run_team_for(static_cast<long>(x.n()) * w.d * w.k, [&](Team team) { matmul_segments(y, x, w, k_bounds, fold, team); });
}

void matmul_segments(float* y, const Activations& x, const PackedMatrix& w, std::span<const int> k_bounds, bool fold,
                     Team team) {
  matmul_segments(y, x, w, k_bounds, fold, 0, x.n(), team);
}

row::RowMax row::merge_row_max(const RowMax& a, const RowMax& b) {
  RowMax best = a;
  if (a.index < 0 || (b.index >= 0 && !std::isnan(a.value) &&
                      (std::isnan(b.value) || b.value > a.value || (b.value == a.value && b.index < a.index)))) {
    best = b;
  }
  best.nan = a.nan || b.nan;
  return best;
}

void matmul_argmax(const Activations& x, const PackedMatrix& w, float* values, int* indices, bool first_nan_wins,
                   bool* has_nan) {
  check_operands(x, w);
  const tile::TileKernel kernel = tile_kernel(x.dtype());
  const row::FoldMax fold_max = row::active_row_kernels().fold_max;
  const int n = x.n();
  // Each thread's maxima over the tiles it took (a slot per kernel thread, left empty by those the work did
  // not wake); grown once, kept for the next call.
  thread_local std::vector<row::RowMax> thread_max;
  const std::size_t slots = static_cast<std::size_t>(num_threads()) * n;
  if (thread_max.size() < slots) thread_max.resize(slots);
  row::RowMax* all = thread_max.data();
  std::fill_n(all, slots, kNoMax);
  auto fold_tiles = [&](Team team) {
    row::RowMax* mine = all + static_cast<std::size_t>(team.thread) * n;
    const Band own = team.share(panel_count(w.d));
    for_each_tile(x, w, team, kernel, [&](const float* tile_out, int r0, int n_rows, int p, int n_panels) {
      const int f0 = p * kPanelWidth;
      const int valid = std::min(n_panels * kPanelWidth, w.d - f0);  // the last panel may be padding
      // The own band's tiles come first and in order: they fold into the running maxima, where a block of
      // values rarely beats the maximum and fold_max's mask compare skips it. A stolen tile (after them,
      // from the back of another band) folds on its own and merges.
      const bool stolen = p < own.begin || p >= own.end;
      for (int r = 0; r < n_rows; ++r) {
        const float* values_of_row = tile_out + r * tile::kTileStride;
        row::RowMax stolen_max = kNoMax;
        row::RowMax& into = stolen ? stolen_max : mine[r0 + r];
        // argmax()'s one exception to skipping NaNs: a NaN first value is its answer, and stays (no value
        // is greater than a NaN, and the index is taken).
        if (first_nan_wins && f0 == 0 && std::isnan(values_of_row[0])) into = {values_of_row[0], 0, into.nan};
        fold_max(values_of_row, valid, f0, into);
        if (stolen) mine[r0 + r] = row::merge_row_max(mine[r0 + r], stolen_max);
      }
    });
  };
  run_team_for(static_cast<long>(n) * w.d * w.k, fold_tiles);
  for (int r = 0; r < n; ++r) {
    row::RowMax best = all[r];
    for (std::size_t t = 1; t < slots / n; ++t) best = row::merge_row_max(best, all[t * n + r]);
    values[r] = best.value;
    indices[r] = best.index;
    if (has_nan != nullptr) has_nan[r] = best.nan;
  }
}

void matmul_swiglu(float* h, const Activations& x, const PackedMatrix& w1, const PackedMatrix& w3) {
  check_operands(x, w1);  // here, where an exception can leave (not from inside the parallel pass)
  check_operands(x, w3);
  SL_CHECK(w1.d == w3.d);
  const long work = 2L * x.n() * w1.d * w1.k;
  run_team_for(work, [&](Team team) { matmul_swiglu(h, x, w1, w3, team); });
}

void matmul_swiglu(float* h, const Activations& x, const PackedMatrix& w1, const PackedMatrix& w3, Team team) {
  check_operands(x, w1);
  check_operands(x, w3);
  SL_CHECK(w1.d == w3.d);
  const tile::TileKernel kernel = tile_kernel(x.dtype());
  const row::SiluMul silu_mul = row::active_row_kernels().silu_mul;
  const int d = w1.d;
  alignas(64) float gate[tile::kTileRows * tile::kTileStride];
  alignas(64) float up[tile::kTileRows * tile::kTileStride];
  TileRuns tiles(w1, x.n(), team);
  for (int p, n_panels; tiles.next(p, n_panels);) {
    for (int r = 0; r < x.n(); r += tile::kTileRows) {
      const int n_rows = std::min(tile::kTileRows, x.n() - r);
      tile::Tile t1 = make_tile(x, w1, p, n_panels, r, n_rows, gate);
      tile::Tile t3 = make_tile(x, w3, p, n_panels, r, n_rows, up);
      // Each call prefetches the panels of the call after it on this thread where nothing has read them
      // yet: t1 of the first rows the same panels' w3 (t3 runs next), t3 of the last rows the next panels'
      // w1; later row blocks find both in cache.
      if (r == 0) t1.prefetch = t3.panels;
      if (r + n_rows == x.n()) t3.prefetch = tiles.likely_next_panels(n_panels);
      kernel(t1);
      kernel(t3);
      // silu(g) * u by the kernel swiglu() calls, so the fusion does not change a bit.
      for (int row = 0; row < n_rows; ++row) {
        silu_mul(gate + row * tile::kTileStride, up + row * tile::kTileStride, n_panels * kPanelWidth);
      }
      store_tile(gate, h, d, r, n_rows, p, n_panels);
    }
  }
}

}  // namespace shardline::kernels::cpu
