// A model file's tensor values as fp32, whatever their element type: F16 and BF16 widened exactly, ggml's
// block formats decoded as ggml decodes them (runtime/ggml_blocks.h), llama2.c's Q8_0 as runq.c's
// dequantize() computes it. Shared by the CPU stage's loader (shard_weights.h), which converts them to
// --weights-dtype, and the CUDA stage's, which uploads them.
#pragma once

#include <cstdint>

#include "memory/mapped_file.h"
#include "runtime/checkpoint.h"
#include "runtime/load_watch.h"

namespace shardline::runtime {

// Reads a mapped region's pages in, 64 MiB at a time, each slice progress for `watch` (where there is one):
// the file system's part of loading a tensor, which a stuck mount stops (runtime/load_watch.h).
void populate(const memory::MappedRegion& region, LoadWatch* watch);

// n values of the tensor from `tensor` on (TensorRef::at picks a slice) into dst, decoded on the calling
// rank's kernel threads, each value alone (so the split over threads changes no bit). F32 is copied. Each
// 2^14 values decoded are progress for `watch` (where there is one).
void decode_tensor(const memory::MappedFile& file, TensorRef tensor, std::uint64_t n, float* dst,
                   LoadWatch* watch = nullptr);

}  // namespace shardline::runtime
