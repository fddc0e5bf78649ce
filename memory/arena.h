// One rank's arena: the memory its repacked weight slices, activations and scratch live in, allocated once
// at start-up (no malloc in the decode loop) and bound to the rank's NUMA node.
//
// Page tiers, best first (PagePolicy::kAuto tries them in order and records why it settled where it did):
//   hugetlb 2 MiB  MAP_HUGETLB from the kernel's reserved pool (/proc/sys/vm/nr_hugepages). Needs enough
//                  free pages on the node; the pages are faulted in at once (MADV_POPULATE_WRITE), so a
//                  short pool is an error here, never a SIGBUS later.
//   THP 2 MiB      anonymous memory, 2 MiB aligned, madvise(MADV_HUGEPAGE). Needs THP "always" or "madvise"
//                  and a process that did not refuse it (prctl PR_SET_THP_DISABLE).
//   4 KiB          anonymous memory with MADV_NOHUGEPAGE: always available.
// Allocation is a bump pointer; nothing is freed before the arena goes. When a chunk is full the arena maps
// another (same tier order), so a wrong size estimate costs a second mapping, not a failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace shardline::memory {

// A typed view of arena memory with the parts of std::vector's interface that read it (data, size, []),
// so buffers move into the arena without touching the code that uses them. Does not own the memory.
template <typename T>
class ArenaArray {
 public:
  ArenaArray() = default;
  ArenaArray(T* data, std::size_t size) : data_(data), size_(size) {}
  T* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](std::size_t i) const { return data_[i]; }
  T* begin() const { return data_; }
  T* end() const { return data_ + size_; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

enum class PageKind { kHugetlb, kTransparentHuge, kSmall };
enum class PagePolicy { kAuto, kHugetlb, kTransparentHuge, kSmall };

// "hugetlb 2 MiB", "THP 2 MiB", "4 KiB".
const char* page_kind_name(PageKind kind);
// --arena-pages: "auto" | "hugetlb" | "thp" | "4k"; ConfigError otherwise.
PagePolicy parse_page_policy(const std::string& text);
const char* page_policy_name(PagePolicy policy);

struct ArenaOptions {
  std::uint64_t initial_bytes = 2ull << 20;  // first chunk (rounded up to 2 MiB)
  std::uint64_t growth_bytes = 16ull << 20;  // smallest later chunk
  int numa_node = -1;                        // bind to this node (OS index); -1: no binding
  PagePolicy pages = PagePolicy::kAuto;      // a forced tier that cannot be had is a ResourceError
};

class Arena {
 public:
  explicit Arena(const ArenaOptions& options = {});
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena();

  // bytes of memory aligned to alignment (a power of two, at most 2 MiB). Never null; ResourceError when
  // no chunk can be mapped.
  void* allocate_bytes(std::uint64_t bytes, std::size_t alignment = 64);
  template <typename T>
  T* allocate(std::size_t count) {
    return static_cast<T*>(allocate_bytes(count * sizeof(T), alignof(T) > 64 ? alignof(T) : 64));
  }
  // count values of a trivially copyable T, zero bytes (arena memory is fresh pages, never reused).
  template <typename T>
  ArenaArray<T> allocate_array(std::size_t count) {
    static_assert(std::is_trivially_copyable_v<T>, "arena memory is raw bytes");
    return ArenaArray<T>(allocate<T>(count), count);
  }

  PageKind page_kind() const { return chunks_.front().kind; }  // of the first chunk
  const std::string& page_reason() const { return reason_; }   // why that tier ("" when the first choice worked)
  int numa_node() const { return options_.numa_node; }
  bool node_bound() const { return node_bound_; }
  std::uint64_t reserved_bytes() const;  // mapped, over all chunks
  std::uint64_t used_bytes() const;      // handed out
  int n_chunks() const { return static_cast<int>(chunks_.size()); }
  bool contains(const void* address) const;

  // "64.0 MiB (hugetlb 2 MiB, bound to node 0), 12.3 MiB used".
  std::string describe() const;

 private:
  struct Chunk {
    std::byte* base = nullptr;
    std::uint64_t bytes = 0;
    std::uint64_t used = 0;
    PageKind kind = PageKind::kSmall;
  };
  Chunk map_chunk(std::uint64_t bytes, std::string& reason);
  bool try_hugetlb(std::uint64_t bytes, Chunk& chunk, std::string& why_not);
  bool try_transparent(std::uint64_t bytes, Chunk& chunk, std::string& why_not);
  void map_small(std::uint64_t bytes, Chunk& chunk);
  // Binds a fresh mapping to the node and faults it in; false (with why_not) if faulting failed.
  bool bind_and_populate(std::byte* base, std::uint64_t bytes, std::string& why_not);

  ArenaOptions options_;
  std::vector<Chunk> chunks_;
  std::string reason_;
  bool node_bound_ = false;
};

}  // namespace shardline::memory
