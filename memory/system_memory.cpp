#include "memory/system_memory.h"

#include <sys/prctl.h>

#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace shardline::memory {

MemInfo read_meminfo() {
  MemInfo info;
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t value = 0;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    if (!(fields >> key >> value)) continue;
    if (key == "MemTotal:") info.total_bytes = value * 1024;
    else if (key == "MemAvailable:") info.available_bytes = value * 1024;
    else if (key == "HugePages_Total:") info.hugepages_total = static_cast<long>(value);
    else if (key == "HugePages_Free:") info.hugepages_free = static_cast<long>(value);
    else if (key == "HugePages_Rsvd:") info.hugepages_reserved = static_cast<long>(value);
  }
  return info;
}

long free_hugepages_on_node(int node) {
  std::ifstream in(fmt::format("/sys/devices/system/node/node{}/hugepages/hugepages-2048kB/free_hugepages", node));
  long value = -1;
  if (!(in >> value)) return -1;
  return value;
}

std::string transparent_hugepage_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return "unavailable";
  // "always [madvise] never": the bracketed word is the mode.
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "unavailable";
  return line.substr(open + 1, close - open - 1);
}

bool thp_disabled_for_process() { return prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1; }

Backing backing_of(const void* address, std::uint64_t bytes) {
  Backing b;
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  const auto end = begin + bytes;
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool overlapping = false;
  std::uint64_t vma_bytes = 0;
  while (std::getline(in, line)) {
    // A VMA header: "7f12a0000000-7f12a0400000 rw-p 00000000 00:00 0 ..."; fields follow as "Key: N kB".
    const auto dash = line.find('-');
    const auto space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space &&
        line.find_first_not_of("0123456789abcdef") == dash) {
      const std::uintptr_t lo = std::stoull(line.substr(0, dash), nullptr, 16);
      const std::uintptr_t hi = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      overlapping = lo < end && hi > begin;
      vma_bytes = hi - lo;
      continue;
    }
    if (!overlapping) continue;
    std::istringstream fields(line);
    std::string key;
    std::uint64_t kib = 0;
    if (!(fields >> key >> kib)) continue;
    if (key == "Rss:") b.resident_bytes += kib * 1024;
    else if (key == "AnonHugePages:") b.anon_huge_bytes += kib * 1024;
    else if (key == "KernelPageSize:" && kib == 2048) b.hugetlb_bytes += vma_bytes;
  }
  return b;
}

}  // namespace shardline::memory
