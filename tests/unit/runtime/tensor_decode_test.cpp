// decode_tensor (runtime/tensor_decode.h) on a hand-written file: llama2.c's Q8_0 at unaligned offsets, with a
// group that does not divide the 2^14-value chunks the threads take, decoded whole and from slices that start
// inside a group, each value against its code times its own group's scale computed here; F32 copied as it is.
#include "runtime/tensor_decode.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "memory/mapped_file.h"
#include "runtime/checkpoint.h"

namespace shardline::runtime {
namespace {

TEST(TensorDecode, Llama2cQ8SlicesTakeTheScaleOfTheirOwnGroups) {
  constexpr std::uint32_t kGroup = 48;       // 2^14 % 48 = 16: chunk boundaries fall inside groups
  constexpr std::uint64_t kValues = 48 * 400;  // 19200: more than one chunk
  std::vector<std::int8_t> codes(kValues);
  std::vector<float> scales(kValues / kGroup);
  for (std::uint64_t i = 0; i < kValues; ++i) codes[i] = static_cast<std::int8_t>(static_cast<int>(i * 37 % 255) - 127);
  for (std::size_t g = 0; g < scales.size(); ++g) scales[g] = 0.001f * static_cast<float>(g + 1);
  const std::string path = ::testing::TempDir() + "tensor_decode_" + std::to_string(::getpid());
  {
    std::ofstream out(path, std::ios::binary);
    out.write("abcdefg", 7);  // the codes start unaligned, and so do the scales after them
    out.write(reinterpret_cast<const char*>(codes.data()), static_cast<std::streamsize>(codes.size()));
    out.write(reinterpret_cast<const char*>(scales.data()), static_cast<std::streamsize>(scales.size() * 4));
  }
  const memory::MappedFile file(path);
  const TensorRef tensor{.offset = 7, .element = TensorElement::kLlama2cQ8, .scales = 7 + kValues, .group = kGroup};
  auto expected = [&](std::uint64_t i) { return static_cast<float>(codes[i]) * scales[i / kGroup]; };
  std::vector<float> all(kValues);
  decode_tensor(file, tensor, kValues, all.data());
  for (std::uint64_t i = 0; i < kValues; ++i) ASSERT_EQ(all[i], expected(i)) << i;
  // Slices from inside a group, across a chunk boundary, and to the tensor's last value.
  for (const std::uint64_t first : {std::uint64_t{1}, std::uint64_t{47}, std::uint64_t{50}, std::uint64_t{16380}}) {
    const std::uint64_t n = kValues - first;
    std::vector<float> slice(n);
    decode_tensor(file, tensor.at(first), n, slice.data());
    for (std::uint64_t i = 0; i < n; ++i) ASSERT_EQ(slice[i], expected(first + i)) << first << " + " << i;
  }
  // And a short one that ends inside its second group.
  std::vector<float> few(30);
  decode_tensor(file, tensor.at(40), few.size(), few.data());
  for (std::uint64_t i = 0; i < few.size(); ++i) EXPECT_EQ(few[i], expected(40 + i)) << i;
  // F32 is copied bit for bit.
  const TensorRef floats{.offset = 7 + kValues};
  std::vector<float> copy(scales.size());
  decode_tensor(file, floats, copy.size(), copy.data());
  EXPECT_EQ(copy, scales);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace shardline::runtime
