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
  static const RowKernels avx512 = avx512_row_kernels();
  return active_isa() >= Isa::kAvx512 ? avx512 : portable;
}

}  // namespace shardline::kernels::cpu::row
