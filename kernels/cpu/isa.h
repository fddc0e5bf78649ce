// Which instruction set the CPU kernels use: the packed matmul's tile kernels (tile_kernels.h) and, from
// kAvx512 up, the AVX-512 build of the row kernels (row_kernels.h). Detected once at start-up (the best this
// CPU has); tests and benchmarks may step down to compare every path on one machine.
#pragma once

#include <optional>
#include <string_view>

namespace shardline::kernels::cpu {

// Ordered: each level includes the ones before it.
enum class Isa : int {
  kPortable = 0,    // plain C++ (whatever the compiler's baseline target vectorises)
  kAvx2 = 1,        // AVX2 + FMA: the portable code compiled for 256-bit vectors
  kAvx512 = 2,      // AVX-512 F/BW/VL/DQ: hand-written fp32 and bf16 kernels (int8 as kAvx2)
  kAvx512Vnni = 3,  // + AVX512_VNNI: vpdpbusd for int8
  kAvx512Bf16 = 4,  // + AVX512_BF16: vdpbf16ps for bf16 (x as two bf16 halves, as on AMX)
  kAmx = 5,         // + AMX tiles (AMX-TILE/BF16/INT8, and the kernel's permission to use them): bf16 and int8
};

const char* isa_name(Isa isa);
// The level an isa_name() names, or nothing.
std::optional<Isa> parse_isa(std::string_view name);
// The best level this CPU supports.
Isa best_isa();
// The level the kernels use now (best_isa() unless set_isa stepped down).
Isa active_isa();
// Selects a level at most best_isa() (a higher one is clamped); returns the previous level.
Isa set_isa(Isa isa);

}  // namespace shardline::kernels::cpu
