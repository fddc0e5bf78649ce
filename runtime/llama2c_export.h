// llama2.c's versioned model files, as its export.py writes them (`--version 1` and `--version 2`; runq.c
// reads version 2): a 256-byte header (the magic "ak42" as a uint32, the version, the 7 int32 shape values
// with a positive vocab size, a byte saying whether the classifier is the embedding, and for version 2 the
// int32 group size, unaligned at byte 37; zeros after), then every layer's two RMSNorm weights and the final
// one in fp32, then the matrices in the legacy order without RoPE tables: the embedding, wq, wk, wv, wo,
// w1, w2, w3 of every layer, and the classifier unless shared. Version 1 holds them in fp32; version 2 holds
// each layer's matrix as int8 values followed by their fp32 scales, one per `group` consecutive values of
// the flattened matrix (Q8_0: value = q x scale, as runq.c's dequantize() computes it).
#pragma once

#include <cstdint>
#include <string>

#include "memory/mapped_file.h"
#include "runtime/checkpoint.h"

namespace shardline::runtime {

inline constexpr std::uint32_t kLlama2cExportMagic = 0x616b3432;  // "ak42", as export.py packs it ('I')
inline constexpr std::uint64_t kLlama2cExportHeaderBytes = 256;

// Whether the file starts with the magic of a versioned export (then read_llama2c_export reads it).
bool is_llama2c_export(const memory::MappedFile& file);

// The model of a versioned export: its shape, where its tensors are (version 2's matrices as
// TensorElement::kLlama2cQ8), and llama2.c's fixed constants. FormatError for another version, a header
// whose shape or flags make no sense, a group size that does not divide every matrix (export.py asserts
// it), or a file size other than the header implies.
ModelFile read_llama2c_export(const std::string& path, const memory::MappedFile& file);

}  // namespace shardline::runtime
