// The row kernels compiled for AVX-512 F/BW/VL/DQ (see kernels/CMakeLists.txt), called only on CPUs that
// have it: 16 floats per instruction in the dot products, the quantisation and the bf16 split.
#include "kernels/cpu/row_kernels.h"

namespace shardline::kernels::cpu::row {

namespace {
#include "kernels/cpu/row_kernels_generic.inl"
}  // namespace

RowKernels avx512_row_kernels() { return row_kernels(); }

}  // namespace shardline::kernels::cpu::row
