#include "runtime/tensor_decode.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/row_kernels.h"
#include "kernels/cpu/weight_format.h"
#include "runtime/ggml_blocks.h"

namespace shardline::runtime {

namespace {

constexpr std::uint64_t kF = sizeof(float);

// n values of a tensor's elements as fp32, on the calling thread: F16 and BF16 exactly, ggml's block formats
// as ggml decodes them (runtime/ggml_blocks.h). F16 goes through the KV cache's row kernel (F16C/AVX-512
// where present); src is 2-byte aligned (GGUF aligns tensors to 8 or more).
void widen_chunk(const std::byte* src, TensorElement element, std::uint64_t n, float* dst) {
  if (element == TensorElement::kF32) {
    std::memcpy(dst, src, n * kF);
    return;
  }
  if (element_block(element).elements > 1) {
    widen_blocks(src, element, n, dst);
    return;
  }
  const auto* bits = reinterpret_cast<const std::uint16_t*>(src);
  if (element == TensorElement::kF16) {
    kernels::cpu::row::active_row_kernels().from_half(bits, static_cast<int>(n), dst);
    return;
  }
  for (std::uint64_t i = 0; i < n; ++i) dst[i] = kernels::cpu::bf16_to_float(bits[i]);
}

// llama2.c's Q8_0 (version 2): value i is q[i] times its group's scale, as runq.c's dequantize() computes it.
// `first` is value 0's index in its tensor (groups run over the flattened tensor, across rows), `scales` the
// scale of value 0's group and those after it.
void widen_llama2c_q8(const std::int8_t* q, const std::byte* scales, std::uint64_t first, std::uint32_t group,
                      std::uint64_t n, float* dst) {
  for (std::uint64_t i = 0, g = 0; i < n; ++g) {
    const std::uint64_t end = std::min(n, (first / group + g + 1) * group - first);
    float scale = 0.0f;
    std::memcpy(&scale, scales + g * kF, kF);  // unaligned where a tensor's value count is odd
    for (; i < end; ++i) dst[i] = static_cast<float>(q[i]) * scale;
  }
}

// The same on the rank's kernel threads, in chunks of whole blocks (2^14 values, a whole number of blocks of
// every type; each thread takes a band of chunks, so their count costs nothing). Each value is decoded alone,
// so the split does not change a bit. On one thread a 4-bit file's blocks decode at 1-2.6 ns a value, F16 at
// about 1: a 7B model's seconds (BENCHMARKS.md, "GGUF files: load time by element type").
template <typename DecodeChunk>
void in_chunks(std::uint64_t n, DecodeChunk&& decode) {
  constexpr std::uint64_t kChunkValues = std::uint64_t{1} << 14;
  const std::uint64_t chunks = (n + kChunkValues - 1) / kChunkValues;
  SL_CHECK_MSG(chunks <= static_cast<std::uint64_t>(std::numeric_limits<int>::max()), "{} values to widen", n);
  kernels::cpu::parallel_for(static_cast<int>(chunks), [&](int chunk, int) {
    const std::uint64_t first = static_cast<std::uint64_t>(chunk) * kChunkValues;
    decode(first, std::min(kChunkValues, n - first));
  });
}

}  // namespace

void populate(const memory::MappedRegion& region, LoadWatch* watch) {
  constexpr std::size_t kSliceBytes = std::size_t{64} << 20;
  region.populate_in_slices(kSliceBytes, [watch] { load_progress(watch); });
}

void decode_tensor(const memory::MappedFile& file, TensorRef tensor, std::uint64_t n, float* dst, LoadWatch* watch) {
  if (n == 0) return;
  const memory::MappedRegion source = file.map(tensor.offset, tensor_bytes(tensor.element, n), {.populate = false});
  populate(source, watch);
  if (tensor.element != TensorElement::kLlama2cQ8) {
    in_chunks(n, [&](std::uint64_t first, std::uint64_t count) {
      widen_chunk(source.data() + tensor_bytes(tensor.element, first), tensor.element, count, dst + first);
      load_progress(watch);
    });
    return;
  }
  const std::uint64_t group = tensor.group, first_group = tensor.first / group;
  const memory::MappedRegion scales =
      file.map(tensor.scales + first_group * kF, ((tensor.first + n - 1) / group - first_group + 1) * kF,
               {.populate = true});
  const auto* q = reinterpret_cast<const std::int8_t*>(source.data());
  in_chunks(n, [&](std::uint64_t first, std::uint64_t count) {
    const std::uint64_t value = tensor.first + first;  // in the tensor
    widen_llama2c_q8(q + first, scales.data() + (value / group - first_group) * kF, value, tensor.group, count,
                     dst + first);
    load_progress(watch);
  });
}

}  // namespace shardline::runtime
