#include "kernels/cpu/isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

#include <fmt/format.h>

namespace shardline::kernels::cpu {

namespace {

// AMX needs the CPU's tiles and, on Linux, the process's permission for their 8 KiB of register state:
// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). The kernel refuses it when it cannot save that state
// (too old, or a thread's signal stack is too small for it); then the kernels stay on AVX-512.
bool amx_usable() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24, kAmxInt8 = 1u << 25;
  if ((edx & (kAmxBf16 | kAmxTile | kAmxInt8)) != (kAmxBf16 | kAmxTile | kAmxInt8)) return false;
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

Isa detect_isa() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512 && __builtin_cpu_supports("avx512vnni")) {
#if SHARDLINE_HAVE_AMX_KERNELS
    // Each level includes the ones below: AMX is taken only with AVX512_BF16 (every AMX CPU so far has it).
    if (__builtin_cpu_supports("avx512bf16") && amx_usable()) return Isa::kAmx;
#endif
    return __builtin_cpu_supports("avx512bf16") ? Isa::kAvx512Bf16 : Isa::kAvx512Vnni;
  }
  if (avx512) return Isa::kAvx512;
  // The AVX2 int8 kernel reads its fp16 scales with F16C (every AVX2 CPU has it; GCC 12 cannot ask for it).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) return Isa::kAvx2;
  return Isa::kPortable;
}

std::atomic<int>& active_level() {
  static std::atomic<int> level{static_cast<int>(default_isa())};
  return level;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kPortable: return "portable";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Vnni: return "avx512-vnni";
    case Isa::kAvx512Bf16: return "avx512-bf16";
    case Isa::kAmx: return "amx";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view name) {
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Vnni, Isa::kAvx512Bf16, Isa::kAmx}) {
    if (name == isa_name(isa)) return isa;
  }
  return std::nullopt;
}

Isa best_isa() {
  static const Isa best = detect_isa();
  return best;
}

double bf16_dot_rate() {
  static const double rate = best_isa() >= Isa::kAvx512Bf16 ? measure_bf16_dot_rate() : 0.0;
  return rate;
}

Isa default_isa() {
  static const Isa chosen =
      best_isa() == Isa::kAvx512Bf16 && bf16_dot_rate() < kMinBf16DotRate ? Isa::kAvx512Vnni : best_isa();
  return chosen;
}

Isa active_isa() { return static_cast<Isa>(active_level().load(std::memory_order_relaxed)); }

std::string describe_active_isa() {
  const Isa active = active_isa();
  if (active != default_isa() || default_isa() == best_isa()) return fmt::format("{} kernels", isa_name(active));
  return fmt::format("{} kernels (not {}: vdpbf16ps runs at {:.2f}x the FMA rate here, so bf16 weights widen)",
                     isa_name(active), isa_name(best_isa()), bf16_dot_rate());
}

Isa set_isa(Isa isa) {
  const Isa chosen = static_cast<int>(isa) > static_cast<int>(best_isa()) ? best_isa() : isa;
  return static_cast<Isa>(active_level().exchange(static_cast<int>(chosen)));
}

}  // namespace shardline::kernels::cpu
