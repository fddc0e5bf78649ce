// Read-only, zero-copy views of a file. A rank maps only the byte ranges it owns (its weight slices), so
// its resident memory scales with its shard, not with the whole checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace shardline::memory {

// A mapped byte range; unmapped on destruction. Move-only.
class MappedRegion {
 public:
  MappedRegion() = default;
  MappedRegion(void* base, std::size_t map_bytes, const std::byte* data, std::size_t bytes)
      : base_(base), map_bytes_(map_bytes), data_(data), bytes_(bytes) {}
  MappedRegion(MappedRegion&& other) noexcept { *this = std::move(other); }
  MappedRegion& operator=(MappedRegion&& other) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion();

  const std::byte* data() const { return data_; }
  std::size_t size_bytes() const { return bytes_; }
  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data_); }

  // Reads the region's pages in (as MAP_POPULATE would) slice_bytes at a time, calling after_each after each
  // slice: a reader can see its progress through a large mapping (runtime/load_watch.h).
  void populate_in_slices(std::size_t slice_bytes, const std::function<void()>& after_each) const;

 private:
  void* base_ = nullptr;      // page-aligned start of the mapping
  std::size_t map_bytes_ = 0;
  const std::byte* data_ = nullptr;  // the requested offset inside it
  std::size_t bytes_ = 0;
};

struct MapOptions {
  bool populate = true;  // fault the pages in now (MAP_POPULATE) rather than on the first token
  // Bind the range to this NUMA node (mbind MPOL_BIND): page-cache pages this process alone maps move there
  // (pages read for the first time land there already when the thread prefers the node: binding.h).
  // -1: no binding.
  int numa_node = -1;
};

class MappedFile {
 public:
  // Opens the file; ResourceError naming the path if it cannot be opened.
  explicit MappedFile(const std::string& path);
  MappedFile(MappedFile&&) noexcept;
  MappedFile& operator=(MappedFile&&) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::string& path() const { return path_; }
  std::uint64_t size_bytes() const { return size_bytes_; }

  // Maps [offset, offset + bytes) read-only. FormatError if the range runs past the end of the file.
  MappedRegion map(std::uint64_t offset, std::uint64_t bytes, const MapOptions& options = {}) const;

  // Reads bytes at offset into dst (for headers); FormatError if the file is too short.
  void read(std::uint64_t offset, void* dst, std::size_t bytes) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_bytes_ = 0;
};

}  // namespace shardline::memory
