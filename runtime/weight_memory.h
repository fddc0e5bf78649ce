// Rank-local heap memory for converted weights (packed for the kernels, maybe to bf16 or int8) when there is
// no arena: ShardWeights takes the rank's hugepage arena (memory/arena.h) whenever it has one, and this
// 64-byte-aligned heap memory otherwise (tests and tools that build weights without an engine).
#pragma once

#include <cstddef>
#include <memory>

namespace shardline::runtime {

struct FreeWeightMemory {
  void operator()(std::byte* p) const;
};
using WeightMemory = std::unique_ptr<std::byte, FreeWeightMemory>;

// `bytes` of uninitialised memory aligned to kernels::cpu::kPackedAlignment; ResourceError naming the size
// when the allocation fails.
WeightMemory allocate_weight_memory(std::size_t bytes);

}  // namespace shardline::runtime
