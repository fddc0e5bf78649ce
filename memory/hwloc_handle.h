// A loaded hwloc topology, owned (internal to memory/). Every hwloc return code goes through check_hwloc,
// which turns a failure into ResourceError with the operation and errno's message.
#pragma once

#include <hwloc.h>

#include <memory>
#include <string>
#include <vector>

namespace shardline::memory::detail {

// Throws ResourceError("hwloc <what> failed: <strerror(errno)>") when code < 0.
void check_hwloc(int code, const char* what);

class HwlocHandle {
 public:
  enum class Source { kThisSystem, kSynthetic, kXml };
  // with_io: also discover PCI/OS devices (GPUs); slower: for reports and for placing GPU ranks.
  HwlocHandle(Source source, const std::string& argument = {}, bool with_io = false);
  HwlocHandle(const HwlocHandle&) = delete;
  HwlocHandle& operator=(const HwlocHandle&) = delete;
  ~HwlocHandle();

  hwloc_topology_t get() const { return topology_; }

 private:
  hwloc_topology_t topology_ = nullptr;
};

// The real host's topology without I/O devices, loaded once per process (for binding).
const HwlocHandle& this_host();

// Conversions between hwloc bitmaps and sorted OS-index lists.
std::vector<int> to_indices(hwloc_const_bitmap_t set);
// Owning bitmap from indices; free with hwloc_bitmap_free (see BitmapPtr).
struct BitmapDeleter {
  void operator()(hwloc_bitmap_s* set) const { hwloc_bitmap_free(set); }
};
using BitmapPtr = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;
BitmapPtr to_bitmap(const std::vector<int>& indices);

}  // namespace shardline::memory::detail
