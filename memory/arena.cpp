#include "memory/arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/error.h"
#include "common/units.h"
#include "memory/binding.h"
#include "memory/system_memory.h"

#ifndef MAP_HUGE_2MB
#define MAP_HUGE_2MB (21 << 26)
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace shardline::memory {

namespace {

// Faults every page of a fresh writable mapping in now. MADV_POPULATE_WRITE (Linux 5.14+) reports a
// shortage as an error instead of a SIGBUS on first touch; older kernels get a plain touch of each page.
bool populate(std::byte* base, std::uint64_t bytes, std::uint64_t page_bytes, std::string& why_not) {
  if (madvise(base, bytes, MADV_POPULATE_WRITE) == 0) return true;
  if (errno != EINVAL) {
    why_not = fmt::format("faulting in {} failed: {}", format_bytes(static_cast<double>(bytes)), std::strerror(errno));
    return false;
  }
  for (std::uint64_t at = 0; at < bytes; at += page_bytes) static_cast<volatile std::byte*>(base)[at] = std::byte{0};
  return true;
}

}  // namespace

const char* page_kind_name(PageKind kind) {
  switch (kind) {
    case PageKind::kHugetlb: return "hugetlb 2 MiB";
    case PageKind::kTransparentHuge: return "THP 2 MiB";
    case PageKind::kSmall: return "4 KiB";
  }
  return "?";
}

PagePolicy parse_page_policy(const std::string& text) {
  if (text == "auto") return PagePolicy::kAuto;
  if (text == "hugetlb") return PagePolicy::kHugetlb;
  if (text == "thp") return PagePolicy::kTransparentHuge;
  if (text == "4k") return PagePolicy::kSmall;
  throw ConfigError(fmt::format("--arena-pages expects auto, hugetlb, thp or 4k; got '{}'", text));
}

const char* page_policy_name(PagePolicy policy) {
  switch (policy) {
    case PagePolicy::kAuto: return "auto";
    case PagePolicy::kHugetlb: return "hugetlb";
    case PagePolicy::kTransparentHuge: return "thp";
    case PagePolicy::kSmall: return "4k";
  }
  return "?";
}

Arena::Arena(const ArenaOptions& options) : options_(options) {
  chunks_.push_back(map_chunk(std::max<std::uint64_t>(options.initial_bytes, 1), reason_));
}

Arena::~Arena() {
  for (const Chunk& c : chunks_) munmap(c.base, c.bytes);
}

// False with the reason when the range cannot be bound or faulted in: the caller unmaps it (a binding error
// thrown from here would leave the mapping behind, and in auto mode skip the tiers still to try).
bool Arena::bind_and_populate(std::byte* base, std::uint64_t bytes, std::string& why_not) {
  if (options_.numa_node >= 0) {
    try {
      std::string unbound;
      node_bound_ = bind_range_to_node(base, bytes, options_.numa_node, /*move_existing=*/false, &unbound);
    } catch (const ResourceError& e) {
      why_not = e.what();
      return false;
    }
  }
  return populate(base, bytes, kSmallPageBytes, why_not);
}

bool Arena::try_hugetlb(std::uint64_t bytes, Chunk& chunk, std::string& why_not) {
  const long needed = static_cast<long>(bytes / kHugePageBytes);
  const MemInfo info = read_meminfo();
  const long free_global = info.hugepages_free - info.hugepages_reserved;
  // Pages are taken from the rank's node (the range is bound to it), so that node's pool must hold them.
  const long on_node = options_.numa_node >= 0 ? free_hugepages_on_node(options_.numa_node) : -1;
  const long free_here = on_node >= 0 ? on_node : free_global;
  if (std::min(free_global, free_here) < needed) {
    why_not = fmt::format("{} free 2 MiB hugepage{}{} but {} needed (reserve them: echo N > /proc/sys/vm/nr_hugepages)",
                          std::min(free_global, free_here), std::min(free_global, free_here) == 1 ? "" : "s",
                          options_.numa_node >= 0 ? fmt::format(" on node {}", options_.numa_node) : "", needed);
    return false;
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_HUGE_2MB,
                    -1, 0);
  if (base == MAP_FAILED) {
    why_not = fmt::format("mmap(MAP_HUGETLB) of {} failed: {}", format_bytes(static_cast<double>(bytes)),
                          std::strerror(errno));
    return false;
  }
  if (!bind_and_populate(static_cast<std::byte*>(base), bytes, why_not)) {
    munmap(base, bytes);
    return false;
  }
  chunk = {static_cast<std::byte*>(base), bytes, 0, PageKind::kHugetlb};
  return true;
}

bool Arena::try_transparent(std::uint64_t bytes, Chunk& chunk, std::string& why_not) {
  const std::string mode = transparent_hugepage_mode();
  if (mode != "always" && mode != "madvise") {
    why_not = fmt::format("transparent hugepages are '{}' (/sys/kernel/mm/transparent_hugepage/enabled)", mode);
    return false;
  }
  if (thp_disabled_for_process()) {
    why_not = "this process refused transparent hugepages (prctl PR_SET_THP_DISABLE)";
    return false;
  }
  // Over-map by one huge page and trim, so the chunk starts on a 2 MiB boundary the kernel can back whole.
  const std::uint64_t padded = bytes + kHugePageBytes;
  void* raw = mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    why_not = fmt::format("mmap of {} failed: {}", format_bytes(static_cast<double>(padded)), std::strerror(errno));
    return false;
  }
  const auto raw_at = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = round_up(raw_at, kHugePageBytes);
  if (aligned > raw_at) munmap(raw, aligned - raw_at);
  const std::uintptr_t tail = aligned + bytes;
  if (raw_at + padded > tail) munmap(reinterpret_cast<void*>(tail), raw_at + padded - tail);
  auto* base = reinterpret_cast<std::byte*>(aligned);
  if (madvise(base, bytes, MADV_HUGEPAGE) != 0) {
    why_not = fmt::format("madvise(MADV_HUGEPAGE) failed: {}", std::strerror(errno));
    munmap(base, bytes);
    return false;
  }
  if (!bind_and_populate(base, bytes, why_not)) {
    munmap(base, bytes);
    return false;
  }
  chunk = {base, bytes, 0, PageKind::kTransparentHuge};
  return true;
}

void Arena::map_small(std::uint64_t bytes, Chunk& chunk) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    throw ResourceError(fmt::format("cannot map a {} arena: {}", format_bytes(static_cast<double>(bytes)),
                                    std::strerror(errno)));
  }
  // Keep 4 KiB pages even where THP is "always": this tier is what was asked for (or all that was left).
  madvise(base, bytes, MADV_NOHUGEPAGE);
  std::string why_not;
  if (!bind_and_populate(static_cast<std::byte*>(base), bytes, why_not)) {
    munmap(base, bytes);
    throw ResourceError(fmt::format("cannot commit a {} arena{}: {}", format_bytes(static_cast<double>(bytes)),
                                    options_.numa_node >= 0 ? fmt::format(" on NUMA node {}", options_.numa_node) : "",
                                    why_not));
  }
  chunk = {static_cast<std::byte*>(base), bytes, 0, PageKind::kSmall};
}

Arena::Chunk Arena::map_chunk(std::uint64_t bytes, std::string& reason) {
  bytes = round_up(bytes, kHugePageBytes);
  Chunk chunk;
  std::string why_not;
  switch (options_.pages) {
    case PagePolicy::kHugetlb:
      if (!try_hugetlb(bytes, chunk, why_not)) throw ResourceError("--arena-pages hugetlb: " + why_not);
      reason = "asked for";
      return chunk;
    case PagePolicy::kTransparentHuge:
      if (!try_transparent(bytes, chunk, why_not)) throw ResourceError("--arena-pages thp: " + why_not);
      reason = "asked for";
      return chunk;
    case PagePolicy::kSmall:
      map_small(bytes, chunk);
      reason = "asked for";
      return chunk;
    case PagePolicy::kAuto:
      break;
  }
  if (try_hugetlb(bytes, chunk, why_not)) {
    reason = "";
    return chunk;
  }
  reason = "no hugetlb: " + why_not;
  why_not.clear();
  if (try_transparent(bytes, chunk, why_not)) return chunk;
  reason += "; no THP: " + why_not;
  map_small(bytes, chunk);
  return chunk;
}

void* Arena::allocate_bytes(std::uint64_t bytes, std::size_t alignment) {
  SL_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0 && alignment <= kHugePageBytes);
  // The address is aligned, not the offset: a chunk of 4 KiB pages is only sure to start on a page.
  auto offset_in = [alignment](const Chunk& c) {
    return aligned_offset(reinterpret_cast<std::uintptr_t>(c.base), c.used, alignment);
  };
  Chunk* chunk = &chunks_.back();
  std::uint64_t at = offset_in(*chunk);
  if (at + bytes > chunk->bytes) {
    std::string reason;
    chunks_.push_back(map_chunk(std::max<std::uint64_t>(bytes + alignment, options_.growth_bytes), reason));
    chunk = &chunks_.back();
    at = offset_in(*chunk);
  }
  chunk->used = at + bytes;
  return chunk->base + at;
}

std::uint64_t Arena::reserved_bytes() const {
  std::uint64_t total = 0;
  for (const Chunk& c : chunks_) total += c.bytes;
  return total;
}

std::uint64_t Arena::used_bytes() const {
  std::uint64_t total = 0;
  for (const Chunk& c : chunks_) total += c.used;
  return total;
}

bool Arena::contains(const void* address) const {
  const auto* p = static_cast<const std::byte*>(address);
  return std::any_of(chunks_.begin(), chunks_.end(), [&](const Chunk& c) { return p >= c.base && p < c.base + c.bytes; });
}

std::string Arena::describe() const {
  std::string where = options_.numa_node < 0 ? "not bound to a node"
                      : node_bound_         ? fmt::format("bound to node {}", options_.numa_node)
                                            : fmt::format("node {} binding unsupported", options_.numa_node);
  std::string text = fmt::format("{} ({}, {}), {} used", format_bytes(static_cast<double>(reserved_bytes())),
                                 page_kind_name(page_kind()), where, format_bytes(static_cast<double>(used_bytes())));
  if (page_kind() == PageKind::kTransparentHuge) {
    // THP is best effort: say how much the kernel really backed with 2 MiB pages.
    std::uint64_t huge = 0, thp_bytes = 0;
    for (const Chunk& c : chunks_) {
      if (c.kind != PageKind::kTransparentHuge) continue;
      huge += backing_of(c.base, c.bytes).anon_huge_bytes;
      thp_bytes += c.bytes;
    }
    text += fmt::format(", {} of {} on huge pages", format_bytes(static_cast<double>(huge)),
                        format_bytes(static_cast<double>(thp_bytes)));
  }
  if (n_chunks() > 1) text += fmt::format(" in {} chunks", n_chunks());
  if (!reason_.empty() && reason_ != "asked for") text += fmt::format(" [{}]", reason_);
  return text;
}

}  // namespace shardline::memory
