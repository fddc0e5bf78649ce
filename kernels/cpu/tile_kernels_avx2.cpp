// The portable tile kernels compiled with -mavx2 -mfma (see kernels/CMakeLists.txt): 256-bit vectors and
// fused multiply-adds for CPUs without AVX-512, and for bf16 / int8 on AVX-512 CPUs without BF16 / VNNI.
#include "kernels/cpu/tile_kernels.h"

namespace shardline::kernels::cpu::tile {

namespace {
#define SHARDLINE_TILE_HAS_FMA 1
#include "kernels/cpu/tile_kernels_generic.inl"
#undef SHARDLINE_TILE_HAS_FMA
}  // namespace

TileKernels avx2_tile_kernels() { return {f32_tile, bf16_tile, int8_tile}; }

}  // namespace shardline::kernels::cpu::tile
