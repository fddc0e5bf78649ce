// What the kernel says about memory: /proc/meminfo, hugetlb pools (global and per node), transparent
// hugepages, and how a given address range is actually backed (/proc/self/smaps). Sizes come from here and
// from what allocations actually obtain, never from hwloc's per-node figure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace shardline::memory {

inline constexpr std::uint64_t kHugePageBytes = 2ull << 20;  // the hugetlb page size the arena uses
inline constexpr std::uint64_t kSmallPageBytes = 4096;

// value rounded up to a multiple of `multiple` (a page size, an alignment).
inline constexpr std::uint64_t round_up(std::uint64_t value, std::uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// The offset from base at or after `used` whose address is a multiple of alignment: an allocator's
// alignment is of the address, and a chunk's base is only sure to be page aligned.
inline constexpr std::uint64_t aligned_offset(std::uintptr_t base, std::uint64_t used, std::uint64_t alignment) {
  return round_up(base + used, alignment) - base;
}

struct MemInfo {
  std::uint64_t total_bytes = 0;      // MemTotal
  std::uint64_t available_bytes = 0;  // MemAvailable
  long hugepages_total = 0;           // HugePages_Total (2 MiB default pool)
  long hugepages_free = 0;            // HugePages_Free (includes pages reserved by mappings not yet faulted)
  long hugepages_reserved = 0;        // HugePages_Rsvd: promised to mappings, not yet faulted
};
MemInfo read_meminfo();

// What this process's memory cgroup still allows (its limit less its usage, the least over its ancestors;
// cgroup v2's memory.max/memory.current or v1's memory.limit_in_bytes/usage_in_bytes), or nullopt when no
// ancestor is limited. A Slurm job with ConstrainRAMSpace runs in such a cgroup: MemAvailable then counts
// the whole host, and a job that trusted it was killed by the kernel rather than told. proc_self_cgroup is
// /proc/self/cgroup's text, sysfs_root the cgroup mount's root (parameters for the tests).
std::optional<std::uint64_t> cgroup_memory_left(const std::string& proc_self_cgroup,
                                                const std::string& sysfs_root = "/sys/fs/cgroup");
std::optional<std::uint64_t> cgroup_memory_left();
// Memory a new allocation may take without swapping or the cgroup's OOM killer: MemAvailable, at most what
// the cgroup still allows; nullopt when neither is known (a kernel without MemAvailable, no cgroup limit).
std::optional<std::uint64_t> usable_memory_bytes();
// A size field of /proc/self/status ("VmHWM", "VmSize": kB there) in bytes, 0 when absent.
std::uint64_t process_status_bytes(const std::string& field);
// Address space this process may still map under RLIMIT_AS (ulimit -v), or nullopt when unlimited.
std::optional<std::uint64_t> address_space_left();

// Free 2 MiB hugetlb pages on one node (sysfs), or -1 when the node has no such pool.
long free_hugepages_on_node(int node);

// "always", "madvise" or "never" (/sys/kernel/mm/transparent_hugepage/enabled); "unavailable" without THP.
std::string transparent_hugepage_mode();
// True when this process refused THP (prctl PR_SET_THP_DISABLE, inherited from the parent).
bool thp_disabled_for_process();

// How [address, address + bytes) is backed, from /proc/self/smaps.
struct Backing {
  std::uint64_t hugetlb_bytes = 0;    // in hugetlb VMAs (KernelPageSize 2048 kB)
  std::uint64_t anon_huge_bytes = 0;  // AnonHugePages (THP) of the overlapping VMAs
  std::uint64_t resident_bytes = 0;   // Rss of the overlapping VMAs
};
Backing backing_of(const void* address, std::uint64_t bytes);

}  // namespace shardline::memory
