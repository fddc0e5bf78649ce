// Which instruction set the CPU kernels use: the packed matmul's tile kernels (tile_kernels.h) and, from
// kAvx512 up, the AVX-512 build of the row kernels (row_kernels.h). Detected once at start-up (the best this
// CPU has, or one below where that runs slower); tests and benchmarks may step down to compare every path on
// one machine.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace shardline::kernels::cpu {

// Ordered: each level includes the ones before it.
enum class Isa : int {
  kPortable = 0,    // plain C++ (whatever the compiler's baseline target vectorises)
  kAvx2 = 1,        // AVX2 + FMA + F16C: hand-written 256-bit fp32, bf16 (widened) and int8 (vpmaddubsw) kernels
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
// The level the kernels start on (what --isa auto runs): best_isa(), except kAvx512Vnni where that is
// kAvx512Bf16 but this CPU retires vdpbf16ps at under kMinBf16DotRate of its FMA rate. The bf16-dot kernel
// does one vdpbf16ps per 32 weights where widening does two FMAs and two shifts or masks, so below half the
// rate widening is faster (on an Intel Emerald Rapids VM, at a quarter: 1.8x at batch 16, 2.3x in prefill).
// Only the bf16 tile kernel differs between those two levels.
Isa default_isa();
inline constexpr double kMinBf16DotRate = 0.5;
// vdpbf16ps instructions per vfmadd231ps this CPU retires, measured once (under a millisecond) on first
// use; 0 where the kernels cannot use AVX512_BF16.
double bf16_dot_rate();
// Measures that rate now (bf16_dot_rate.cpp); call only where the CPU has AVX512_BF16.
double measure_bf16_dot_rate();
// The level the kernels use now (default_isa() unless set_isa chose another).
Isa active_isa();
// "<active_isa()'s name> kernels", with why where default_isa() stepped below the best: for logs and headers.
std::string describe_active_isa();
// Selects a level at most best_isa() (a higher one is clamped); returns the previous level.
Isa set_isa(Isa isa);

}  // namespace shardline::kernels::cpu
