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
  if (active_isa() < Isa::kAvx512) return portable;
  // Built only once AVX-512 is known to be there: avx512_row_kernels() is compiled with -mavx512f and the
  // compiler fills the table with AVX-512 stores (it raised SIGILL on an AVX2-only EPYC, session 30).
  static const RowKernels avx512 = avx512_row_kernels();
  return avx512;
}

}  // namespace shardline::kernels::cpu::row
