#include "runtime/gguf.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "common/error.h"
#include "common/printable.h"
#include "memory/mapped_file.h"

namespace shardline::runtime {

namespace {

// Metadata value types of the format.
enum ValueType : std::uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// More would be a corrupt count, not a model: the largest llama.cpp models have a few thousand tensors.
constexpr std::uint64_t kMaxTensors = 1 << 20;
constexpr std::uint64_t kMaxKeys = 1 << 20;
constexpr std::uint32_t kMaxDims = 4;

// A bounds-checked cursor over the mapped file: every read that would leave it is a FormatError naming
// the offset and what was being read.
class Cursor {
 public:
  Cursor(const std::byte* data, std::uint64_t size, const std::string& path) : data_(data), size_(size), path_(path) {}

  std::uint64_t pos() const { return pos_; }
  std::uint64_t remaining() const { return size_ - pos_; }
  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError(fmt::format("GGUF file '{}' is corrupt at byte {}: {} (copy or convert the file again)", path_,
                                  pos_, what));
  }
  void need(std::uint64_t bytes, const char* what) const {
    if (bytes > size_ - pos_) fail(fmt::format("{} runs past the end of the file ({} bytes)", what, size_));
  }
  template <typename T>
  T pod(const char* what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string string(const char* what) {
    const auto length = pod<std::uint64_t>(what);
    need(length, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), length);
    pos_ += length;
    return s;
  }
  void skip(std::uint64_t bytes, const char* what) {
    need(bytes, what);
    pos_ += bytes;
  }

 private:
  const std::byte* data_;
  std::uint64_t size_;
  const std::string& path_;
  std::uint64_t pos_ = 0;
};


std::uint64_t scalar_bytes(std::uint32_t type) {
  switch (type) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: return 8;
    default: return 0;
  }
}

// One number of a scalar type as a double (arrays of numbers keep them so).
double scalar_as_double(Cursor& in, std::uint32_t type) {
  switch (type) {
    case kU8: return in.pod<std::uint8_t>("a u8");
    case kI8: return in.pod<std::int8_t>("an i8");
    case kU16: return in.pod<std::uint16_t>("a u16");
    case kI16: return in.pod<std::int16_t>("an i16");
    case kU32: return in.pod<std::uint32_t>("a u32");
    case kI32: return in.pod<std::int32_t>("an i32");
    case kF32: return in.pod<float>("an f32");
    case kBool: return in.pod<std::uint8_t>("a bool");
    case kU64: return static_cast<double>(in.pod<std::uint64_t>("a u64"));
    case kI64: return static_cast<double>(in.pod<std::int64_t>("an i64"));
    case kF64: return in.pod<double>("an f64");
    default: in.fail(fmt::format("unknown metadata value type {}", type));
  }
}

// Checks an array's elements and steps over them (nested arrays too, up to depth 2).
void skip_array(Cursor& in, std::uint32_t element_type, std::uint64_t n, int depth) {
  if (element_type == kString) {
    for (std::uint64_t k = 0; k < n; ++k) in.skip(in.pod<std::uint64_t>("an array's string"), "an array's string");
  } else if (element_type == kArray) {
    if (depth >= 2) in.fail("arrays nested deeper than 2");
    for (std::uint64_t k = 0; k < n; ++k) {
      const auto inner_type = in.pod<std::uint32_t>("an array's type");
      skip_array(in, inner_type, in.pod<std::uint64_t>("an array's length"), depth + 1);
    }
  } else {
    const std::uint64_t size = scalar_bytes(element_type);
    if (size == 0) in.fail(fmt::format("unknown array element type {}", element_type));
    if (n > in.remaining() / size) in.fail(fmt::format("an array of {} elements runs past the end of the file", n));
    in.skip(n * size, "an array");
  }
}

GgufValue read_value(Cursor& in, std::uint32_t type) {
  GgufValue v;
  switch (type) {
    case kU8: case kU16: case kU32: case kU64:
      v.kind = GgufValue::Kind::kUnsigned;
      v.u = type == kU64 ? in.pod<std::uint64_t>("a u64") : static_cast<std::uint64_t>(scalar_as_double(in, type));
      v.f = static_cast<double>(v.u);
      return v;
    case kI8: case kI16: case kI32: case kI64:
      v.kind = GgufValue::Kind::kSigned;
      v.i = type == kI64 ? in.pod<std::int64_t>("an i64") : static_cast<std::int64_t>(scalar_as_double(in, type));
      v.f = static_cast<double>(v.i);
      return v;
    case kF32: case kF64:
      v.kind = GgufValue::Kind::kFloat;
      v.f = scalar_as_double(in, type);
      return v;
    case kBool:
      v.kind = GgufValue::Kind::kBool;
      v.u = in.pod<std::uint8_t>("a bool") != 0;
      return v;
    case kString:
      v.kind = GgufValue::Kind::kString;
      v.s = in.string("a string");
      return v;
    case kArray:
      v.kind = GgufValue::Kind::kArray;
      v.array_type = in.pod<std::uint32_t>("an array's type");
      v.array_count = in.pod<std::uint64_t>("an array's length");
      v.array_offset = in.pos();
      skip_array(in, v.array_type, v.array_count, 0);
      return v;
    default: in.fail(fmt::format("unknown metadata value type {}", type));
  }
}

// One entry of the tensor table: name, dimensions, type and offset (the bytes a known type takes, else 0).
GgufTensor read_tensor_info(Cursor& in, std::uint64_t file_bytes) {
  GgufTensor tensor;
  tensor.name = in.string("a tensor name");
  const auto n_dims = in.pod<std::uint32_t>("a tensor's dimension count");
  if (n_dims < 1 || n_dims > kMaxDims) {
    in.fail(fmt::format("tensor '{}' has {} dimensions (1 to {})", printable(tensor.name), n_dims, kMaxDims));
  }
  std::uint64_t elements = 1;
  for (std::uint32_t d = 0; d < n_dims; ++d) {
    const auto extent = in.pod<std::uint64_t>("a tensor dimension");
    // No type packs more than 8 values into a byte (the smallest take about 1.6 bits): a bound that keeps
    // the products below from overflowing.
    if (extent > 8 * file_bytes || (extent > 0 && elements > 8 * file_bytes / extent)) {
      in.fail(fmt::format("tensor '{}' has a dimension of {}, more than the file could hold", printable(tensor.name),
                          extent));
    }
    elements *= extent;
    tensor.ne.push_back(extent);
  }
  tensor.type = in.pod<std::uint32_t>("a tensor type");
  tensor.offset = in.pod<std::uint64_t>("a tensor offset");
  const GgufBlockSize block = gguf_block_size(tensor.type);
  if (block.elements > 0) {
    if (tensor.ne[0] % block.elements != 0) {
      in.fail(fmt::format("tensor '{}' of type {} has rows of {} values, no multiple of its blocks of {}",
                          printable(tensor.name), gguf_type_name(tensor.type), tensor.ne[0], block.elements));
    }
    tensor.bytes = elements / block.elements * block.bytes;
  }
  return tensor;
}

}  // namespace

GgufBlockSize gguf_block_size(std::uint32_t type) {
  switch (type) {
    case 0: return {1, 4};      // F32
    case 1: return {1, 2};      // F16
    case 2: return {32, 18};    // Q4_0
    case 3: return {32, 20};    // Q4_1
    case 6: return {32, 22};    // Q5_0
    case 7: return {32, 24};    // Q5_1
    case 8: return {32, 34};    // Q8_0
    case 9: return {32, 36};    // Q8_1
    case 10: return {256, 84};  // Q2_K
    case 11: return {256, 110}; // Q3_K
    case 12: return {256, 144}; // Q4_K
    case 13: return {256, 176}; // Q5_K
    case 14: return {256, 210}; // Q6_K
    case 15: return {256, 292}; // Q8_K
    case 20: return {32, 18};   // IQ4_NL
    case 23: return {256, 136}; // IQ4_XS
    case 24: return {1, 1};     // I8
    case 25: return {1, 2};     // I16
    case 26: return {1, 4};     // I32
    case 27: return {1, 8};     // I64
    case 28: return {1, 8};     // F64
    case 30: return {1, 2};     // BF16
    default: return {0, 0};
  }
}

bool is_gguf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, sizeof magic) && std::memcmp(magic, kGgufMagic, sizeof magic) == 0;
}

std::string gguf_type_name(std::uint32_t type) {
  static const char* const names[] = {"F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
                                      "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS",
                                      "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64",
                                      "IQ1_M", "BF16", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0",
                                      "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4"};
  static_assert(sizeof(names) / sizeof(names[0]) == kGgufTypeIds);
  if (type < kGgufTypeIds) return names[type];
  return fmt::format("type {}", type);
}

GgufFile::GgufFile(const std::string& path) : path_(path), file_(path) {
  size_bytes_ = file_.size_bytes();
  if (size_bytes_ < 24) {
    throw FormatError(fmt::format("GGUF file '{}' is {} bytes, shorter than its 24-byte header", path, size_bytes_));
  }
  // The metadata and tensor table are read through a mapping of the whole file; only the pages they cover
  // are touched (the tensors' data is not read here), and it stays for the arrays decoded later.
  whole_ = file_.map(0, size_bytes_, {.populate = false});
  Cursor in(whole_.data(), size_bytes_, path);
  char magic[4];
  for (char& c : magic) c = static_cast<char>(in.pod<std::uint8_t>("the magic"));
  if (std::memcmp(magic, kGgufMagic, sizeof magic) != 0) in.fail("no GGUF magic");
  const auto version = in.pod<std::uint32_t>("the version");
  if (version != 2 && version != 3) {
    const std::uint32_t swapped = __builtin_bswap32(version);
    throw FormatError(fmt::format("GGUF file '{}' has version {}; shardline reads little-endian versions 2 and 3{}", path,
                                  version, swapped == 2 || swapped == 3 ? " (this one is big-endian)" : ""));
  }
  const auto n_tensors = in.pod<std::uint64_t>("the tensor count");
  const auto n_kv = in.pod<std::uint64_t>("the metadata count");
  if (n_tensors > kMaxTensors || n_kv > kMaxKeys) {
    in.fail(fmt::format("{} tensors and {} metadata keys is no model", n_tensors, n_kv));
  }
  for (std::uint64_t k = 0; k < n_kv; ++k) {
    const std::uint64_t key_at = in.pos();
    std::string key = in.string("a metadata key");
    const auto type = in.pod<std::uint32_t>("a metadata type");
    GgufValue value;
    try {
      value = read_value(in, type);
    } catch (const FormatError& e) {  // which key's value, as most of the file's bytes may be one key's array
      throw FormatError(fmt::format("{} (the value of metadata key '{}', {} of {})", e.what(), printable(key), k + 1, n_kv));
    }
    if (!metadata_.emplace(key, std::move(value)).second) {
      // An earlier count or length that is off reads other bytes as keys: often an empty key, twice.
      throw FormatError(fmt::format("GGUF file '{}' is corrupt at byte {}: metadata key {} of {}, '{}', is already in "
                                    "the file (a count or length before it is probably wrong; copy or convert the "
                                    "file again)",
                                    path, key_at, k + 1, n_kv, printable(key)));
    }
  }
  std::vector<GgufTensor> table;
  for (std::uint64_t t = 0; t < n_tensors; ++t) {
    try {
      table.push_back(read_tensor_info(in, size_bytes_));
    } catch (const FormatError& e) {
      // A header whose key or tensor count is off reads keys as tensors (or tensors as keys): say where the
      // reading was, which tells that apart from one bad tensor.
      throw FormatError(fmt::format("{} (tensor info {} of the {} the header counts, after its {} metadata keys)",
                                    e.what(), t + 1, n_tensors, n_kv));
    }
  }
  // The specification asks for a multiple of 8; it also keeps every F32 tensor's floats aligned.
  std::uint64_t alignment = 32;
  if (auto a = get_count("general.alignment")) alignment = *a;
  if (alignment < 8 || (alignment & (alignment - 1)) != 0 || alignment > 1 << 20) {
    throw FormatError(fmt::format("GGUF file '{}': general.alignment {} is not a power of two from 8 to 1 MiB", path,
                                  alignment));
  }
  const std::uint64_t data_start = (in.pos() + alignment - 1) / alignment * alignment;
  for (GgufTensor& tensor : table) {
    if (tensor.offset % alignment != 0) {
      throw FormatError(fmt::format("GGUF file '{}' is corrupt: tensor '{}' starts at data offset {}, which is not a "
                                    "multiple of the file's alignment of {} bytes",
                                    path, printable(tensor.name), tensor.offset, alignment));
    }
    if (tensor.offset > size_bytes_ || data_start > size_bytes_ - tensor.offset ||
        tensor.bytes > size_bytes_ - data_start - tensor.offset) {
      throw FormatError(fmt::format("GGUF file '{}' is truncated or corrupt: tensor '{}' ({}, {} bytes at data offset "
                                    "{}) does not lie inside the file's {} bytes",
                                    path, printable(tensor.name), gguf_type_name(tensor.type), tensor.bytes,
                                    tensor.offset, size_bytes_));
    }
    tensor.offset += data_start;
  }
  // The tensors that hold values, walked by offset. Writers (llama.cpp's among them) place them back to back,
  // each padded to the alignment, in any order, so each must start where the one before it ended:
  // - no two may share bytes (a forged offset would otherwise read another tensor's data);
  // - nor leave bytes between them: a gap means a tensor's type or shape no longer matches its bytes (a type
  //   changed from F32 to Q8_0 made the tensor a quarter of its bytes, and the model ran on, printing garbage).
  // A tensor of a type whose layout this reader does not know (IQ1_S, TQ1_0, ...) has an unknown end: the tensor
  // after it may start anywhere past it (the model's loader refuses such a type by name if it needs it).
  std::vector<const GgufTensor*> stored;
  for (const GgufTensor& tensor : table) {
    bool empty = false;
    for (std::uint64_t extent : tensor.ne) empty = empty || extent == 0;
    if (!empty) stored.push_back(&tensor);
  }
  std::sort(stored.begin(), stored.end(), [](const auto* a, const auto* b) { return a->offset < b->offset; });
  const GgufTensor* previous = nullptr;
  std::uint64_t expected = data_start;  // where the next tensor should start: previous's end, padded
  bool end_known = true;               // false after a tensor of unknown layout
  for (const GgufTensor* tensor : stored) {
    if (end_known && previous != nullptr && tensor->bytes > 0 && previous->offset + previous->bytes > tensor->offset) {
      throw FormatError(fmt::format("GGUF file '{}' is corrupt: tensors '{}' and '{}' overlap: a tensor's type or "
                                    "shape does not match its data",
                                    path, printable(previous->name), printable(tensor->name)));
    }
    if (end_known && tensor->offset != expected) {
      const std::string before =
          previous == nullptr ? fmt::format("the tensor data starts at byte {}", data_start)
                              : fmt::format("tensor '{}' ({}, {} bytes) ends at byte {} (padded to {})",
                                            printable(previous->name), gguf_type_name(previous->type), previous->bytes,
                                            expected, alignment);
      throw FormatError(fmt::format("GGUF file '{}' is corrupt: {}, but the next tensor, '{}', starts at byte {}: a "
                                    "tensor's type or shape does not match its data",
                                    path, before, printable(tensor->name), tensor->offset));
    }
    previous = tensor;
    end_known = tensor->bytes > 0;
    expected = (tensor->offset + tensor->bytes + alignment - 1) / alignment * alignment;
  }
  // And the last one ends the file (its padding may be left off): bytes after it mean the data section
  // starts later than the tensor table says, so every tensor would be read that many bytes early (32 bytes
  // put between the table and the data made a model run on, printing garbage).
  if (end_known && previous != nullptr && size_bytes_ > expected) {
    throw FormatError(fmt::format("GGUF file '{}' is corrupt: its last tensor, '{}' ({}, {} bytes), ends at byte {} "
                                  "(padded to {}) but the file has {} bytes: the tensor data does not start where "
                                  "the tensor table says, or a tensor's type or shape does not match its data",
                                  path, printable(previous->name), gguf_type_name(previous->type), previous->bytes,
                                  previous->offset + previous->bytes, expected, size_bytes_));
  }
  for (GgufTensor& tensor : table) {
    const std::string name = tensor.name;
    if (!tensors_.emplace(name, std::move(tensor)).second) {
      throw FormatError(fmt::format("GGUF file '{}' holds two tensors named '{}'", path, printable(name)));
    }
  }
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

std::optional<std::uint64_t> GgufFile::get_count(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->kind == GgufValue::Kind::kUnsigned) return v->u;
  if (v->kind == GgufValue::Kind::kSigned && v->i >= 0) return static_cast<std::uint64_t>(v->i);
  throw FormatError(fmt::format("GGUF file '{}': {} should be a non-negative integer", path_, key));
}

std::optional<double> GgufFile::get_number(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->kind == GgufValue::Kind::kUnsigned || v->kind == GgufValue::Kind::kSigned ||
      v->kind == GgufValue::Kind::kFloat) {
    return v->f;
  }
  throw FormatError(fmt::format("GGUF file '{}': {} should be a number", path_, key));
}

std::optional<std::string> GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->kind == GgufValue::Kind::kString) return v->s;
  throw FormatError(fmt::format("GGUF file '{}': {} should be a string", path_, key));
}

const GgufValue& GgufFile::array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) throw FormatError(fmt::format("GGUF file '{}' has no {}", path_, key));
  if (v->kind != GgufValue::Kind::kArray) throw FormatError(fmt::format("GGUF file '{}': {} should be an array", path_, key));
  return *v;
}

std::vector<std::string> GgufFile::strings(const std::string& key) const {
  const GgufValue& v = array(key);
  if (v.array_type != kString) throw FormatError(fmt::format("GGUF file '{}': {} should be an array of strings", path_, key));
  Cursor in(whole_.data(), size_bytes_, path_);
  in.skip(v.array_offset, "an array");  // checked when the file was read
  std::vector<std::string> out;
  out.reserve(v.array_count);
  for (std::uint64_t k = 0; k < v.array_count; ++k) out.push_back(in.string("an array's string"));
  return out;
}

std::vector<double> GgufFile::numbers(const std::string& key) const {
  const GgufValue& v = array(key);
  if (scalar_bytes(v.array_type) == 0) {
    throw FormatError(fmt::format("GGUF file '{}': {} should be an array of numbers", path_, key));
  }
  Cursor in(whole_.data(), size_bytes_, path_);
  in.skip(v.array_offset, "an array");
  std::vector<double> out;
  out.reserve(v.array_count);
  for (std::uint64_t k = 0; k < v.array_count; ++k) out.push_back(scalar_as_double(in, v.array_type));
  return out;
}

const GgufTensor* GgufFile::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace shardline::runtime
