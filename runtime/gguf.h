// GGUF, llama.cpp's model container (versions 2 and 3, little endian): a header, typed key/value metadata,
// tensor descriptions, then the tensors' data, each at an offset aligned to general.alignment (default 32)
// from the start of the data section. This file reads the container and checks that every string, array
// and tensor lies inside the file; gguf_model.h maps a llama model's keys and tensor names onto shardline's.
//
//   "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x      (string key | u32 type | value)        string = u64 length + bytes; array = u32 type, u64 n, n values
//   n_tensors x (string name | u32 n_dims | n_dims x u64 ne (ne[0] the contiguous one) | u32 type | u64 offset)
//   padding to the alignment, then the data section
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "memory/mapped_file.h"

namespace shardline::runtime {

inline constexpr char kGgufMagic[4] = {'G', 'G', 'U', 'F'};

// Whether the file at path starts with the GGUF magic (false if it cannot be read).
bool is_gguf_file(const std::string& path);

// ggml's tensor type ids this reader names: 0 (F32) to 39 (MXFP4), a few of them retired. A larger id is
// corrupt, or from a llama.cpp newer than this reader.
inline constexpr std::uint32_t kGgufTypeIds = 40;
// ggml's name of a tensor type ("F32", "Q4_K" ...; "type N" for an id of kGgufTypeIds or more).
std::string gguf_type_name(std::uint32_t type);
// ggml's tensor types as (elements per block, bytes per block), for the types whose layout this reader
// knows (ggml-common.h's block structs); {0, 0} for the others, whose tensors are not bounds-checked and are
// refused by name when a model needs them. (The types shardline reads are runtime::TensorElement.)
struct GgufBlockSize {
  std::uint64_t elements, bytes;
};
GgufBlockSize gguf_block_size(std::uint32_t type);

struct GgufTensor {
  std::string name;
  std::vector<std::uint64_t> ne;  // ne[0] varies fastest: a matrix of rows x cols has ne = {cols, rows}
  std::uint32_t type = 0;
  std::uint64_t offset = 0;       // from the start of the file
  std::uint64_t bytes = 0;        // 0 for a type whose size this reader does not know (not bounds-checked)
};

// One metadata value. Numbers keep their kind. An array is checked when the file is read but only
// located (its element type, count and first byte): GgufFile::strings() and numbers() decode it on request,
// so a file's memory cost does not grow with arrays nobody asks for (or with a count forged to be huge).
struct GgufValue {
  enum class Kind { kUnsigned, kSigned, kFloat, kBool, kString, kArray } kind = Kind::kBool;
  std::uint64_t u = 0;
  std::int64_t i = 0;
  double f = 0.0;
  std::string s;
  std::uint32_t array_type = 0;
  std::uint64_t array_count = 0;
  std::uint64_t array_offset = 0;  // from the start of the file
};

class GgufFile {
 public:
  // Reads and checks the header, metadata and tensor table. ResourceError if the file cannot be opened,
  // FormatError naming the path and the byte offset for anything malformed or out of bounds.
  explicit GgufFile(const std::string& path);

  const std::string& path() const { return path_; }
  std::uint64_t size_bytes() const { return size_bytes_; }

  const GgufValue* find(const std::string& key) const;
  // Typed lookups: nullopt when the key is absent; FormatError when it holds another kind of value.
  std::optional<std::uint64_t> get_count(const std::string& key) const;  // a non-negative integer
  std::optional<double> get_number(const std::string& key) const;        // any number
  std::optional<std::string> get_string(const std::string& key) const;
  // An array of strings, or of numbers of any type, decoded; FormatError when the key is absent or holds
  // something else.
  std::vector<std::string> strings(const std::string& key) const;
  std::vector<double> numbers(const std::string& key) const;
  const GgufTensor* tensor(const std::string& name) const;
  const std::map<std::string, GgufTensor>& tensors() const { return tensors_; }

 private:
  const GgufValue& array(const std::string& key) const;

  std::string path_;
  memory::MappedFile file_;
  memory::MappedRegion whole_;  // the metadata's arrays are decoded from here on request
  std::uint64_t size_bytes_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::map<std::string, GgufTensor> tensors_;
};

}  // namespace shardline::runtime
