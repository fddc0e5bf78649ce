#include "kernels/cpu/isa.h"

#include <atomic>

namespace shardline::kernels::cpu {

namespace {

Isa detect_isa() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512 && __builtin_cpu_supports("avx512vnni")) return Isa::kAvx512Vnni;
  if (avx512) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
  return Isa::kPortable;
}

std::atomic<int>& active_level() {
  static std::atomic<int> level{static_cast<int>(best_isa())};
  return level;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kPortable: return "portable";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Vnni: return "avx512-vnni";
  }
  return "?";
}

Isa best_isa() {
  static const Isa best = detect_isa();
  return best;
}

Isa active_isa() { return static_cast<Isa>(active_level().load(std::memory_order_relaxed)); }

Isa set_isa(Isa isa) {
  const Isa chosen = static_cast<int>(isa) > static_cast<int>(best_isa()) ? best_isa() : isa;
  return static_cast<Isa>(active_level().exchange(static_cast<int>(chosen)));
}

}  // namespace shardline::kernels::cpu
