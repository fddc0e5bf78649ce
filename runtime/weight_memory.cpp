#include "runtime/weight_memory.h"

#include <cstdlib>

#include <fmt/format.h>

#include "common/error.h"
#include "common/units.h"
#include "kernels/cpu/weight_format.h"

namespace shardline::runtime {

void FreeWeightMemory::operator()(std::byte* p) const { std::free(p); }

WeightMemory allocate_weight_memory(std::size_t bytes) {
  constexpr std::size_t alignment = kernels::cpu::kPackedAlignment;
  const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(alignment, rounded > 0 ? rounded : alignment));
  if (p == nullptr) {
    throw ResourceError(fmt::format("cannot allocate {} for weights; use a smaller --weights-dtype or more ranks",
                                    format_bytes(static_cast<double>(bytes))));
  }
  return WeightMemory(p);
}

}  // namespace shardline::runtime
