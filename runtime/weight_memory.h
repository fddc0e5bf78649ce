// Rank-local memory for the weights a rank converts at load (packed for the kernels, maybe to bf16 or
// int8). Every such buffer comes from allocate_weight_memory(), so where the weights live is decided in one
// place: today plain 64-byte-aligned heap memory; the hugepage arena (memory/, issue #4) is meant to take
// over this function.
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
