// The row kernels for the compiler's baseline target (see row_kernels_generic.inl).
#include "kernels/cpu/row_kernels.h"

#include "kernels/cpu/isa.h"

namespace shardline::kernels::cpu::row {

namespace {
#include "kernels/cpu/row_kernels_generic.inl"
}  // namespace

RowKernels portable_row_kernels() { return row_kernels(); }

const RowKernels& active_row_kernels() {
  static const RowKernels portable = portable_row_kernels();
  if (active_isa() < Isa::kAvx2) return portable;
  // Each level's table is built only once the CPU is known to have it: the factories are compiled with their
  // ISA's flags and the compiler fills the table with its stores (the AVX-512 one raised SIGILL on an
  // AVX2-only EPYC, session 30).
  if (active_isa() < Isa::kAvx512) {
    static const RowKernels avx2 = avx2_row_kernels();
    return avx2;
  }
  static const RowKernels avx512 = avx512_row_kernels();
  return avx512;
}

}  // namespace shardline::kernels::cpu::row
